"""praxis's config tree over paxlike's LM: `task_p.model.lm_tpl...` edits, written back.

A Pax experiment's task() edits the model through praxis's tree:

    stacked_p = task_p.model.lm_tpl.stacked_transformer_tpl
    if issubclass(fdl.get_callable(stacked_p), transformers.StackedTransformerRepeated):
      stacked_p = stacked_p.block
    layer_p = stacked_p.transformer_layer_params_tpl
    layer_p.tr_atten_tpl = pax_fiddle.Config(layers.grouped_query_attention.GroupedQueryAttention)
    layer_p.tr_atten_tpl.num_kv_heads = 8

paxlike's LM templates give `task_p.model` as an LmConfig: the fiddle config
of paxlike.models.language_model.LanguageModel that also answers `lm_tpl` and
`params_init`. The first read of either makes the tree from the model's
fields (nodes are paxlike.pax.praxis_layers classes with praxis's names);
the user edits it as in Pax; `resolve(task_cfg)` (called once task()
returns) reads the whole tree back onto LanguageModel's fields. An edit
paxlike does not model (a field it cannot honour, a class it has no layer
for, two norms that differ where paxlike has one) is refused in one line
naming the path. Sharding hints (weight/activation split dims mappings) are
reported as not applied: paxlike shards by its mesh rules.

A pipelined LM (NUM_STAGES, the TransformerLmSpmdPipeline* templates) has
Pax's pipelined tree: `stacked_transformer_tpl` is a PipelinedTransformer
(num_pipeline_stages, circular_repeat, num_pipeline_microbatches or
pipeline_microbatch_size, stream_io, checkpoint_policy) whose pipeline_stage
is one stage's StackedTransformer (or StackedTransformerRepeated); the model
has stage layers x stages x circular_repeat layers. The stage count must stay
the experiment's NUM_STAGES (the mesh's stage axis), and a pipeline needs a
pipelined experiment (and the other way round).
"""

from __future__ import annotations

import copy
from typing import Any

import fiddle as fdl
import numpy as np

from paxlike.errors import UserError
from paxlike.layers import activations
from paxlike.layers.linear import AMAX_HISTORY
from paxlike.layers.transformer import AutodiffCheckpointType, moe_period, policy_name
from paxlike.pax import praxis_layers as pl
from paxlike.pax.base_layer import WeightInitSpec
from paxlike.pax.pax_fiddle import Config
from paxlike.pax.tree_reader import Reader, count, name_of, same, weight_init

PRAXIS_MODEL_FIELDS = ("lm_tpl", "params_init", "decoder_tpl", "report_strict_acc")
_TREE = "_pax_tree"
_STAGES = "num_stages"  # the tree's record of the experiment's NUM_STAGES (None: no pipeline)
ACTIVATION_CLASSES = {"relu": activations.ReLU, "gelu": activations.GELU,
                      "silu": activations.SiLU, "tanh": activations.Tanh,
                      "sigmoid": activations.Sigmoid, "none": activations.Identity}


PRAXIS_MESH_FIELDS = ("ici_mesh_shape", "dcn_mesh_shape", "mesh_axis_names")
_MESH = "_pax_mesh"


class LmConfig(Config):
  """The LM's fiddle config, with praxis's `lm_tpl` and `params_init` on it, and the
  experiment's mesh (`ici_mesh_shape`, `dcn_mesh_shape`, `mesh_axis_names`) to read."""

  def __getattr__(self, name: str) -> Any:
    if name in PRAXIS_MODEL_FIELDS:
      return _tree(self)[name]
    if name in PRAXIS_MESH_FIELDS and _MESH in self.__dict__:
      return copy.deepcopy(self.__dict__[_MESH][name])
    return super().__getattr__(name)

  def __setattr__(self, name: str, value: Any) -> None:
    if name in PRAXIS_MODEL_FIELDS:
      _tree(self)[name] = value
      return
    if name in PRAXIS_MESH_FIELDS:
      raise UserError(f"task_p.model.{name} = {value!r}: paxlike builds the mesh from the "
                      "experiment's ICI_MESH_SHAPE / DCN_MESH_SHAPE; set those instead.")
    super().__setattr__(name, value)

  def set_mesh(self, ici: Any, dcn: Any, axis_names: Any) -> LmConfig:
    """Records the experiment's mesh, which task() reads as praxis's model fields."""
    object.__setattr__(self, _MESH, {"ici_mesh_shape": ici, "dcn_mesh_shape": dcn,
                                     "mesh_axis_names": axis_names})
    return self

  def __build__(self, /, *args: Any, **kwargs: Any) -> Any:
    # A caller that builds without resolve() first still gets the tree's edits.
    tree = self.__dict__.get(_TREE)
    if tree is not None:
      kwargs.update(read_tree(tree)[0])
    return super().__build__(*args, **kwargs)


def _tree(cfg: LmConfig) -> dict[str, Any]:
  tree = cfg.__dict__.get(_TREE)
  if tree is None:
    tree = {"lm_tpl": tree_of(cfg), "params_init": _spec(cfg.weight_init),
            "decoder_tpl": Config(pl.DecoderHParams, eos_id=cfg.eos_id),
            "report_strict_acc": False, _STAGES: cfg.num_stages}
    object.__setattr__(cfg, _TREE, tree)
  return tree


def _spec(value: tuple[str, float] | None) -> WeightInitSpec | None:
  return None if value is None else WeightInitSpec(value[0], value[1])


def _norm(m: fdl.Config) -> Config:
  cls = pl.RmsNorm if m.norm_type == "rmsnorm" else pl.LayerNorm
  return Config(cls, epsilon=m.layernorm_epsilon)


def _hints() -> dict[str, Config]:
  return {"weight_split_dims_mapping": Config(pl.SplitDimsMapping),
          "activation_split_dims_mapping": Config(pl.SplitDimsMapping)}


