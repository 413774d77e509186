"""praxis.layers.grok: Grok-1's decoder-only LM as praxis's config tree over paxlike's LM.

GrokUniTransformerLmHParams returns the TransformerLm config praxis's builder
returns (paxlike.pax.config_tree reads it onto paxlike's LM):

- a repeated stack of one-layer blocks; with moe=True every layer's
  feed-forward is a mixture of experts (paxlike.layers.moe): gated, with
  ffn_activation_cls (GELU) and moe_hidden_dim;
- RMS norms (direct scale) everywhere; no position embedding;
- praxis's MultiQueryDotProductAttention with attention_num_groups key/value
  heads and biases on its projections. The builder configures a
  DotProductAttention first (logit cap, extra logit, no query scale) and then
  replaces it with a fresh multi-query one, as praxis's does, so those settings
  do not reach the model; a task() turns on rotary positions
  (`tr_atten_tpl.use_rotary_position_emb = True`, as nvidia.py's Grok classes do);
- GShard's tied softmax with a z-loss and the labels' count as the loss's
  denominator.

num_pipeline_stages > 1 builds praxis's pipelined Grok (nvidia.py's Grok_PP and
Grok_Proxy_PP), every layer of every stage with experts. use_fp8 sets praxis's FP8 einsums
on the attention's projections and the experts' einsums (USE_FP8 on nvidia.py's Grok
classes): paxlike's LM reads them as use_fp8 and moe_fp8 (a pipelined one refuses them).
"""

from __future__ import annotations

from typing import Any

from paxlike.layers import activations
from paxlike.layers.transformer import AutodiffCheckpointType
from paxlike.pax import praxis_layers as pl
from paxlike.pax.layers import glam
from paxlike.pax.pax_fiddle import Config


def GrokStackedTransformerHParams(  # noqa: N802  (praxis's name)
    model_dim: int, ff_dim: int, attention_num_heads: int, attention_num_groups: int,
    attention_key_value_dim: int, name: str = "transformer", moe: bool = False,
    moe_hidden_dim: int | None = None, moe_gating_embedding_level: str = "token",
    ffn_activation_cls: Any = activations.GELU, use_gated_activation: bool = True,
    mask_self_attention: bool = True, cross_attention: bool = False,
    atten_logit_cap: float = 0.0, attention_extra_logit: float = 0.0,
    relative_attention_num_buckets: int = 32, relative_attention_max_distance: int = 128,
    moe_load_balance_loss_weight: float = 0.01, moe_gating_func: str = "top2",
    moe_gating_logit_cap: float = 0.0, num_groups: int = 1, c_dim: int | None = None,
    capacity_factor: float = 0.0, e_dim: int | None = None, combine_qkv: bool = False,
    bidirectional: bool = False, use_fp8: bool = False) -> Config:
  """One Grok block: a layer whose feed-forward is a mixture of experts (moe), or dense."""
  # praxis's builder sets these on a DotProductAttention it then replaces (see above).
  del atten_logit_cap, attention_extra_logit, relative_attention_num_buckets
  del relative_attention_max_distance, combine_qkv, bidirectional
  attention = Config(pl.MultiQueryDotProductAttention, num_kv_heads=attention_num_groups,
                     combine_qkv=False)
  attention.proj_tpl.use_bias = True
  layer = Config(pl.Transformer, ln_tpl=Config(pl.RmsNorm, direct_scale=True),
                 tr_atten_tpl=attention)
  experts = glam.experts_tpl(
      model_dim, moe_hidden_dim or ff_dim, e_dim, num_groups, moe_gating_logit_cap, c_dim,
      capacity_factor, moe_load_balance_loss_weight, moe_gating_func,
      moe_gating_embedding_level)
  experts.add_skip_connection = True
  experts.activation_tpl = Config(ffn_activation_cls)
  experts.use_gated_activation = use_gated_activation
  if use_fp8:  # as praxis's builder: the projections' and the experts' einsums in FP8
    attention.proj_tpl.einsum_tpl = Config(pl.Fp8EinsumOp)
    experts.einsum_tpl = Config(pl.Fp8EinsumOp)
    experts.einsum_gated_tpl = Config(pl.Fp8EinsumGatedOp)
  return Config(pl.StackedTransformer, name=name, packed_input=True,
                moe_layers=[0] if moe else None, num_layers=1, model_dims=model_dim,
                hidden_dims=ff_dim, num_heads=attention_num_heads,
                dim_per_head=attention_key_value_dim, num_experts=e_dim or 0,
                num_groups=num_groups, mask_self_attention=mask_self_attention,
                use_cross_attention=cross_attention, transformer_layer_params_tpl=layer,
                moe_layer_tpl=experts)


