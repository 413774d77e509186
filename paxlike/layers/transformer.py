"""Pre-norm Transformer layer and the stack (scanned when repeated)."""

from __future__ import annotations

import enum
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from paxlike.errors import UserError
from paxlike.layers import pipeline
from paxlike.layers.attention import DotProductAttention
from paxlike.layers.linear import FeedForward, LayerNorm, dropout_active, lora_targets
from paxlike.layers.moe import MoeFeedForward, no_routing
from paxlike.layers.norms import RmsNorm

Dtype = Any

# Pax's remat policy names -> jax.checkpoint policies. None means "no remat".
CHECKPOINT_POLICIES: dict[str, Any] = {
    "SAVE_NOTHING": jax.checkpoint_policies.nothing_saveable,
    "SAVE_EVERYTHING": None,
    "SAVE_DOT_WITH_NO_BATCH_DIM": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "SAVE_DOT_FOR_MLPERF_200B": jax.checkpoint_policies.save_only_these_names(
        "ffn1", "context", "out_proj"),
    "SAVE_CONTEXT_AND_OUT_PROJ": jax.checkpoint_policies.save_only_these_names(
        "context", "out_proj"),
    "SAVE_CONTEXT": jax.checkpoint_policies.save_only_these_names("context"),
    "SAVE_OUT_PROJ": jax.checkpoint_policies.save_only_these_names("out_proj"),
    "SAVE_QKV_OUT_PROJ": jax.checkpoint_policies.save_only_these_names(
        "query_proj", "key_proj", "value_proj", "combined_qkv_proj", "out_proj"),
    "SAVE_DOT_ONLY": jax.checkpoint_policies.checkpoint_dots,
}


class AutodiffCheckpointType(enum.Enum):
  """Pax's remat policy enum (`layers.AutodiffCheckpointType.SAVE_NOTHING`); the
  string names above work too."""

  SAVE_NOTHING = "SAVE_NOTHING"
  SAVE_EVERYTHING = "SAVE_EVERYTHING"
  SAVE_DOT_WITH_NO_BATCH_DIM = "SAVE_DOT_WITH_NO_BATCH_DIM"
  SAVE_DOT_FOR_MLPERF_200B = "SAVE_DOT_FOR_MLPERF_200B"
  SAVE_CONTEXT_AND_OUT_PROJ = "SAVE_CONTEXT_AND_OUT_PROJ"
  SAVE_CONTEXT = "SAVE_CONTEXT"
  SAVE_OUT_PROJ = "SAVE_OUT_PROJ"
  SAVE_QKV_OUT_PROJ = "SAVE_QKV_OUT_PROJ"
  SAVE_DOT_ONLY = "SAVE_DOT_ONLY"


def policy_name(value: Any) -> str:
  """The policy's name for an AutodiffCheckpointType member or a string."""
  return value.name if isinstance(value, enum.Enum) else value


def rematerialises(policy: Any) -> bool:
  """Whether CHECKPOINT_POLICY `policy` (a name or an AutodiffCheckpointType member)
  rematerialises anything: every policy but SAVE_EVERYTHING."""
  return policy_name(policy) != "SAVE_EVERYTHING"


def remat_policy(name: Any) -> Any:
  name = policy_name(name)
  if name not in CHECKPOINT_POLICIES:
    raise UserError(f"CHECKPOINT_POLICY={name!r} is not one of {sorted(CHECKPOINT_POLICIES)}.")
  return CHECKPOINT_POLICIES[name]


NORM_POLICIES = ("pre", "post", "primer_hybrid")
NORM_TYPES = ("layernorm", "rmsnorm")


def make_norm(norm_type: str, epsilon: float, dtype: Dtype, name: str | None = None
              ) -> nn.Module:
  """The LM's normalisation: LayerNorm (scale and bias) or praxis's RmsNorm (scale only)."""
  if norm_type == "rmsnorm":
    return RmsNorm(epsilon, dtype, name=name)
  if norm_type != "layernorm":
    raise UserError(f"norm type {norm_type!r} is not one of {list(NORM_TYPES)}.")
  return LayerNorm(epsilon, dtype, name=name)


