"""praxis.layers.glam: GLaM's decoder-only LM as praxis's config tree over paxlike's LM.

GlamUniTransformerLmHParams returns the TransformerLm config praxis's
builder returns (paxlike.pax.config_tree reads it onto paxlike's LM):

- blocks of two layers, the first with a mixture-of-experts feed-forward
  (moe=True; paxlike.layers.moe), or one dense layer per block;
- RMS norms (direct scale) everywhere, no biases;
- attention without a query scale, with a causal T5-style relative position
  bias per layer and an optional extra softmax logit; no position embedding;
- a gated GELU dense feed-forward; the experts keep praxis's default
  activation (ReLU, not gated), which GLaM's builder leaves as it is;
- GShard's tied softmax with a z-loss.

num_pipeline_stages > 1 builds praxis's pipelined GLaM: each stage's template
holds its share of the layers, every other one with experts.
"""

from __future__ import annotations

from typing import Any

from paxlike.errors import UserError
from paxlike.layers import activations
from paxlike.layers.transformer import AutodiffCheckpointType
from paxlike.pax import praxis_layers as pl
from paxlike.pax.pax_fiddle import Config


def _rms() -> Config:
  return Config(pl.RmsNorm, direct_scale=True)


def experts_tpl(model_dim: int, hidden_dim: int, e_dim: int | None, num_groups: int,
                gating_logit_cap: float, c_dim: int | None, capacity_factor: float,
                load_balance_loss_weight: float, gating_func: str,
                gating_embedding_level: str) -> Config:
  """The mixture-of-experts template GLaM's and Grok's builders set (RMS norm, praxis's
  fan-in init); Grok's also sets the experts' activation and gate."""
  return Config(
      pl.TransformerFeedForwardMoe, input_dims=model_dim, hidden_dims=hidden_dim,
      ln_tpl=_rms(), num_experts=e_dim, num_groups=num_groups,
      gating_logit_cap=gating_logit_cap, expert_capacity_dim=c_dim,
      unadjusted_expert_capacity_factor=capacity_factor,
      internal_gshard_variance_scaling_fan_in_init=True,
      moe_load_balance_loss_weight=load_balance_loss_weight, gating_func=gating_func,
      moe_gating_embedding_level=gating_embedding_level)


def pipelined_tpl(stage: Config, num_layers: int, num_stages: int, num_microbatches: int,
                  moe_layers: list[int], builder: str,
                  checkpoint_policy: Any = None) -> Config:
  """praxis's pipelined stack of GLaM's and Grok's builders: the stage template holds
  num_layers / num_stages layers, moe_layers of them (indices past the stage's layers name
  none), streamed over the stages."""
  if num_stages < 1 or num_layers % num_stages:
    raise UserError(f"{builder}(num_transformer_layers={num_layers}, num_pipeline_stages="
                    f"{num_stages}): the stages must split the layers evenly.")
  stage.num_layers = num_layers // num_stages
  stage.moe_layers = [i for i in moe_layers if i < stage.num_layers]
  return Config(pl.PipelinedTransformer, pipeline_stage=stage, num_pipeline_stages=num_stages,
                num_pipeline_microbatches=num_microbatches, stream_io=True,
                checkpoint_policy=checkpoint_policy)


def gshard_lm_tpl(name: str, model_dim: int, vocab_size: int,
                  model_type: pl.LanguageModelType, z_loss_weight: float,
                  labels_size_denominator: bool, stacked: Config) -> Config:
  """The LM around GLaM's and Grok's stacks: no position embedding, a final RMS norm,
  GShard's tied softmax with a z-loss."""
  softmax = Config(pl.GShardSharedEmbeddingSoftmax, name="emb", input_dims=model_dim,
                   num_classes=vocab_size, z_loss_weight=z_loss_weight,
                   use_tgt_labels_size_as_loss_denominator=labels_size_denominator)
  return Config(pl.TransformerLm, name=name, packed_input=True, model_dims=model_dim,
                vocab_size=vocab_size, position_emb_tpl=None, model_type=model_type,
                final_ln_tpl=Config(pl.RmsNorm, name="rms_norm", dim=model_dim),
                softmax_tpl=softmax, stacked_transformer_tpl=stacked)


