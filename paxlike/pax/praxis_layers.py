"""praxis's LM layer classes as config targets: the nodes of `task_p.model.lm_tpl`.

Pax's experiment files edit praxis's config tree (`lm_tpl.stacked_transformer_tpl
.transformer_layer_params_tpl.tr_atten_tpl...`) and compare its callables
(`fdl.get_callable(p) == transformers.PipelinedTransformer`). The classes here
carry praxis's names and the fields (with praxis's defaults) that
paxlike.pax.config_tree translates onto paxlike's own model; fiddle refuses
any other field by name. None of them is built from the tree: paxlike builds
its own layers from what the tree says. (FeedForward, the softmax's
feed_forward_tpl, is also praxis's runnable layer, paxlike.pax.user_layers,
for a Pax user's own models.)
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from paxlike.errors import UserError
from paxlike.layers import activations

# Runnable praxis layers that are also nodes of the tree (the softmax's feed_forward_tpl, the
# norms): re-exported here as the tree's classes.
from paxlike.pax import user_layers
from paxlike.pax.user_layers import FeedForward, LayerNorm, RmsNorm  # noqa: E402, F401


class _Template:
  """A praxis layer as a config target only."""

  @classmethod
  def sub_templates(cls) -> dict[str, type]:
    """praxis's template fields that default to a config of a class (see pax_fiddle)."""
    return {}

  def __post_init__(self) -> None:
    raise UserError(f"{type(self).__name__} is a praxis template that paxlike reads from "
                    "task_p.model.lm_tpl; it is not built on its own (a Pax model's own "
                    "layers can build praxis's linears, normalizations, convolutions and "
                    "poolings).")


class LanguageModelType(enum.Enum):
  """praxis's transformer_models.LanguageModelType."""

  CAUSAL = "causal"
  PREFIX = "prefix"
  BIDIRECTIONAL = "bidirectional"


class SplitDimsMapping:
  """praxis's weight_split_dims_mapping / activation_split_dims_mapping: any named axes."""

  def __init__(self, **axes: Any) -> None:
    raise UserError("split dims mappings are sharding hints paxlike reads from the tree; "
                    "they are not built on their own.")


# ------------------------------------------------------------------ norms


# LayerNorm and RmsNorm: praxis's runnable layers (paxlike.pax.user_layers), read here as
# templates.


# ------------------------------------------------- embeddings and softmax


@dataclasses.dataclass
class _Sharded(_Template):
  """praxis's BaseLayer fields every layer here has: its init and sharding hints."""

  params_init: Any = None
  weight_split_dims_mapping: Any = None
  activation_split_dims_mapping: Any = None
  name: str = ""

  @classmethod
  def sub_templates(cls) -> dict[str, type]:
    return {"weight_split_dims_mapping": SplitDimsMapping,
            "activation_split_dims_mapping": SplitDimsMapping}


@dataclasses.dataclass
class _Table(_Sharded):
  num_classes: int = 0
  input_dims: int = 0
  scale_sqrt_depth: bool = False
  lookup_style: str = "index"


@dataclasses.dataclass
class Embedding(_Table):
  """praxis's embedding_softmax.Embedding (a separate input table)."""


@dataclasses.dataclass
class FullSoftmax(_Table):
  feed_forward_tpl: Any = None
  soft_cap_logits: float | None = 0.0
  label_smoothing_prob: float = 0.0
  z_loss_weight: float = 0.0
  bi_tempered_loss_tpl: Any = None

  @classmethod
  def sub_templates(cls) -> dict[str, type]:
    return {**super().sub_templates(), "feed_forward_tpl": FeedForward}


# A user's model that makes layers.FullSoftmax a child (a classifier's softmax_tpl) builds
# praxis's runnable softmax (paxlike.pax.base_layer's create_child swaps it in).
FullSoftmax.runnable_twin = user_layers.FullSoftmax


@dataclasses.dataclass
class SharedEmbeddingSoftmax(FullSoftmax):
  """praxis's tied input table and softmax."""


@dataclasses.dataclass
class GShardSharedEmbeddingSoftmax(_Sharded):
  """praxis's GShard tied table (GLaM): N(0, 1) rows, embedded unscaled, logits from the
  activations scaled by 1/sqrt(input_dims), no bias; an optional z-loss."""

  input_dims: int = 0
  num_classes: int = 0
  use_tgt_labels_size_as_loss_denominator: bool = True
  soft_cap_logits: float | None = 0.0
  logits_abs_max: float | None = 0.0
  z_loss_weight: float = 0.0
  label_smoothing_prob: float = 0.0