def tree_of(m: fdl.Config) -> Config:
  """praxis's TransformerLm config equal to the LanguageModel config `m`."""
  rope = m.rope_timescales
  if m.num_kv_heads and m.use_bias:  # grouped-query attention with biases: Grok's
    atten = Config(pl.MultiQueryDotProductAttention, num_kv_heads=m.num_kv_heads,
                   use_bias=True, atten_logit_cap=m.atten_logit_cap,
                   use_rotary_position_emb=rope is not None,
                   attention_extra_logit=m.attention_extra_logit, **_hints())
  elif m.num_kv_heads:
    atten = Config(pl.GroupedQueryAttention, num_kv_heads=m.num_kv_heads,
                   rope_min_max_timescales=list(rope) if rope else None,
                   atten_logit_cap=m.atten_logit_cap, **_hints())
  else:
    atten = Config(pl.DotProductAttention, use_bias=m.use_bias,
                   atten_logit_cap=m.atten_logit_cap,
                   internal_enable_per_dim_scale=m.per_dim_scale, combine_qkv=m.combine_qkv,
                   use_rotary_position_emb=rope is not None,
                   internal_enable_query_scale=m.query_scale,
                   attention_extra_logit=m.attention_extra_logit, **_hints())
  if not issubclass(fdl.get_callable(atten), pl.GroupedQueryAttention):
    if rope is not None:
      atten.rotary_position_emb_tpl = Config(pl.RotaryPositionalEmbedding,
                                             min_timescale=rope[0], max_timescale=rope[1])
    if m.relative_bias is not None:
      atten.relative_bias_tpl = Config(pl.RelativeBias,
                                       relative_attention_num_buckets=m.relative_bias[0],
                                       relative_attention_max_distance=m.relative_bias[1])
  if m.use_fp8 and not issubclass(fdl.get_callable(atten), pl.GroupedQueryAttention):
    atten.proj_tpl.einsum_tpl = Config(pl.Fp8EinsumOp)  # as Pax's USE_FP8 sets it
    if m.combine_qkv:
      atten.combined_qkv_proj_tpl.einsum_tpl = Config(pl.Fp8EinsumOp)
  if (fdl.get_callable(atten) is pl.MultiQueryDotProductAttention and m.num_kv_heads == 1
      and (m.use_fp8 if m.kv_fp8 is None else m.kv_fp8)):
    atten.headless_proj_tpl.einsum_tpl = Config(pl.Fp8EinsumOp)
  ffn = Config(pl.TransformerFeedForward, hidden_dims=m.hidden_dims,
               activation_tpl=Config(ACTIVATION_CLASSES[m.activation]),
               use_gated_activation=m.use_gated_activation, has_bias=m.ffn_has_bias,
               ln_tpl=_norm(m), **_hints())
  layer = Config(pl.Transformer, norm_policy=m.norm_policy, ln_tpl=_norm(m), tr_atten_tpl=atten,
                 tr_fflayer_tpl=ffn)
  # A pipeline's stage template holds one stage's layers (Pax's task() builds it so).
  pipelined = m.num_stages is not None
  layers = m.num_layers // (m.num_stages * m.circular_repeat) if pipelined else m.num_layers
  stack = Config(pl.StackedTransformer, num_layers=layers, model_dims=m.model_dims,
                 hidden_dims=m.hidden_dims, num_heads=m.num_heads, dim_per_head=m.dim_per_head,
                 dropout_prob=m.dropout_prob, packed_input=m.packed_input,
                 input_dropout_prob=(m.layer_input_dropout_prob if m.use_repeated_layer
                                     else m.input_dropout_prob),
                 transformer_layer_params_tpl=layer, **_moe_fields(m))
  policy = AutodiffCheckpointType(policy_name(m.checkpoint_policy))
  if m.use_repeated_layer:
    block = _moe_period(m)
    stack.num_layers = block
    stack.moe_layers = [j for j in stack.moe_layers if j < block]
    stacked = Config(pl.StackedTransformerRepeated, block=stack, x_times=layers // block,
                     checkpoint_policy=policy)
  else:
    if not pipelined:  # Pax's pipelined template leaves the stage's policy to the pipeline
      stack.checkpoint_policy = policy
    stacked = stack
  if pipelined:
    stacked = Config(pl.PipelinedTransformer, pipeline_stage=stacked,
                     num_pipeline_stages=m.num_stages, circular_repeat=m.circular_repeat,
                     num_pipeline_microbatches=m.num_microbatches,
                     pipeline_microbatch_size=m.microbatch_size, stream_io=m.stream_io,
                     checkpoint_policy=policy, pipeline_broadcast_inputs=False)
  position = None
  if m.trainable_position_emb:
    position = Config(pl.TrainablePositionalEmbedding, embedding_dims=m.model_dims,
                      max_seq_length=m.trainable_pe_max_seq_len,
                      lookup_style=m.embedding_lookup_style)
  elif m.use_position_emb:
    position = Config(pl.PositionalEmbedding, embedding_dims=m.model_dims)
  table = dict(num_classes=m.vocab_size, input_dims=m.model_dims,
               lookup_style=m.embedding_lookup_style, **_hints())
  softmax_fields = dict(table, feed_forward_tpl=Config(pl.FeedForward, has_bias=m.softmax_has_bias),
                        soft_cap_logits=m.softmax_cap_logits,
                        params_init=_spec(m.softmax_weight_init))
  embedding = None
  if m.gshard_softmax:
    softmax = Config(pl.GShardSharedEmbeddingSoftmax, num_classes=m.vocab_size,
                     input_dims=m.model_dims, soft_cap_logits=m.softmax_cap_logits,
                     z_loss_weight=m.z_loss_weight,
                     use_tgt_labels_size_as_loss_denominator=m.loss_over_labels_size,
                     params_init=_spec(m.softmax_weight_init), **_hints())
  elif m.separate_embedding:
    embedding = Config(pl.Embedding, scale_sqrt_depth=m.scale_sqrt_depth, **table)
    softmax = Config(pl.FullSoftmax, **softmax_fields)
  else:
    softmax = Config(pl.SharedEmbeddingSoftmax, scale_sqrt_depth=m.scale_sqrt_depth,
                     **softmax_fields)
  return Config(pl.TransformerLm, model_dims=m.model_dims, vocab_size=m.vocab_size,
                packed_input=m.packed_input, model_type=pl.LanguageModelType.CAUSAL,
                position_emb_tpl=position, separate_embedding_tpl=embedding,
                softmax_tpl=softmax, stacked_transformer_tpl=stacked, final_ln_tpl=_norm(m))


def _moe_period(m: fdl.Config) -> int:
  """A repeated stack's block size: the MoE layers' period (1 without experts)."""
  return moe_period(tuple(m.moe_layers), m.num_layers) if m.moe_layers else 1