class TransformerLayer(nn.Module):
  """Attention then feed-forward, each a residual sublayer normalised per norm_policy.

  Pax's NORM_POLICY: 'pre' is x + f(norm(x)); 'post' is norm(x + f(x));
  'primer_hybrid' is x + norm_post(f(norm_pre(x))). dropout_rate (Pax's
  DROPOUT_PROB) drops attention probabilities, hidden FFN activations and
  each sublayer's output before the residual add, while training;
  input_dropout_rate drops the layer's input (praxis's input_dropout_prob on
  a repeated stack's one-layer block, which runs before every layer).
  """

  num_heads: int
  dim_per_head: int
  hidden_dims: int
  activation: str = "relu"
  combine_qkv: bool = False
  dtype: Dtype = jnp.float32
  cache_mode: str | None = None  # see DotProductAttention
  norm_policy: str = "pre"
  layernorm_epsilon: float = 1e-6
  use_bias: bool = False
  atten_logit_cap: float = 0.0
  use_gated_activation: bool = False
  dropout_rate: float = 0.0
  per_dim_scale: bool = True
  num_kv_heads: int | None = None  # see DotProductAttention
  rope_timescales: tuple[float, float] | None = None  # see DotProductAttention
  norm_type: str = "layernorm"  # or "rmsnorm" (praxis's RmsNorm as the layer's ln_tpl)
  ffn_has_bias: bool = True
  input_dropout_rate: float = 0.0
  # Pax's LORA_RANK / LORA_TARGET_LAYERS (USE_LORA): adapters on the attention's and/or
  # the feed-forward's projections (paxlike.layers.linear.lora_output); rank 0: none.
  lora_rank: int = 0
  lora_target_layers: str = "all"
  # Non-empty: the feed-forward is a mixture of experts, MoeFeedForward(**moe_kwargs).
  moe_kwargs: tuple[tuple[str, Any], ...] = ()
  # GLaM's attention (see DotProductAttention): no query scale, an extra softmax logit, a
  # relative position bias of (num_buckets, max_distance) per layer.
  query_scale: bool = True
  attention_extra_logit: float | None = None
  relative_bias: tuple[int, int] | None = None
  causal: bool = True  # False: every token attends to every token of its segment (BERT)
  fp8: bool = False  # Pax's USE_FP8: the attention's and the feed-forward's projections in FP8
  kv_fp8: bool | None = None  # the attention's key/value projections' own (DotProductAttention)

  def _residual(self, x: jax.Array, sublayer: Any, name: str) -> jax.Array:
    """x + sublayer(x) with this layer's norm policy; norms named pre_/post_<name>_norm."""
    if self.norm_policy not in NORM_POLICIES:
      raise UserError(f"NORM_POLICY={self.norm_policy!r} is not one of {list(NORM_POLICIES)}.")

    def norm(where: str) -> nn.Module:
      return make_norm(self.norm_type, self.layernorm_epsilon, self.dtype,
                       name=f"{where}_{name}_norm")

    h = norm("pre")(x) if self.norm_policy in ("pre", "primer_hybrid") else x
    y = sublayer(h)
    if self.norm_policy == "primer_hybrid":
      y = norm("post")(y)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=not dropout_active(self, self.dropout_rate))
    x = x + y
    if self.norm_policy == "post":
      x = norm("post")(x)
    return nn.with_logical_constraint(x, ("batch", "length", "activation_embed"))

  @nn.compact
  def __call__(self, x: jax.Array, index: jax.Array | None = None,
               segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """-> (x, the MoE feed-forward's routing record; zeros for a dense one)."""
    atten_rank, ffn_rank = lora_targets(self.lora_rank, self.lora_target_layers)
    attention = DotProductAttention(
        self.num_heads, self.dim_per_head, self.combine_qkv, self.dtype, self.cache_mode,
        use_bias=self.use_bias, logit_cap=self.atten_logit_cap, dropout_rate=self.dropout_rate,
        per_dim_scale=self.per_dim_scale, num_kv_heads=self.num_kv_heads,
        rope_timescales=self.rope_timescales, lora_rank=atten_rank,
        query_scale=self.query_scale, extra_logit=self.attention_extra_logit,
        relative_bias=self.relative_bias, causal=self.causal, fp8=self.fp8, kv_fp8=self.kv_fp8,
        name="attention")
    x = nn.Dropout(self.input_dropout_rate)(
        x, deterministic=not dropout_active(self, self.input_dropout_rate))
    x = self._residual(x, lambda h: attention(h, index, segment_ids, positions), "attn")
    if self.moe_kwargs:
      settings = {"activation": self.activation, **dict(self.moe_kwargs)}
      moe = MoeFeedForward(dtype=self.dtype, dropout_rate=self.dropout_rate,
                           decode=self.cache_mode is not None, **settings, name="moe")
      nonpadding = None if segment_ids is None else segment_ids > 0
      records = []

      def ffn(h: jax.Array) -> jax.Array:
        y, record = moe(h, nonpadding)
        records.append(record)
        return y

      x = self._residual(x, ffn, "ffn")
      return x, records[0]
    ffn = FeedForward(self.hidden_dims, self.activation, self.dtype,
                      use_gated_activation=self.use_gated_activation,
                      dropout_rate=self.dropout_rate, has_bias=self.ffn_has_bias,
                      lora_rank=ffn_rank, fp8=self.fp8, name="ffn")
    x = self._residual(x, ffn, "ffn")
    return x, no_routing()


def _added(a: dict[str, jax.Array], b: dict[str, jax.Array]) -> dict[str, jax.Array]:
  return jax.tree.map(jnp.add, a, b)


def stage_moe_layers(moe_layers: tuple[int, ...], num_layers: int, layers_per_stage: int
                     ) -> tuple[int, ...]:
  """The MoE layers of one pipeline stage of layers_per_stage layers. Every stage's layers
  are built alike, so the stack's MoE pattern must repeat with the stage (all layers, or
  every other one of an even stage)."""
  stage = tuple(sorted({i % layers_per_stage for i in moe_layers}))
  if any((i % layers_per_stage in stage) != (i in moe_layers) for i in range(num_layers)):
    raise UserError(f"moe_layers={list(moe_layers)}: the pipeline's stages run the same "
                    f"{layers_per_stage} layers each, so the mixture-of-experts layers must be "
                    "the same in every stage; list the same positions in each.")
  return stage


def moe_period(moe_layers: tuple[int, ...], num_layers: int) -> int:
  """The shortest period p (dividing num_layers) of the MoE layers' pattern: layer i is MoE
  exactly when layer i mod p is. A scanned stack scans blocks of p layers."""
  chosen = set(moe_layers)
  for p in range(1, num_layers + 1):
    if num_layers % p == 0 and all((i in chosen) == (i % p in chosen)
                                   for i in range(num_layers)):
      return p
  return num_layers


class LayerBlock(nn.Module):
  """A scanned stack's repeat unit when MoE and dense layers alternate: its layers
  `layer_j`, the j-th with a mixture-of-experts feed-forward where moe[j]."""

  layer_kwargs: tuple[tuple[str, Any], ...]
  moe: tuple[bool, ...]
  moe_kwargs: tuple[tuple[str, Any], ...]

  @nn.compact
  def __call__(self, x: jax.Array, index: jax.Array | None = None,
               segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
    total = no_routing()
    for j, is_moe in enumerate(self.moe):
      x, record = TransformerLayer(**dict(self.layer_kwargs),
                                   moe_kwargs=self.moe_kwargs if is_moe else (),
                                   name=f"layer_{j}")(x, index, segment_ids, positions)
      total = _added(total, record)
    return x, total


class StackedTransformer(nn.Module):
  """num_layers TransformerLayers; scanned over a 'layers' axis when repeated.

  layer_kwargs: further TransformerLayer fields (norm_policy, use_bias, ...),
  as a tuple of (name, value) pairs so the module stays hashable.

  num_stages (Pax's NUM_STAGES; None: no pipeline) pipelines the stack over
  the mesh's 'stage' axis (paxlike.layers.pipeline): its weights are one
  parameter `pipeline` of [circular_repeat, stages, ...] leaves, each stage's
  layers_per_stage layers scanned or unrolled by use_repeated_layer, and the
  batch runs in num_microbatches (or microbatch_size) pieces. Decoding runs
  the same weights unpipelined (paxlike.layers.pipeline.restack).

  moe_layers: the layers (0-based) whose feed-forward is a mixture of
  experts, MoeFeedForward(**moe_kwargs). When MoE and dense layers alternate
  with period p (GLaM: every other layer), a scanned stack scans blocks of p
  layers (LayerBlock, `repeat/layer_j`). In a pipeline every stage holds the
  same MoE layers (stage_moe_layers) and routes its microbatch. Calls return
  (x, the MoE layers' routing records summed: weighted load-balancing losses
  and over-capacity fractions; a pipeline's averaged over its microbatches).
  """

  num_layers: int
  num_heads: int
  dim_per_head: int
  hidden_dims: int
  activation: str = "relu"
  combine_qkv: bool = False
  use_repeated_layer: bool = True
  checkpoint_policy: str = "SAVE_NOTHING"
  dtype: Dtype = jnp.float32
  layer_kwargs: tuple[tuple[str, Any], ...] = ()
  num_stages: int | None = None
  circular_repeat: int = 1
  num_microbatches: int | None = None
  microbatch_size: int | None = None
  stream_io: bool = False
  moe_layers: tuple[int, ...] = ()
  moe_kwargs: tuple[tuple[str, Any], ...] = ()

  def layout(self) -> pipeline.Layout:
    return pipeline.Layout(self.num_layers, self.use_repeated_layer, self.num_stages,
                           self.circular_repeat)

  def _pipelined(self, x: jax.Array, segment_ids: jax.Array | None,
                 positions: jax.Array | None) -> tuple[jax.Array, dict[str, jax.Array]]:
    layout = self.layout()
    moe = stage_moe_layers(self.moe_layers, self.num_layers, layout.layers_per_stage)
    # One stage's layers, applied as a function of its weights (each layer
    # rematerialised inside the iteration's remat when the stage is scanned:
    # Layout.stage_policy).
    stage = StackedTransformer(
        num_layers=layout.layers_per_stage, num_heads=self.num_heads,
        dim_per_head=self.dim_per_head, hidden_dims=self.hidden_dims,
        activation=self.activation, combine_qkv=self.combine_qkv,
        use_repeated_layer=self.use_repeated_layer,
        checkpoint_policy=layout.stage_policy(self.checkpoint_policy),
        dtype=self.dtype, layer_kwargs=self.layer_kwargs, moe_layers=moe,
        moe_kwargs=self.moe_kwargs if moe else (), parent=None)
    kwargs = dict(self.layer_kwargs)
    rate = max(kwargs.get("dropout_rate", 0.0), kwargs.get("input_dropout_rate", 0.0))
    rng = self.make_rng("dropout") if dropout_active(self, rate) else None

    def stage_fn(w: Any, h: jax.Array, seg: Any, pos: Any, key: Any
                 ) -> tuple[jax.Array, dict[str, jax.Array]]:
      rngs = {} if key is None else {"dropout": key}
      return stage.apply({"params": w}, h, None, None, seg, pos, rngs=rngs)

    return pipeline.stacked(
        self, layout, x, init_stage=lambda k, sample: stage.init({"params": k}, sample)["params"],
        apply_stage=stage_fn, num_microbatches=self.num_microbatches,
        microbatch_size=self.microbatch_size, policy=remat_policy(self.checkpoint_policy),
        remat=rematerialises(self.checkpoint_policy),
        stream_io=self.stream_io, segment_ids=segment_ids, positions=positions, rng=rng,
        empty_record=no_routing())

  @nn.compact
  def __call__(self, x: jax.Array, cache_mode: str | None = None,
               index: jax.Array | None = None,
               segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """cache_mode None trains/evaluates; "prefill" / "extend" decode (DotProductAttention).

    positions [batch|1, length]: each token's position, for rotary attention.
    """
    if self.num_stages is not None:
      if cache_mode is not None:
        raise UserError("a pipelined stack decodes through its unpipelined model "
                        "(LanguageModel.for_decoding); it has no KV cache of its own.")
      return self._pipelined(x, segment_ids, positions)
    kwargs = dict(num_heads=self.num_heads, dim_per_head=self.dim_per_head,
                  hidden_dims=self.hidden_dims, activation=self.activation,
                  combine_qkv=self.combine_qkv, dtype=self.dtype, cache_mode=cache_mode,
                  **dict(self.layer_kwargs))
    moe = set(self.moe_layers)
    period = moe_period(self.moe_layers, self.num_layers) if moe else 1
    layer_cls, block = TransformerLayer, {}
    if period > 1 and self.use_repeated_layer:
      layer_cls = LayerBlock
      block = dict(layer_kwargs=tuple(kwargs.items()), moe=tuple(j in moe for j in range(period)),
                   moe_kwargs=self.moe_kwargs)
    if rematerialises(self.checkpoint_policy) and cache_mode is None:
      layer_cls = nn.remat(layer_cls, policy=remat_policy(self.checkpoint_policy),
                           prevent_cse=not self.use_repeated_layer)
    if self.use_repeated_layer:
      stack = nn.scan(layer_cls, variable_axes={"params": 0, "cache": 0},
                      split_rngs={"params": True, "dropout": True}, in_axes=nn.broadcast,
                      length=self.num_layers // period,
                      metadata_params={nn.PARTITION_NAME: "layers"})
      if block:
        x, records = stack(**block, name="repeat")(x, index, segment_ids, positions)
      else:
        x, records = stack(**kwargs, moe_kwargs=self.moe_kwargs if moe else (),
                           name="repeat")(x, index, segment_ids, positions)
      return x, jax.tree.map(jnp.sum, records)
    total = no_routing()
    for i in range(self.num_layers):
      x, record = layer_cls(**kwargs, moe_kwargs=self.moe_kwargs if i in moe else (),
                            name=f"x_layers_{i}")(x, index, segment_ids, positions)
      total = _added(total, record)
    return x, total