@dataclasses.dataclass
class PositionalEmbedding(_Template):
  embedding_dims: int = 0
  min_timescale: int = 1
  max_timescale: int = 10_000
  name: str = ""


@dataclasses.dataclass
class TrainablePositionalEmbedding(_Template):
  embedding_dims: int = 0
  max_seq_length: int = 10_240
  lookup_style: str = "matmul"
  params_init: Any = None
  weight_split_dims_mapping: Any = None
  name: str = ""


@dataclasses.dataclass
class RotaryPositionalEmbedding(PositionalEmbedding):
  pass


# ------------------------------------------------------------- attention


@dataclasses.dataclass
class _Attention(_Sharded):
  input_dim: int = 0
  hidden_dim: int = 0
  num_heads: int = 0
  dim_per_head: int | None = None
  atten_dropout_prob: float = 0.0
  atten_logit_cap: float = 0.0


@dataclasses.dataclass
class RelativeBias(_Template):
  """praxis's per-layer T5-style relative position bias (GLaM's attention)."""

  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  bidirectional: bool = False
  use_length_as_position: bool = True
  name: str = ""


# ------------------------------------------------------------- einsums


@dataclasses.dataclass
class EinsumOp(_Template):
  """praxis's base_ops.EinsumOp: a layer's plain einsum (in the compute dtype)."""

  name: str = ""


@dataclasses.dataclass
class EinsumGatedOp(EinsumOp):
  """praxis's base_ops.EinsumGatedOp: a gated feed-forward's pair of einsums."""


@dataclasses.dataclass
class Fp8EinsumOp(EinsumOp):
  """praxis's fp8_nvidia_gpu.Fp8EinsumOp: the einsum of FP8 operands with delayed scaling,
  paxlike's USE_FP8 (paxlike.layers.linear.fp8_product). use_direct_quant picks how praxis
  writes the same quantisation; both read the same here."""

  amax_history_length: int = 1024
  use_direct_quant: bool = True


@dataclasses.dataclass
class Fp8EinsumGatedOp(Fp8EinsumOp):
  """praxis's fp8_nvidia_gpu.Fp8EinsumGatedOp: both einsums of a gated pair in FP8."""


@dataclasses.dataclass
class AttentionProjection(_Template):
  """praxis's q/k/v/output projection; its fields lay out the weights, not the math, but
  for einsum_tpl (Fp8EinsumOp: the projection in FP8)."""

  attention_combine_dims: bool = False
  use_bias: bool = True
  einsum_tpl: Any = None
  name: str = ""

  @classmethod
  def sub_templates(cls) -> dict[str, type]:
    return {"einsum_tpl": EinsumOp}


@dataclasses.dataclass
class CombinedQKVProjectionLayer(AttentionProjection):
  """praxis's combined q/k/v projection."""


@dataclasses.dataclass
class DotProductAttention(_Attention):
  use_bias: bool = True
  internal_enable_per_dim_scale: bool = True
  internal_enable_query_scale: bool = True
  internal_gshard_gaussian_init: bool = False
  attention_extra_logit: float | None = None
  combine_qkv: bool = False
  dconv_qkv: bool = False
  use_rotary_position_emb: bool = False
  rotary_position_emb_tpl: Any = None
  relative_bias_tpl: Any = None
  output_proj_use_nhd_shape: bool = False
  proj_tpl: Any = None
  combined_qkv_proj_tpl: Any = None
  is_causal: bool = False  # praxis's GPU fused variants take it; paxlike's LM is causal

  @classmethod
  def sub_templates(cls) -> dict[str, type]:
    return {**super().sub_templates(), "proj_tpl": AttentionProjection,
            "combined_qkv_proj_tpl": CombinedQKVProjectionLayer}


@dataclasses.dataclass
class GroupedQueryAttention(_Attention):
  num_kv_heads: int = 1
  rope_min_max_timescales: Any = None
  use_bias: bool = False
  is_causal: bool = False


@dataclasses.dataclass
class OneHeadedAttentionProjection(_Template):
  """praxis's key/value projection of a one-key/value-head MultiQueryDotProductAttention;
  einsum_tpl (Fp8EinsumOp: the key and value projections in FP8)."""

  input_dim: int = 0
  output_dim: int = 0
  use_bias: bool = True
  einsum_tpl: Any = None
  name: str = ""

  @classmethod
  def sub_templates(cls) -> dict[str, type]:
    return {"einsum_tpl": EinsumOp}