def _moe_fields(m: fdl.Config) -> dict[str, Any]:
  """The stack's MoE fields. Without experts, moe_layer_tpl is praxis's untouched template
  (maybe_setup_moe_params fills it from the feed-forward's); with them, the model's."""
  moe = Config(pl.TransformerFeedForwardMoe, **_hints())
  if m.moe_layers:
    moe = Config(pl.TransformerFeedForwardMoe, hidden_dims=m.moe_hidden_dims or 0,
                 activation_tpl=Config(ACTIVATION_CLASSES[m.moe_activation or m.activation]),
                 ln_tpl=_norm(m), norm_policy=m.norm_policy, num_experts=m.num_experts,
                 num_groups=m.num_groups, expert_capacity_dim=m.expert_capacity_dim,
                 unadjusted_expert_capacity_factor=m.expert_capacity_factor,
                 use_gated_activation=m.moe_gated_activation,
                 gating_logit_cap=m.moe_gating_logit_cap,
                 moe_load_balance_loss_weight=m.moe_load_balance_loss_weight, **_hints())
    if m.moe_fp8:  # as praxis's Grok builder sets it
      moe.einsum_tpl = Config(pl.Fp8EinsumOp)
      moe.einsum_gated_tpl = Config(pl.Fp8EinsumGatedOp)
  return dict(num_experts=m.num_experts, num_groups=m.num_groups,
              moe_layers=list(m.moe_layers or ()), moe_layer_tpl=moe)


# ------------------------------------------------------------ read back


def _read_norm(r: Reader, cfg: Any, path: str) -> None:
  cfg = r.node(cfg, path, pl.LayerNorm, pl.RmsNorm)
  if issubclass(fdl.get_callable(cfg), pl.RmsNorm):
    r.fields(cfg, path, ("epsilon", "direct_scale", "intermediate_dtype", "dim"))
    if not cfg.direct_scale:
      raise UserError(f"{path}.direct_scale = False: paxlike's RmsNorm multiplies by its "
                      "scale directly (praxis's default); leave it True.")
    dtype = cfg.intermediate_dtype
    if dtype is not None and getattr(dtype, "__name__", str(dtype)) != "float32":
      raise UserError(f"{path}.intermediate_dtype = {dtype!r}: paxlike's RmsNorm computes in "
                      "float32; set jnp.float32 or leave it None.")
    r.set("norm_type", path, "rmsnorm")
  else:
    r.fields(cfg, path, ("epsilon", "dim"))
    r.set("norm_type", path, "layernorm")
  r.set("layernorm_epsilon", path + ".epsilon", cfg.epsilon)


def _read_attention(r: Reader, cfg: Any, path: str) -> None:
  cfg = r.node(cfg, path, pl.DotProductAttention, pl.GroupedQueryAttention,
               pl.MultiQueryDotProductAttention)
  common = ("atten_logit_cap", "num_heads", "dim_per_head", "input_dim", "hidden_dim",
            "atten_dropout_prob", "is_causal")
  r.set("atten_logit_cap", path + ".atten_logit_cap", float(cfg.atten_logit_cap or 0.0))
  if cfg.num_heads:
    r.set("num_heads", path + ".num_heads", cfg.num_heads)
  if cfg.dim_per_head:
    r.set("dim_per_head", path + ".dim_per_head", cfg.dim_per_head)
  if cfg.atten_dropout_prob:
    r.set("dropout_prob", path + ".atten_dropout_prob", cfg.atten_dropout_prob)
  if issubclass(fdl.get_callable(cfg), pl.GroupedQueryAttention):
    r.fields(cfg, path, (*common, "num_kv_heads", "rope_min_max_timescales", "use_bias"))
    if cfg.use_bias:
      raise UserError(f"{path}.use_bias = True: paxlike's grouped-query attention has no "
                      "projection biases.")
    rope = cfg.rope_min_max_timescales
    r.set("num_kv_heads", path + ".num_kv_heads", cfg.num_kv_heads)
    r.set("rope_timescales", path + ".rope_min_max_timescales",
          None if rope is None else (float(rope[0]), float(rope[1])))
    r.set("per_dim_scale", path, False)
    r.set("use_bias", path, False)
    r.set("combine_qkv", path, False)
    r.set("query_scale", path, True)
    r.set("attention_extra_logit", path, None)
    r.set("relative_bias", path, None)
    return
  if issubclass(fdl.get_callable(cfg), pl.MultiQueryDotProductAttention):
    _read_multi_query(r, cfg, path, common)
    return
  r.fields(cfg, path, (*common, "use_bias", "internal_enable_per_dim_scale", "combine_qkv",
                       "use_rotary_position_emb", "rotary_position_emb_tpl", "dconv_qkv",
                       "internal_enable_query_scale", "internal_gshard_gaussian_init",
                       "attention_extra_logit", "relative_bias_tpl", "output_proj_use_nhd_shape",
                       "proj_tpl", "combined_qkv_proj_tpl"))
  _read_glam_attention(r, cfg, path)
  r.set("query_scale", path + ".internal_enable_query_scale",
        bool(cfg.internal_enable_query_scale))
  if cfg.dconv_qkv:
    raise UserError(f"{path}.dconv_qkv = True: paxlike's attention has no depthwise "
                    "convolution of q/k/v (Primer's dconv); leave it False.")
  _read_rope(r, cfg, path)
  r.set("num_kv_heads", path, None)
  r.set("use_bias", path + ".use_bias", bool(cfg.use_bias))
  r.set("per_dim_scale", path + ".internal_enable_per_dim_scale",
        bool(cfg.internal_enable_per_dim_scale))
  r.set("combine_qkv", path + ".combine_qkv", bool(cfg.combine_qkv))


def _read_rope(r: Reader, cfg: fdl.Buildable, path: str) -> None:
  """use_rotary_position_emb with its rotary_position_emb_tpl's timescales."""
  rope = None
  if cfg.use_rotary_position_emb:
    rope = (1.0, 10_000.0)
    if cfg.rotary_position_emb_tpl is not None:
      rp = r.node(cfg.rotary_position_emb_tpl, path + ".rotary_position_emb_tpl",
                  pl.RotaryPositionalEmbedding)
      r.fields(rp, path + ".rotary_position_emb_tpl",
               ("min_timescale", "max_timescale", "embedding_dims"))
      rope = (float(rp.min_timescale), float(rp.max_timescale))
  r.set("rope_timescales", path + ".use_rotary_position_emb", rope)