def GrokUniTransformerLmHParams(  # noqa: N802  (praxis's name)
    vocab_size: int, model_dim: int, ff_dim: int, attention_num_heads: int,
    attention_num_groups: int, attention_key_value_dim: int, num_transformer_layers: int,
    name: str = "transformer", moe: bool = False, moe_hidden_dim: int | None = None,
    moe_gating_embedding_level: str = "token", ffn_activation_cls: Any = activations.GELU,
    use_gated_activation: bool = True, atten_logit_cap: float = 0.0,
    attention_extra_logit: float = 0.0, relative_attention_num_buckets: int = 32,
    relative_attention_max_distance: int = 128, moe_gating_func: str = "top2",
    moe_gating_logit_cap: float = 0.0, num_groups: int = 1, c_dim: int | None = None,
    capacity_factor: float = 0.0, e_dim: int | None = None,
    use_tgt_labels_size_as_loss_denominator: bool = True,
    moe_load_balance_loss_weight: float = 0.01, z_loss_weight: float = 1e-4,
    combine_qkv: bool = False, bidirectional: bool = False, num_pipeline_stages: int = 1,
    num_pipeline_microbatches: int = 1,
    model_type: pl.LanguageModelType = pl.LanguageModelType.CAUSAL,
    checkpoint_policy: Any = AutodiffCheckpointType.SAVE_NOTHING,
    use_fp8: bool = False) -> Config:
  """praxis's Grok decoder-only LM config (see the module docstring)."""
  block = GrokStackedTransformerHParams(
      model_dim=model_dim, ff_dim=ff_dim, attention_num_heads=attention_num_heads,
      attention_num_groups=attention_num_groups,
      attention_key_value_dim=attention_key_value_dim, name="decoder_block", moe=moe,
      moe_hidden_dim=moe_hidden_dim, moe_gating_embedding_level=moe_gating_embedding_level,
      ffn_activation_cls=ffn_activation_cls, use_gated_activation=use_gated_activation,
      atten_logit_cap=atten_logit_cap, attention_extra_logit=attention_extra_logit,
      relative_attention_num_buckets=relative_attention_num_buckets,
      relative_attention_max_distance=relative_attention_max_distance,
      moe_load_balance_loss_weight=moe_load_balance_loss_weight,
      moe_gating_func=moe_gating_func, moe_gating_logit_cap=moe_gating_logit_cap,
      num_groups=num_groups, c_dim=c_dim, capacity_factor=capacity_factor, e_dim=e_dim,
      combine_qkv=combine_qkv, bidirectional=bidirectional, use_fp8=use_fp8)
  if num_pipeline_stages != 1:  # as praxis's: every layer of a stage has experts
    stacked = glam.pipelined_tpl(block, num_transformer_layers, num_pipeline_stages,
                                 num_pipeline_microbatches, list(range(num_transformer_layers)),
                                 "grok.GrokUniTransformerLmHParams", checkpoint_policy)
  else:
    stacked = Config(pl.StackedTransformerRepeated, name="decoder", unroll_in_decode=True,
                     block=block, x_times=num_transformer_layers,
                     checkpoint_policy=checkpoint_policy)
  return glam.gshard_lm_tpl(name, model_dim, vocab_size, model_type, z_loss_weight,
                            use_tgt_labels_size_as_loss_denominator, stacked)


__all__ = ["GrokStackedTransformerHParams", "GrokUniTransformerLmHParams"]