@dataclasses.dataclass
class MultiQueryDotProductAttention(_Attention):
  """praxis's multi-query attention (Grok's): num_kv_heads key/value heads shared by the
  query heads, biases on every projection (use_bias), the query scaled by 1/sqrt(dim per
  head) (praxis's MQA does not read internal_enable_query_scale), rotary positions on q and
  k with use_rotary_position_emb."""

  num_kv_heads: int = 1
  use_bias: bool = True
  internal_enable_query_scale: bool = True
  internal_gshard_gaussian_init: bool = False
  output_proj_use_nhd_shape: bool = False
  use_rotary_position_emb: bool = False
  rotary_position_emb_tpl: Any = None
  consolidate_rope_key_state: bool = False
  relative_bias_tpl: Any = None
  attention_extra_logit: float | None = None
  dconv_qkv: bool = False
  combine_qkv: bool = False
  decode_cache: bool = True
  scale_query_by_dim_per_head: bool = False
  chunked_attn_num_seq_split: int = 1
  local_window_size: Any = None
  zero_fully_masked: bool = False
  proj_tpl: Any = None
  headless_proj_tpl: Any = None

  @classmethod
  def sub_templates(cls) -> dict[str, type]:
    return {**super().sub_templates(), "proj_tpl": AttentionProjection,
            "headless_proj_tpl": OneHeadedAttentionProjection,
            "rotary_position_emb_tpl": RotaryPositionalEmbedding}


@dataclasses.dataclass
class GpuTritonFusedDotProductAttention(DotProductAttention):
  """praxis's Triton flash attention: paxlike picks its attention kernel per platform."""


@dataclasses.dataclass
class GpuCudnnFusedDotProductAttention(DotProductAttention):
  """praxis's cuDNN flash attention: paxlike picks its attention kernel per platform."""


@dataclasses.dataclass
class GpuCudnnFusedGroupedQueryAttention(GroupedQueryAttention):
  """praxis's cuDNN GQA: paxlike picks its attention kernel per platform."""


class GpuTritonFusedLayerNorm(LayerNorm):
  """praxis's Triton LayerNorm: the same normalisation, XLA fuses paxlike's."""


# -------------------------------------------------------- feed-forward


@dataclasses.dataclass
class _FeedForwardLayer(_Sharded):
  """The fields praxis's dense and mixture-of-experts feed-forward layers share."""

  input_dims: int = 0
  hidden_dims: int = 0
  activation_tpl: Any = None
  use_gated_activation: bool = False
  ln_tpl: Any = None
  residual_dropout_prob: float = 0.0
  relu_dropout_prob: float = 0.0
  norm_policy: str = "pre"
  add_skip_connection: bool = True
  apply_padding_first: bool = False

  @classmethod
  def sub_templates(cls) -> dict[str, type]:
    return {**super().sub_templates(), "activation_tpl": activations.ReLU, "ln_tpl": LayerNorm}


@dataclasses.dataclass
class TransformerFeedForward(_FeedForwardLayer):
  has_bias: bool = True
  internal_gshard_variance_scaling_fan_in_init: bool = False


@dataclasses.dataclass
class TransformerFeedForwardMoe(_FeedForwardLayer):
  """praxis's mixture-of-experts feed-forward (paxlike.layers.moe), as a stack's
  moe_layer_tpl. The stack's num_experts / num_groups / gating_func override these.
  (Not a TransformerFeedForward, as in praxis.)"""

  residual_weight: float = 1.0
  gating_func: str = "top2"
  num_experts: int = 0
  num_groups: int = 0
  min_group_size: int | None = None
  expert_capacity_dim: int | None = 0
  unadjusted_expert_capacity_factor: float = 2.0
  second_expert_policy: str = "all"
  internal_gshard_variance_scaling_fan_in_init: bool = True
  moe_load_balance_loss_weight: float = 1.0
  gating_logit_cap: float = 0.0
  moe_gating_embedding_level: str = "token"
  # praxis's einsums of the experts (Fp8EinsumOp / Fp8EinsumGatedOp: in FP8; paxlike's
  # dispatch and combine are gathers, which have no product to quantise).
  einsum_tpl: Any = None
  einsum_gated_tpl: Any = None

  @classmethod
  def sub_templates(cls) -> dict[str, type]:
    return {**super().sub_templates(), "einsum_tpl": EinsumOp, "einsum_gated_tpl": EinsumGatedOp}