def _read_multi_query(r: Reader, cfg: fdl.Buildable, path: str, common: tuple[str, ...]
                      ) -> None:
  """praxis's MultiQueryDotProductAttention (Grok's): num_kv_heads key/value heads, biases
  on every projection with use_bias, the query always scaled by 1/sqrt(dim per head)
  (praxis's MQA reads no internal_enable_query_scale), no learned per-dim scale. The cache's
  layout (decode_cache, consolidate_rope_key_state), chunked_attn_num_seq_split (the same
  attention in pieces) and zero_fully_masked (no causal row is fully masked) change nothing
  paxlike computes."""
  r.fields(cfg, path, (*common, "num_kv_heads", "use_bias", "internal_enable_query_scale",
                       "internal_gshard_gaussian_init", "output_proj_use_nhd_shape",
                       "use_rotary_position_emb", "rotary_position_emb_tpl",
                       "consolidate_rope_key_state", "relative_bias_tpl",
                       "attention_extra_logit", "dconv_qkv", "combine_qkv", "decode_cache",
                       "scale_query_by_dim_per_head", "chunked_attn_num_seq_split",
                       "local_window_size", "zero_fully_masked", "proj_tpl",
                       "headless_proj_tpl"))
  for name in ("dconv_qkv", "combine_qkv"):
    if getattr(cfg, name):
      raise UserError(f"{path}.{name} = True: praxis's multi-query attention has separate "
                      "q/k/v projections; leave it False.")
  if cfg.local_window_size is not None:
    raise UserError(f"{path}.local_window_size = {cfg.local_window_size!r}: paxlike's "
                    "attention sees every earlier position; leave it None.")
  _read_glam_attention(r, cfg, path)
  kv = count(cfg.num_kv_heads, path + ".num_kv_heads")
  if cfg.headless_proj_tpl is not None:
    hpath = path + ".headless_proj_tpl"
    headless = r.node(cfg.headless_proj_tpl, hpath, pl.OneHeadedAttentionProjection)
    r.fields(headless, hpath, ("input_dim", "output_dim", "use_bias", "einsum_tpl"))
    fp8 = _fp8(r, headless.einsum_tpl, hpath + ".einsum_tpl")
    # praxis projects the keys and values through headless_proj_tpl with one key/value
    # head only; with more, proj_tpl projects them and this template is not built.
    if kv == 1:
      r.set("kv_fp8", hpath + ".einsum_tpl", fp8)
    elif fp8:
      r.notes.append(f"{hpath}.einsum_tpl = Fp8EinsumOp is not applied: praxis builds "
                     f"headless_proj_tpl for one key/value head only (num_kv_heads = {kv}).")
  _read_rope(r, cfg, path)
  r.set("num_kv_heads", path + ".num_kv_heads", kv)
  r.set("use_bias", path + ".use_bias", bool(cfg.use_bias))
  r.set("query_scale", path, True)
  r.set("per_dim_scale", path, False)
  r.set("combine_qkv", path, False)


def _read_glam_attention(r: Reader, cfg: fdl.Buildable, path: str) -> None:
  """The attention fields GLaM sets: an extra logit, a relative bias; the projections'
  layouts (attention_combine_dims, output_proj_use_nhd_shape) store the same weights in
  other shapes, and the attention's use_bias is theirs, so they change nothing here."""
  for name, cls in (("proj_tpl", pl.AttentionProjection),
                    ("combined_qkv_proj_tpl", pl.CombinedQKVProjectionLayer)):
    if getattr(cfg, name, None) is not None:
      proj = r.node(getattr(cfg, name), f"{path}.{name}", cls)
      r.fields(proj, f"{path}.{name}", ("attention_combine_dims", "use_bias", "einsum_tpl"))
      # praxis builds the combined projection only with combine_qkv (q/k/v; proj_tpl then
      # gives the output's), so its einsum counts only then.
      if name == "proj_tpl" or getattr(cfg, "combine_qkv", False):
        where = f"{path}.{name}.einsum_tpl"
        r.set("use_fp8", where, _fp8(r, proj.einsum_tpl, where))
  extra = cfg.attention_extra_logit
  r.set("attention_extra_logit", path + ".attention_extra_logit",
        None if extra is None else float(extra))
  if cfg.internal_gshard_gaussian_init:
    r.notes.append(f"{path}.internal_gshard_gaussian_init = True is not applied: paxlike "
                   "starts the projections with its own fan-in initializer.")
  bpath = path + ".relative_bias_tpl"
  if cfg.relative_bias_tpl is None:
    r.set("relative_bias", bpath, None)
    return
  bias = r.node(cfg.relative_bias_tpl, bpath, pl.RelativeBias)
  r.fields(bias, bpath, ("relative_attention_num_buckets", "relative_attention_max_distance",
                         "bidirectional", "use_length_as_position"))
  if bias.bidirectional:
    raise UserError(f"{bpath}.bidirectional = True: paxlike's LM is causal; leave it False.")
  # use_length_as_position: distances within a packed sequence are the same counted from
  # the row's start as from the sequence's, and only those reach a weighted token.
  r.set("relative_bias", bpath, (count(bias.relative_attention_num_buckets,
                                        bpath + ".relative_attention_num_buckets"),
                                 count(bias.relative_attention_max_distance,
                                        bpath + ".relative_attention_max_distance")))


def _read_ffn(r: Reader, cfg: Any, path: str) -> None:
  cfg = r.node(cfg, path, pl.TransformerFeedForward)
  r.fields(cfg, path, ("activation_tpl", "use_gated_activation", "has_bias", "ln_tpl",
                       "hidden_dims", "input_dims", "relu_dropout_prob",
                       "residual_dropout_prob", "apply_padding_first",
                       "internal_gshard_variance_scaling_fan_in_init"))
  # apply_padding_first zeroes padded positions' inputs; in paxlike's LM no padded
  # position reaches a weighted token (the segment mask), so it changes nothing.
  if cfg.internal_gshard_variance_scaling_fan_in_init:
    r.notes.append(f"{path}.internal_gshard_variance_scaling_fan_in_init = True is not "
                   "applied: paxlike starts the feed-forward with its own fan-in initializer.")
  r.set("activation", path + ".activation_tpl", _activation(cfg.activation_tpl, path))
  r.set("use_gated_activation", path + ".use_gated_activation",
        bool(cfg.use_gated_activation))
  r.set("ffn_has_bias", path + ".has_bias", bool(cfg.has_bias))
  if cfg.hidden_dims:
    r.set("hidden_dims", path + ".hidden_dims", cfg.hidden_dims)
  for name in ("relu_dropout_prob", "residual_dropout_prob"):
    if getattr(cfg, name):
      r.set("dropout_prob", f"{path}.{name}", getattr(cfg, name))
  _read_norm(r, cfg.ln_tpl, path + ".ln_tpl")