def GlamStackedTransformerHParams(  # noqa: N802  (praxis's name)
    model_dim: int, ff_dim: int, attention_num_heads: int, attention_key_value_dim: int,
    name: str = "transformer", moe: bool = False, moe_hidden_dim: int | None = None,
    moe_gating_embedding_level: str = "token", ffn_activation_cls: Any = activations.GELU,
    use_gated_activation: bool = True, mask_self_attention: bool = True,
    cross_attention: bool = False, atten_logit_cap: float = 0.0,
    attention_extra_logit: float = 0.0, relative_attention_num_buckets: int = 32,
    relative_attention_max_distance: int = 128, moe_load_balance_loss_weight: float = 0.01,
    moe_gating_func: str = "top2", moe_gating_logit_cap: float = 0.0, num_groups: int = 1,
    c_dim: int | None = None, capacity_factor: float = 0.0, e_dim: int | None = None,
    combine_qkv: bool = False, bidirectional: bool = False) -> Config:
  """One GLaM block: two layers, the first's feed-forward a mixture of experts (moe), or one
  dense layer."""
  attention = Config(
      pl.DotProductAttention, attention_extra_logit=attention_extra_logit, use_bias=False,
      atten_logit_cap=atten_logit_cap, internal_gshard_gaussian_init=True,
      internal_enable_query_scale=False, internal_enable_per_dim_scale=False,
      proj_tpl=Config(pl.AttentionProjection, attention_combine_dims=True),
      relative_bias_tpl=Config(pl.RelativeBias,
                               relative_attention_num_buckets=relative_attention_num_buckets,
                               relative_attention_max_distance=relative_attention_max_distance,
                               bidirectional=bidirectional),
      output_proj_use_nhd_shape=True, combine_qkv=combine_qkv)
  if combine_qkv:
    attention.combined_qkv_proj_tpl = Config(pl.CombinedQKVProjectionLayer, use_bias=False,
                                             attention_combine_dims=True)
  ffn = Config(pl.TransformerFeedForward, input_dims=model_dim, hidden_dims=ff_dim,
               has_bias=False, apply_padding_first=True, ln_tpl=_rms(),
               add_skip_connection=True, activation_tpl=Config(ffn_activation_cls),
               use_gated_activation=use_gated_activation,
               internal_gshard_variance_scaling_fan_in_init=True)
  layer = Config(pl.Transformer, ln_tpl=_rms(), tr_atten_tpl=attention, tr_fflayer_tpl=ffn)
  experts = experts_tpl(
      model_dim, moe_hidden_dim or ff_dim, e_dim, num_groups, moe_gating_logit_cap, c_dim,
      capacity_factor, moe_load_balance_loss_weight, moe_gating_func,
      moe_gating_embedding_level)
  return Config(pl.StackedTransformer, name=name, packed_input=True,
                moe_layers=[0] if moe else None, num_layers=2 if moe else 1,
                model_dims=model_dim, hidden_dims=ff_dim, num_heads=attention_num_heads,
                dim_per_head=attention_key_value_dim, num_experts=e_dim or 0,
                num_groups=num_groups, mask_self_attention=mask_self_attention,
                use_cross_attention=cross_attention, transformer_layer_params_tpl=layer,
                moe_layer_tpl=experts)


def GlamUniTransformerLmHParams(  # noqa: N802  (praxis's name)
    vocab_size: int, model_dim: int, ff_dim: int, attention_num_heads: int,
    attention_key_value_dim: int, num_transformer_layers: int, name: str = "transformer",
    moe: bool = False, moe_hidden_dim: int | None = None,
    moe_gating_embedding_level: str = "token", ffn_activation_cls: Any = activations.GELU,
    use_gated_activation: bool = True, atten_logit_cap: float = 0.0,
    attention_extra_logit: float = 0.0, relative_attention_num_buckets: int = 32,
    relative_attention_max_distance: int = 128, moe_gating_func: str = "top2",
    moe_gating_logit_cap: float = 0.0, num_groups: int = 1, c_dim: int | None = None,
    capacity_factor: float = 0.0, e_dim: int | None = None,
    use_tgt_labels_size_as_loss_denominator: bool = True,
    moe_load_balance_loss_weight: float = 0.01, z_loss_weight: float = 1e-4,
    combine_qkv: bool = False, bidirectional: bool = False, repeat: bool = True,
    num_pipeline_stages: int = 1, num_pipeline_microbatches: int = 1,
    model_type: pl.LanguageModelType = pl.LanguageModelType.CAUSAL,
    checkpoint_policy: Any = AutodiffCheckpointType.SAVE_NOTHING) -> Config:
  """praxis's GLaM decoder-only LM config (see the module docstring)."""
  if moe and num_transformer_layers % 2:
    raise UserError(f"glam.GlamUniTransformerLmHParams(num_transformer_layers="
                    f"{num_transformer_layers}, moe=True): GLaM's blocks are two layers each; "
                    "set an even number.")
  block = GlamStackedTransformerHParams(
      model_dim=model_dim, ff_dim=ff_dim, attention_num_heads=attention_num_heads,
      attention_key_value_dim=attention_key_value_dim, name="decoder_block", moe=moe,
      moe_hidden_dim=moe_hidden_dim, moe_gating_embedding_level=moe_gating_embedding_level,
      ffn_activation_cls=ffn_activation_cls, use_gated_activation=use_gated_activation,
      atten_logit_cap=atten_logit_cap, attention_extra_logit=attention_extra_logit,
      relative_attention_num_buckets=relative_attention_num_buckets,
      relative_attention_max_distance=relative_attention_max_distance,
      moe_load_balance_loss_weight=moe_load_balance_loss_weight,
      moe_gating_func=moe_gating_func, moe_gating_logit_cap=moe_gating_logit_cap,
      num_groups=num_groups, c_dim=c_dim, capacity_factor=capacity_factor, e_dim=e_dim,
      combine_qkv=combine_qkv, bidirectional=bidirectional)
  if num_pipeline_stages != 1:
    stacked = pipelined_tpl(block, num_transformer_layers, num_pipeline_stages,
                            num_pipeline_microbatches, list(range(0, num_transformer_layers, 2)),
                            "glam.GlamUniTransformerLmHParams")
  elif repeat:
    blocks = num_transformer_layers // 2 if moe else num_transformer_layers
    stacked = Config(pl.StackedTransformerRepeated, name="decoder", unroll_in_decode=True,
                     block=block, x_times=blocks, checkpoint_policy=checkpoint_policy)
  else:
    block.num_layers = num_transformer_layers
    block.moe_layers = list(range(0, num_transformer_layers, 2)) if moe else None
    stacked = block
  return gshard_lm_tpl(name, model_dim, vocab_size, model_type, z_loss_weight,
                       use_tgt_labels_size_as_loss_denominator, stacked)


__all__ = ["GlamStackedTransformerHParams", "GlamUniTransformerLmHParams"]