# ------------------------------------------------------- the layer stack


@dataclasses.dataclass
class Transformer(_Template):
  input_dims: int = 0
  hidden_dims: int = 0
  num_heads: int | None = None
  dim_per_head: int | None = None
  norm_policy: str = "pre"
  ln_tpl: Any = None
  tr_atten_tpl: Any = None
  cross_atten_tpl: Any = None  # None: a decoder-only layer (use_cross_attention False)
  tr_fflayer_tpl: Any = None
  dropout_tpl: Any = None
  atten_dropout_prob: float = 0.0
  residual_dropout_prob: float = 0.0
  relu_dropout_prob: float = 0.0
  use_cross_attention: bool = False
  params_init: Any = None
  name: str = ""

  @classmethod
  def sub_templates(cls) -> dict[str, type]:
    return {"ln_tpl": LayerNorm, "tr_atten_tpl": DotProductAttention,
            "tr_fflayer_tpl": TransformerFeedForward}


@dataclasses.dataclass
class StackedTransformer(_Template):
  num_layers: int = 0
  model_dims: int = 0
  hidden_dims: int = 0
  num_heads: int = 0
  dim_per_head: int | None = None
  dropout_prob: float = 0.0
  atten_dropout_prob: float | None = None
  residual_dropout_prob: float | None = None
  relu_dropout_prob: float | None = None
  input_dropout_prob: float = 0.0
  mask_self_attention: bool = True
  packed_input: bool = False
  use_cross_attention: bool = False
  transformer_layer_params_tpl: Any = None
  checkpoint_policy: Any = None
  remat: bool = False
  num_experts: int = 0
  num_groups: int = 1
  min_group_size: int | None = None
  gating_func: str = "top2"
  moe_layers: Any = ()
  moe_layer_tpl: Any = None
  params_init: Any = None
  name: str = ""

  @classmethod
  def sub_templates(cls) -> dict[str, type]:
    return {"transformer_layer_params_tpl": Transformer,
            "moe_layer_tpl": TransformerFeedForwardMoe}


@dataclasses.dataclass
class StackedTransformerRepeated(_Template):
  block: Any = None
  x_times: int = 0
  checkpoint_policy: Any = None
  unroll_in_decode: bool = True
  params_init: Any = None
  name: str = ""


@dataclasses.dataclass
class PipelinedTransformer(_Template):
  """praxis's pipeline over a stage template (GPipe, or circular with circular_repeat > 1).

  pipeline_stage: one stage's layers (StackedTransformer, or
  StackedTransformerRepeated); the model has num_layers x stages x
  circular_repeat of them. checkpoint_policy None: the stage's own policy
  (praxis's default, SAVE_ITERATION_INPUT, is not one paxlike has).
  """

  pipeline_stage: Any = None
  circular_repeat: int = 1
  num_pipeline_stages: int | None = None
  num_pipeline_microbatches: int | None = None
  pipeline_microbatch_size: int | None = None
  stream_io: bool = False
  pipeline_broadcast_inputs: bool = False
  checkpoint_policy: Any = None
  enable_async_circular_transfer: bool = True
  bf16_accum_in_fp32: bool = False
  weight_split_dims_mapping: Any = None
  activation_split_dims_mapping: Any = None
  params_init: Any = None
  name: str = ""

  @classmethod
  def sub_templates(cls) -> dict[str, type]:
    return {"pipeline_stage": StackedTransformer,
            "weight_split_dims_mapping": SplitDimsMapping,
            "activation_split_dims_mapping": SplitDimsMapping}


# -------------------------------------------------------------- the LM


@dataclasses.dataclass
class DecoderHParams(_Template):
  """praxis's decoder_tpl on the LM model: what decoding ends on and how long it runs.

  paxlike decodes each row to the end of its input (MAX_SEQ_LEN, what Pax's
  files set seqlen to), so seqlen is read only to be checked against that.
  """

  seqlen: int = 0
  eos_id: int | list[int] = 1
  max_decode_steps: int | None = None
  fprop_for_prefix: bool = False
  num_samples: int = 1