def _activation(act: Any, path: str) -> str:
  """The activation's name from a feed-forward's activation_tpl at `path`."""
  if not isinstance(act, fdl.Buildable):
    raise UserError(f"{path}.activation_tpl = {act!r}: set pax_fiddle.Config(layers.GELU) "
                    "or another activation class.")
  name = activations.activation_name(fdl.get_callable(act), tuple(ACTIVATION_CLASSES),
                                     path + ".activation_tpl")
  if name == "gelu" and not act.approximate:
    raise UserError(f"{path}.activation_tpl.approximate = False: paxlike's GELU is the tanh "
                    "approximation; set approximate=True.")
  return name


def _read_layer(r: Reader, cfg: Any, path: str, dense: bool = True) -> None:
  """A layer template; dense=False: every layer of its stack has experts, so praxis never
  builds its tr_fflayer_tpl (Grok's), and neither is it read here."""
  cfg = r.node(cfg, path, pl.Transformer)
  r.fields(cfg, path, ("norm_policy", "ln_tpl", "tr_atten_tpl", "tr_fflayer_tpl",
                       "num_heads", "dim_per_head", "hidden_dims", "input_dims",
                       "atten_dropout_prob", "residual_dropout_prob", "relu_dropout_prob"))
  r.set("norm_policy", path + ".norm_policy", cfg.norm_policy)
  _read_norm(r, cfg.ln_tpl, path + ".ln_tpl")
  _read_attention(r, cfg.tr_atten_tpl, path + ".tr_atten_tpl")
  if dense:
    _read_ffn(r, cfg.tr_fflayer_tpl, path + ".tr_fflayer_tpl")


def _read_stack(r: Reader, cfg: Any, path: str, repeats: int, block: bool = False,
                pipelined: bool = False) -> None:
  """A StackedTransformer run `repeats` times over; `block`: a repeated stack's block,
  `pipelined`: a pipeline's stage."""
  cfg = r.node(cfg, path, pl.StackedTransformer)
  r.fields(cfg, path, ("num_layers", "model_dims", "hidden_dims", "num_heads", "dim_per_head",
                       "dropout_prob", "atten_dropout_prob", "residual_dropout_prob",
                       "relu_dropout_prob", "packed_input", "transformer_layer_params_tpl",
                       "checkpoint_policy", "mask_self_attention", "input_dropout_prob",
                       *MOE_STACK_FIELDS))
  _read_input_dropout(r, cfg, path, block, pipelined)
  if not cfg.mask_self_attention:
    raise UserError(f"{path}.mask_self_attention = False: paxlike's LM is causal; leave it "
                    "True.")
  r.set("num_layers", path + ".num_layers", count(cfg.num_layers, path + ".num_layers") * repeats)
  r.set("model_dims", path + ".model_dims", cfg.model_dims)
  r.set("hidden_dims", path + ".hidden_dims", cfg.hidden_dims)
  r.set("num_heads", path + ".num_heads", cfg.num_heads)
  if cfg.dim_per_head:
    r.set("dim_per_head", path + ".dim_per_head", cfg.dim_per_head)
  r.set("dropout_prob", path + ".dropout_prob", cfg.dropout_prob)
  for name in ("atten_dropout_prob", "residual_dropout_prob", "relu_dropout_prob"):
    if getattr(cfg, name) is not None:
      r.set("dropout_prob", f"{path}.{name}", getattr(cfg, name))
  if cfg.checkpoint_policy is not None:
    r.set("checkpoint_policy", path + ".checkpoint_policy", policy_name(cfg.checkpoint_policy))
  layers = cfg.num_layers
  all_experts = bool(cfg.num_experts) and all(i in list(cfg.moe_layers or ())
                                              for i in range(layers))
  _read_layer(r, cfg.transformer_layer_params_tpl, path + ".transformer_layer_params_tpl",
              dense=not all_experts)
  _read_moe(r, cfg, path, repeats)


MOE_STACK_FIELDS = ("num_experts", "num_groups", "min_group_size", "gating_func", "moe_layers",
                    "moe_layer_tpl")


def _read_moe(r: Reader, cfg: fdl.Buildable, path: str, repeats: int) -> None:
  """The stack's mixture-of-experts layers: moe_layers (of this stack, repeated `repeats`
  times over) with moe_layer_tpl, and the stack's num_experts / num_groups / gating_func,
  which praxis writes over the template's."""
  listed = list(cfg.moe_layers or ())
  if not all(isinstance(i, int | np.integer) and i >= 0 for i in listed):
    raise UserError(f"{path}.moe_layers = {listed!r}: list layer indices (ints from 0).")
  n = cfg.num_layers
  # As praxis: layer i of the stack is MoE when i is listed; larger indices name no layer
  # (Pax's MoELarge lists all 12 layers on a repeated stack's one-layer block).
  chosen = [int(i) for i in listed if i < n]
  if not chosen:
    if cfg.num_experts:
      raise UserError(f"{path}.num_experts = {cfg.num_experts} with moe_layers = {listed!r}: "
                      f"no layer of this {n}-layer stack would be a mixture of experts; list "
                      "some in moe_layers.")
    r.set("moe_layers", path + ".moe_layers", None)
    return
  experts = count(cfg.num_experts, path + ".num_experts")
  if experts < 2:
    raise UserError(f"{path}.num_experts = {experts}: a mixture of experts needs 2 or more.")
  if cfg.gating_func != "top2":
    raise UserError(f"{path}.gating_func = {cfg.gating_func!r}: paxlike routes with GShard's "
                    "top-2 gating; set 'top2'.")
  if cfg.min_group_size is not None:
    raise UserError(f"{path}.min_group_size = {cfg.min_group_size!r}: paxlike routes in "
                    "num_groups fixed groups; leave it None and set num_groups.")
  layers = sorted({i + k * n for k in range(repeats) for i in chosen})
  r.set("moe_layers", path + ".moe_layers", tuple(layers))
  r.set("num_experts", path + ".num_experts", experts)
  r.set("num_groups", path + ".num_groups", count(cfg.num_groups, path + ".num_groups"))
  mpath = path + ".moe_layer_tpl"
  moe = r.node(cfg.moe_layer_tpl, mpath, pl.TransformerFeedForwardMoe)
  r.fields(moe, mpath, ("input_dims", "hidden_dims", "ln_tpl", "activation_tpl",
                        "relu_dropout_prob", "residual_dropout_prob", "norm_policy",
                        "num_experts", "num_groups", "gating_func", "min_group_size",
                        "expert_capacity_dim", "unadjusted_expert_capacity_factor",
                        "use_gated_activation", "gating_logit_cap", "apply_padding_first",
                        "moe_load_balance_loss_weight",
                        "internal_gshard_variance_scaling_fan_in_init", "second_expert_policy",
                        "moe_gating_embedding_level", "einsum_tpl", "einsum_gated_tpl"))
  fp8 = _fp8(r, moe.einsum_tpl, mpath + ".einsum_tpl")
  if moe.use_gated_activation:  # praxis: the gated pair through einsum_gated_tpl, wo not
    gated = _fp8(r, moe.einsum_gated_tpl, mpath + ".einsum_gated_tpl")
    if gated != fp8:
      raise UserError(f"{mpath}.einsum_gated_tpl is {'' if gated else 'not '}FP8 and "
                      f"{mpath}.einsum_tpl is {'' if fp8 else 'not '}: paxlike's experts "
                      "run their einsums in FP8 or none; set both alike.")
  r.set("moe_fp8", mpath + ".einsum_tpl", fp8)
  for name, only in (("second_expert_policy", "all"), ("moe_gating_embedding_level", "token")):
    if getattr(moe, name) != only:
      raise UserError(f"{mpath}.{name} = {getattr(moe, name)!r}: paxlike routes as praxis's "
                      f"default, {only!r}; leave it.")
  if not moe.internal_gshard_variance_scaling_fan_in_init:
    r.notes.append(f"{mpath}.internal_gshard_variance_scaling_fan_in_init = False is not "
                   "applied: paxlike's experts start U(+-sqrt(3 / fan_in)), praxis's default.")
  r.set("moe_activation", mpath + ".activation_tpl", _activation(moe.activation_tpl, mpath))
  _read_norm(r, moe.ln_tpl, mpath + ".ln_tpl")
  r.set("norm_policy", mpath + ".norm_policy", moe.norm_policy)
  for name in ("relu_dropout_prob", "residual_dropout_prob"):
    if getattr(moe, name):
      r.set("dropout_prob", f"{mpath}.{name}", getattr(moe, name))
  hidden = moe.hidden_dims or None
  r.set("moe_hidden_dims", mpath + ".hidden_dims", hidden)
  capacity = moe.expert_capacity_dim or None
  factor = float(moe.unadjusted_expert_capacity_factor or 0.0)
  if capacity is None and not factor:
    raise UserError(f"{mpath}: expert_capacity_dim and unadjusted_expert_capacity_factor are "
                    "both unset; set one (praxis's default factor is 2.0).")
  r.set("expert_capacity_dim", mpath + ".expert_capacity_dim", capacity)
  r.set("expert_capacity_factor", mpath + ".unadjusted_expert_capacity_factor", factor)
  r.set("moe_gated_activation", mpath + ".use_gated_activation",
        bool(moe.use_gated_activation))
  r.set("moe_gating_logit_cap", mpath + ".gating_logit_cap", float(moe.gating_logit_cap or 0.0))
  weight = float(moe.moe_load_balance_loss_weight)
  if not weight > 0.0:
    raise UserError(f"{mpath}.moe_load_balance_loss_weight = {weight!r}: praxis requires a "
                    "positive weight for the load-balancing loss.")
  r.set("moe_load_balance_loss_weight", mpath + ".moe_load_balance_loss_weight", weight)


def _fp8(r: Reader, cfg: Any, path: str) -> bool:
  """Whether an einsum_tpl at `path` is praxis's FP8 einsum (None, EinsumOp: not)."""
  if cfg is None:
    return False
  node = r.node(cfg, path, pl.EinsumOp)
  if not issubclass(fdl.get_callable(node), pl.Fp8EinsumOp):
    r.fields(node, path, ())
    return False
  r.fields(node, path, ("amax_history_length", "use_direct_quant"))
  if node.amax_history_length != AMAX_HISTORY:
    raise UserError(f"{path}.amax_history_length = {node.amax_history_length!r}: paxlike's "
                    f"FP8 scales follow the last {AMAX_HISTORY} steps (praxis's default); "
                    "leave it.")
  return True


def _read_input_dropout(r: Reader, cfg: Any, path: str, block: bool, pipelined: bool) -> None:
  """praxis drops a stack's input each time the stack runs: once for a plain stack, before
  every layer for a repeated stack's one-layer block (a pipeline stage's too)."""
  rate = cfg.input_dropout_prob
  if not rate:
    return
  where = f"{path}.input_dropout_prob"
  if not 0.0 < rate < 1.0:
    raise UserError(f"{where} = {rate!r} must be in [0, 1).")
  if (pipelined and not block) or (block and count(cfg.num_layers, path + ".num_layers") != 1):
    raise UserError(f"{where} = {rate!r}: paxlike drops the stack's input once, or before "
                    "every layer of a repeated stack whose block has one layer; this stack "
                    f"runs {'per pipeline stage' if pipelined else 'in blocks of several layers'}"
                    ", so leave it at 0.0.")
  r.set("layer_input_dropout_prob" if block else "input_dropout_prob", where, rate)


def _read_stacked(r: Reader, cfg: Any, path: str, stages: int | None) -> None:
  """The layer stack; `stages`: the experiment's NUM_STAGES (None: not pipelined)."""
  cfg = r.node(cfg, path, pl.StackedTransformer, pl.StackedTransformerRepeated,
               pl.PipelinedTransformer)
  pipelined = issubclass(fdl.get_callable(cfg), pl.PipelinedTransformer)
  if pipelined and stages is None:
    raise UserError(f"{path} = pax_fiddle.Config(PipelinedTransformer) on an experiment "
                    "whose meshes have no stage axis: subclass "
                    "TransformerLmSpmdPipelineAdafactor / Adam (NUM_STAGES, a 4-axis [stage, "
                    "replica, data, mdl] mesh), whose task() builds the pipeline.")
  if not pipelined and stages is not None:
    raise UserError(f"{path} = pax_fiddle.Config({name_of(fdl.get_callable(cfg))}) on a "
                    f"pipelined experiment (NUM_STAGES={stages}): keep the "
                    "PipelinedTransformer its task() builds and edit its pipeline_stage.")
  if pipelined:
    _read_pipeline(r, cfg, path, stages)
    return
  for name in ("num_stages", "num_microbatches", "microbatch_size"):
    r.set(name, path, None)
  r.set("circular_repeat", path, 1)
  r.set("stream_io", path, False)
  _read_stage(r, cfg, path, 1)