@dataclasses.dataclass
class TransformerLm(_Template):
  model_dims: int = 0
  vocab_size: int = 0
  packed_input: bool = False
  model_type: LanguageModelType = LanguageModelType.CAUSAL
  position_emb_tpl: Any = None
  separate_embedding_tpl: Any = None
  softmax_tpl: Any = None
  stacked_transformer_tpl: Any = None
  final_ln_tpl: Any = None
  ngrammer_tpl: Any = None
  params_init: Any = None
  name: str = ""

  @classmethod
  def sub_templates(cls) -> dict[str, type]:
    return {"position_emb_tpl": PositionalEmbedding, "softmax_tpl": SharedEmbeddingSoftmax,
            "stacked_transformer_tpl": StackedTransformer, "final_ln_tpl": LayerNorm}

  @classmethod
  def set_sharding_params_v1(cls, lm_p: Any, *, replica_axis: str = "replica",
                             data_axis: str = "data", mdl_axis: str = "mdl",
                             ici_mesh_shape: Any = None, dcn_mesh_shape: Any = None,
                             mesh_axis_names: Any = None, training_optimized: bool = False
                             ) -> Any:
    """praxis's sharding annotations for the LM over Pax's three axes: paxlike shards by
    its logical axis rules, which place every weight (the experts over 'data') as these
    annotations do, so lm_p comes back as it is. Other axis names are refused."""
    del dcn_mesh_shape, training_optimized
    _check_sharding_axes("set_sharding_params_v1", ("replica", "data", "mdl"),
                         (replica_axis, data_axis, mdl_axis), mesh_axis_names, ici_mesh_shape)
    return lm_p

  @classmethod
  def set_sharding_params_with_expert_parallelism(
      cls, lm_p: Any, *, replica_axis: str = "replica", data_axis: str = "data",
      data_expert_axis: str = "data_expert", mdl_axis: str = "mdl", ici_mesh_shape: Any = None,
      dcn_mesh_shape: Any = None, batch_axes: Any = None, mesh_axis_names: Any = None,
      seq_axis: Any = None, training_optimized: bool = False) -> Any:
    """praxis's expert-parallel sharding over Pax's 4-axis mesh [replica, data, data_expert,
    mdl]: the experts over data_expert, their embed dim over data, the batch and the other
    weights' embed dims over data x data_expert. paxlike's rules for that mesh
    (paxlike.mesh) place them so, so lm_p comes back as it is; the experiment's mesh must be
    that one (a 4-axis ICI_MESH_SHAPE without NUM_STAGES)."""
    del dcn_mesh_shape, training_optimized
    name = "set_sharding_params_with_expert_parallelism"
    if batch_axes is not None and tuple(batch_axes) != ("replica", "data", "data_expert"):
      raise UserError(f"{name}(batch_axes={batch_axes!r}): paxlike splits the batch over "
                      "('replica', 'data', 'data_expert'); leave batch_axes None.")
    if seq_axis is not None:
      raise UserError(f"{name}(seq_axis={seq_axis!r}): paxlike does not split the sequence "
                      "over a mesh axis; leave seq_axis None.")
    _check_sharding_axes(name, ("replica", "data", "data_expert", "mdl"),
                         (replica_axis, data_axis, data_expert_axis, mdl_axis),
                         mesh_axis_names, ici_mesh_shape)
    return lm_p


def _check_sharding_axes(name: str, pax_axes: tuple[str, ...], axes: tuple[str, ...],
                         mesh_axis_names: Any, ici_mesh_shape: Any) -> None:
  """Refuses a praxis sharding call whose axes are not Pax's (a pipeline's mesh has 'stage'
  in front, as Grok_Proxy_PP's), or not the experiment's mesh (ici_mesh_shape:
  task_p.model.ici_mesh_shape, the experiment's)."""
  names = tuple(mesh_axis_names or pax_axes)
  if names not in (pax_axes, ("stage", *pax_axes)) or tuple(axes) != pax_axes:
    raise UserError(f"{name} with mesh axes {list(names)}: paxlike's meshes for it have "
                    f"Pax's axes {list(pax_axes)}.")
  if ici_mesh_shape is not None and len(ici_mesh_shape) != len(names):
    raise UserError(f"{name} shards over {len(names)} mesh axes {list(names)}, but "
                    f"the experiment's ICI_MESH_SHAPE={list(ici_mesh_shape)} has "
                    f"{len(ici_mesh_shape)}; give it {len(names)}.")
  if ici_mesh_shape is None and "data_expert" in pax_axes:
    raise UserError(f"{name} needs the experiment's 4-axis mesh [replica, data, data_expert, "
                    "mdl]; set ICI_MESH_SHAPE.")