def _read_stage(r: Reader, cfg: Any, path: str, times: int, pipelined: bool = False) -> None:
  """A StackedTransformer(Repeated) whose layers the model has `times` copies of (a pipeline's
  stage when `pipelined`)."""
  cfg = r.node(cfg, path, pl.StackedTransformer, pl.StackedTransformerRepeated)
  if issubclass(fdl.get_callable(cfg), pl.StackedTransformerRepeated):
    r.fields(cfg, path, ("block", "x_times", "checkpoint_policy", "unroll_in_decode"))
    r.set("use_repeated_layer", path, True)
    if cfg.checkpoint_policy is not None:
      r.set("checkpoint_policy", path + ".checkpoint_policy",
            policy_name(cfg.checkpoint_policy))
    _read_stack(r, cfg.block, path + ".block", count(cfg.x_times, path + ".x_times") * times,
                block=True, pipelined=pipelined)
    return
  r.set("use_repeated_layer", path, False)
  _read_stack(r, cfg, path, times, pipelined=pipelined)


def _read_pipeline(r: Reader, cfg: fdl.Buildable, path: str, stages: int) -> None:
  """praxis's PipelinedTransformer: the schedule's fields, then its stage template."""
  r.fields(cfg, path, ("pipeline_stage", "num_pipeline_stages", "circular_repeat",
                       "num_pipeline_microbatches", "pipeline_microbatch_size", "stream_io",
                       "pipeline_broadcast_inputs", "checkpoint_policy",
                       "enable_async_circular_transfer"))
  s = count(cfg.num_pipeline_stages, path + ".num_pipeline_stages")
  if s != stages:
    raise UserError(f"{path}.num_pipeline_stages = {s} differs from NUM_STAGES={stages} (the "
                    "mesh's stage axis); make them equal.")
  repeat = count(cfg.circular_repeat, path + ".circular_repeat")
  m = count(cfg.num_pipeline_microbatches, path + ".num_pipeline_microbatches", none_ok=True)
  size = count(cfg.pipeline_microbatch_size, path + ".pipeline_microbatch_size", none_ok=True)
  if m is None and size is None:
    raise UserError(f"{path}.num_pipeline_microbatches and .pipeline_microbatch_size are both "
                    "None; set one of them (the other follows from the batch).")
  if repeat > 1 and m is not None and m < s:
    raise UserError(f"{path}.num_pipeline_microbatches = {m} is fewer than "
                    f"num_pipeline_stages = {s}: the circular schedule (circular_repeat = "
                    f"{repeat}) needs at least one microbatch per stage.")
  if cfg.pipeline_broadcast_inputs:
    raise UserError(f"{path}.pipeline_broadcast_inputs = True: paxlike feeds the "
                    "microbatches to the first stage only (praxis's default); leave it False.")
  if not cfg.enable_async_circular_transfer:
    r.notes.append(f"{path}.enable_async_circular_transfer = False is not applied: paxlike's "
                   "circular schedule has one way of passing microbatches back to the first "
                   "stage (the same result either way).")
  r.set("num_stages", path + ".num_pipeline_stages", s)
  r.set("circular_repeat", path + ".circular_repeat", repeat)
  r.set("num_microbatches", path + ".num_pipeline_microbatches", m)
  r.set("microbatch_size", path + ".pipeline_microbatch_size", size)
  r.set("stream_io", path + ".stream_io", bool(cfg.stream_io))
  if cfg.checkpoint_policy is not None:
    r.set("checkpoint_policy", path + ".checkpoint_policy", policy_name(cfg.checkpoint_policy))
  _read_stage(r, cfg.pipeline_stage, path + ".pipeline_stage", s * repeat, pipelined=True)


def _overwritten_by_vocab(r: Reader, lm: fdl.Buildable, path: str, num_classes: Any) -> None:
  """A table's num_classes, which praxis's TransformerLm overwrites with lm_tpl.vocab_size:
  a different value is noted, not applied."""
  if num_classes and num_classes != lm.vocab_size:
    r.notes.append(f"{path}.num_classes = {num_classes!r} is not applied: praxis's "
                   f"TransformerLm sets it to lm_tpl.vocab_size = {lm.vocab_size!r}.")


def _read_gshard_softmax(r: Reader, lm: fdl.Buildable, path: str) -> None:
  """praxis's GShardSharedEmbeddingSoftmax (GLaM): the tied table, GShard's way."""
  spath = path + ".softmax_tpl"
  softmax = lm.softmax_tpl
  r.fields(softmax, spath, ("num_classes", "input_dims", "use_tgt_labels_size_as_loss_denominator",
                            "soft_cap_logits", "z_loss_weight", "params_init"))
  if lm.separate_embedding_tpl is not None:
    raise UserError(f"{path}.separate_embedding_tpl is set while {spath} is the tied "
                    "GShardSharedEmbeddingSoftmax; use layers.FullSoftmax with a separate "
                    "embedding.")
  _overwritten_by_vocab(r, lm, spath, softmax.num_classes)
  r.set("gshard_softmax", spath, True)
  r.set("softmax_has_bias", spath, False)
  r.set("scale_sqrt_depth", spath, False)
  r.set("separate_embedding", spath, False)
  r.set("softmax_cap_logits", spath + ".soft_cap_logits", float(softmax.soft_cap_logits or 0.0))
  r.set("z_loss_weight", spath + ".z_loss_weight", float(softmax.z_loss_weight or 0.0))
  r.set("loss_over_labels_size", spath + ".use_tgt_labels_size_as_loss_denominator",
        bool(softmax.use_tgt_labels_size_as_loss_denominator))
  r.set("softmax_weight_init", spath + ".params_init", weight_init(softmax.params_init,
                                                             spath + ".params_init"))


def _read_tables(r: Reader, lm: fdl.Buildable, path: str) -> None:
  if isinstance(lm.softmax_tpl, fdl.Buildable) and issubclass(
      fdl.get_callable(lm.softmax_tpl), pl.GShardSharedEmbeddingSoftmax):
    _read_gshard_softmax(r, lm, path)
    return
  r.set("gshard_softmax", path + ".softmax_tpl", False)
  r.set("z_loss_weight", path + ".softmax_tpl", 0.0)
  r.set("loss_over_labels_size", path + ".softmax_tpl", False)
  softmax = r.node(lm.softmax_tpl, path + ".softmax_tpl", pl.FullSoftmax)
  tied = issubclass(fdl.get_callable(softmax), pl.SharedEmbeddingSoftmax)
  spath = path + ".softmax_tpl"
  r.fields(softmax, spath, ("num_classes", "input_dims", "scale_sqrt_depth", "lookup_style",
                            "params_init", "feed_forward_tpl", "soft_cap_logits"))
  _overwritten_by_vocab(r, lm, spath, softmax.num_classes)
  ff = r.node(softmax.feed_forward_tpl, spath + ".feed_forward_tpl", pl.FeedForward)
  r.fields(ff, spath + ".feed_forward_tpl", ("has_bias", "input_dims", "output_dims"))
  r.set("softmax_has_bias", spath + ".feed_forward_tpl.has_bias", bool(ff.has_bias))
  r.set("softmax_cap_logits", spath + ".soft_cap_logits", float(softmax.soft_cap_logits or 0.0))
  r.set("softmax_weight_init", spath + ".params_init", weight_init(softmax.params_init,
                                                             spath + ".params_init"))
  epath = path + ".separate_embedding_tpl"
  if lm.separate_embedding_tpl is None:
    if not tied:
      raise UserError(f"{spath} = pax_fiddle.Config(FullSoftmax) without "
                      f"{epath}: the LM would have no input table; set "
                      "separate_embedding_tpl = pax_fiddle.Config(layers.Embedding).")
    r.set("separate_embedding", epath, False)
    embedder, epath = softmax, spath
  else:
    if tied:
      raise UserError(f"{epath} is set while {spath} is the tied SharedEmbeddingSoftmax; "
                      "use layers.FullSoftmax with a separate embedding.")
    embedder = r.node(lm.separate_embedding_tpl, epath, pl.Embedding)
    r.fields(embedder, epath, ("num_classes", "input_dims", "scale_sqrt_depth",
                               "lookup_style", "params_init"))
    _overwritten_by_vocab(r, lm, epath, embedder.num_classes)
    if embedder.params_init is not None:
      raise UserError(f"{epath}.params_init: paxlike starts the input table from "
                      "model_p.params_init; set it there.")
    r.set("separate_embedding", epath, True)
  r.set("scale_sqrt_depth", epath + ".scale_sqrt_depth", bool(embedder.scale_sqrt_depth))
  r.set("embedding_lookup_style", epath + ".lookup_style", embedder.lookup_style)


def _read_position(r: Reader, cfg: Any, path: str) -> None:
  if cfg is None:
    r.set("trainable_position_emb", path, False)
    r.set("use_position_emb", path, False)
    return
  cfg = r.node(cfg, path, pl.PositionalEmbedding, pl.TrainablePositionalEmbedding)
  if issubclass(fdl.get_callable(cfg), pl.RotaryPositionalEmbedding):
    raise UserError(f"{path} = pax_fiddle.Config(RotaryPositionalEmbedding): praxis applies "
                    "rotary positions in the attention; set position_emb_tpl = None and "
                    "tr_atten_tpl.use_rotary_position_emb = True.")
  if issubclass(fdl.get_callable(cfg), pl.TrainablePositionalEmbedding):
    r.fields(cfg, path, ("embedding_dims", "max_seq_length", "lookup_style"))
    r.set("trainable_position_emb", path, True)
    r.set("trainable_pe_max_seq_len", path + ".max_seq_length", cfg.max_seq_length)
    r.set("embedding_lookup_style", path + ".lookup_style", cfg.lookup_style)
    r.set("use_position_emb", path, True)
    return
  r.fields(cfg, path, ("embedding_dims",))
  r.set("trainable_position_emb", path, False)
  r.set("use_position_emb", path, True)


def read_tree(tree: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
  """The LanguageModel fields the tree gives, and the notes (hints not applied)."""
  r = Reader()
  path = "task_p.model.lm_tpl"
  lm = r.node(tree["lm_tpl"], path, pl.TransformerLm)
  r.fields(lm, path, ("model_dims", "vocab_size", "packed_input", "model_type",
                      "position_emb_tpl", "separate_embedding_tpl", "softmax_tpl",
                      "stacked_transformer_tpl", "final_ln_tpl", "ngrammer_tpl"))
  if lm.model_type != pl.LanguageModelType.CAUSAL:
    raise UserError(f"{path}.model_type = {lm.model_type!r}: paxlike's LM is causal "
                    "(LanguageModelType.CAUSAL).")
  if lm.ngrammer_tpl is not None:
    raise UserError(f"{path}.ngrammer_tpl: paxlike's LM has no n-grammer layer.")
  r.set("model_dims", path + ".model_dims", lm.model_dims)
  r.set("vocab_size", path + ".vocab_size", lm.vocab_size)
  r.set("packed_input", path + ".packed_input", bool(lm.packed_input))
  _read_tables(r, lm, path)
  _read_position(r, lm.position_emb_tpl, path + ".position_emb_tpl")
  _read_stacked(r, lm.stacked_transformer_tpl, path + ".stacked_transformer_tpl",
                tree.get(_STAGES))
  _read_norm(r, lm.final_ln_tpl, path + ".final_ln_tpl")
  r.set("weight_init", "task_p.model.params_init",
        weight_init(tree["params_init"], "task_p.model.params_init"))
  dpath = "task_p.model.decoder_tpl"
  decoder = r.node(tree["decoder_tpl"], dpath, pl.DecoderHParams)
  r.fields(decoder, dpath, ("seqlen", "eos_id"))
  eos = decoder.eos_id
  if isinstance(eos, list | tuple):
    if len(eos) != 1:
      raise UserError(f"{dpath}.eos_id = {eos!r}: paxlike's decoding ends on one id.")
    eos = eos[0]
  r.set("eos_id", dpath + ".eos_id", int(eos))
  if tree["report_strict_acc"]:
    r.set("report_strict_acc", "task_p.model.report_strict_acc", True)
  values = {k: v for k, (_, v) in r.values.items()}
  if values.get("moe_activation") == values.get("activation"):
    values["moe_activation"] = None  # the experts' activation is the model's
  if "kv_fp8" in values and values["kv_fp8"] == values.get("use_fp8", False):
    values["kv_fp8"] = None  # the key/value projections' FP8 is the model's
  return values, r.notes


def resolve(task_cfg: Any) -> list[str]:
  """Writes a task's praxis tree edits onto its LanguageModel config; returns the notes.

  A task whose model config has no tree (task() never read lm_tpl or
  params_init) is left as it is.
  """
  model = getattr(task_cfg, "model", None)
  if not isinstance(model, LmConfig) or model.__dict__.get(_TREE) is None:
    return []
  values, notes = read_tree(model.__dict__[_TREE])
  object.__setattr__(model, _TREE, None)
  for name, value in values.items():
    if not same(getattr(model, name), value):
      setattr(model, name, value)
  return notes


__all__ = ["LmConfig", "read_tree", "resolve", "tree_of"]
