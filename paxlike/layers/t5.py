"""T5's layers: RMS norm, relative position bias, attention without logit scale, FFNs.

Parameters are float32 and carry logical axis names; the computation runs
in `dtype`. The names are T5X's (`query`/`key`/`value`/`out`, `wi_0`/`wi_1`/`wo`,
`rel_embedding`, `scale`), so the HF importer (paxlike.interop.hf) and the
hand-written benchmark reference map onto them one to one.

Initialisers follow T5X: every kernel is variance-scaled over its fan-in
(normal for attention, truncated normal for the FFN and the logits); the
query kernel is additionally divided by sqrt(dim_per_head), which stands in
for the 1/sqrt(dim_per_head) logit scale T5 leaves out, so its stddev is
(model_dims * dim_per_head) ** -0.5. The token embedding is N(0, 1) and the
relative position table variance-scaled over fan_avg (uniform).

Dropout sits where T5 puts it: after the input embedding, on the attention
probabilities, inside the FFN after the activation (gating), on every
sublayer output before the residual add, and after each stack's final norm.
It is active only when the caller passes a 'dropout' rng (and the rate is
above 0); without one every layer is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from paxlike.errors import UserError
from paxlike.layers.attention import (
  cached_attention,
  dot_product_attention,
  tile_slots,
  to_cache_layout,
  use_kv_cache,
)
from paxlike.layers.linear import dropout_active, lora_output, lora_targets, project
from paxlike.layers.norms import RmsNorm

Dtype = Any

FFN_ACTIVATIONS = ("gated-gelu", "relu")

# Attention modes of one decoder layer (see T5Attention).
FULL, PREFILL, EXTEND = "full", "prefill", "extend"


# ------------------------------------------------------------------ helpers


def _kernel_init(fan_in_axes: Sequence[int], out_axes: Sequence[int], distribution: str,
                 extra_scale: float = 1.0):
  """variance_scaling(1, fan_in) over multi-dim kernels, times extra_scale."""
  base = nn.initializers.variance_scaling(1.0, "fan_in", distribution,
                                          in_axis=tuple(fan_in_axes), out_axis=tuple(out_axes))
  if extra_scale == 1.0:
    return base

  def init(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
    return base(key, shape, dtype) * jnp.asarray(extra_scale, dtype)

  return init


class DenseGeneral(nn.Module):
  """x's last `in_dims` axes contracted with a `kernel` of shape (*in, *features).

  Attributes:
    features: output dims.
    axes: logical names of the kernel's dims, input dims first.
    in_dims: how many trailing axes of x are contracted.
    init_scale: multiplies the variance-scaled initial kernel (the query's
      1/sqrt(dim_per_head)).
    distribution: the initialiser's distribution ('normal', 'truncated_normal').
  """

  features: Sequence[int]
  axes: Sequence[str]
  in_dims: int = 1
  init_scale: float = 1.0
  distribution: str = "normal"
  dtype: Dtype = jnp.float32
  lora_rank: int = 0  # a LoRA adapter (paxlike.layers.linear.lora_output); 0: none

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    features = tuple(self.features)
    in_shape = x.shape[x.ndim - self.in_dims:]
    n_in = len(in_shape)
    init = _kernel_init(range(n_in), range(n_in, n_in + len(features)), self.distribution,
                        self.init_scale)
    kernel = self.param("kernel", nn.with_logical_partitioning(init, tuple(self.axes)),
                        (*in_shape, *features), jnp.float32)
    y = project(x.astype(self.dtype), kernel.astype(self.dtype), n_in)
    adapted = lora_output(self, x, kernel.shape, n_in, self.lora_rank, self.dtype)
    return y if adapted is None else y + adapted


class Embed(nn.Module):
  """The [vocab, embed] token table (`embedding`), shared by encoder, decoder and a tied head."""

  vocab_size: int
  dims: int
  dtype: Dtype = jnp.float32

  def setup(self) -> None:
    self.embedding = self.param(
        "embedding", nn.with_logical_partitioning(nn.initializers.normal(stddev=1.0),
                                                  ("vocab", "embed")),
        (self.vocab_size, self.dims), jnp.float32)

  def __call__(self, ids: jax.Array) -> jax.Array:
    # T5 does not scale the embedding (the LM's sqrt(d) does not apply).
    return jnp.take(self.embedding, ids, axis=0).astype(self.dtype)

  def attend(self, x: jax.Array) -> jax.Array:
    """Tied logits: x @ embedding.T (the caller applies T5's d**-0.5)."""
    return jnp.einsum("btd,vd->btv", x.astype(self.dtype), self.embedding.astype(self.dtype))


# -------------------------------------------------------- relative positions


# ----------------------------------------------------------------- attention


def attend(module: nn.Module, q: jax.Array, k: jax.Array, v: jax.Array, bias: jax.Array | None,
           mask: jax.Array | None, dropout_rate: float, is_causal: bool = False) -> jax.Array:
  """T5 attention of q [b, t, n, h] over k, v [b, s, n, h]: no logit scale.

  paxlike.layers.attention.dot_product_attention, the one attention function
  of every family; it drops attention probabilities while training with
  dropout.
  """
  rng = module.make_rng("dropout") if dropout_active(module, dropout_rate) else None
  return dot_product_attention(q, k, v, bias=bias, mask=mask, is_causal=is_causal, scale=1.0,
                               dropout_rate=dropout_rate, dropout_rng=rng)


class T5Attention(nn.Module):
  """Multi-head attention with kernels query/key/value [d, n, h] and out [n, h, d].

  heads x dim_per_head may differ from model_dims (flan-t5-small: 6 x 64 vs 512).

  Modes (a decoder layer's cache protocol; the encoder only uses FULL):
    FULL     queries from x, keys/values from kv (x itself for self-attention).
    PREFILL  fills the 'cache' collection and returns nothing: cross-attention
             projects kv (the encoder output) once into `cached_key` /
             `cached_value`; self-attention makes zero caches of cache_len
             positions.
    EXTEND   x holds one position; self-attention writes its key/value at
             `index` and attends the whole cache (the mask says which slots
             count); cross-attention attends the cached encoder keys/values.

  Attributes:
    num_heads, dim_per_head: the attention shape.
    cross: keys/values come from the encoder (cached once in PREFILL).
    dropout_rate: on the attention probabilities.
    causal: in FULL mode a query attends only keys at or before its position, besides
      what the mask says (the decoder's self-attention); cuDNN skips the rest.
    lora_rank: LoRA adapters on query, key, value and out (0: none).
  """

  num_heads: int
  dim_per_head: int
  cross: bool = False
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  lora_rank: int = 0
  causal: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, kv: jax.Array | None = None, *, bias: jax.Array | None = None,
               mask: jax.Array | None = None, mode: str = FULL, index: jax.Array | None = None,
               cache_len: int = 0) -> jax.Array | None:
    n, h = self.num_heads, self.dim_per_head
    d = x.shape[-1]
    proj = dict(features=(n, h), axes=("embed", "heads", "kv"), dtype=self.dtype,
                lora_rank=self.lora_rank)
    query = DenseGeneral(**proj, init_scale=h ** -0.5, name="query")
    key = DenseGeneral(**proj, name="key")
    value = DenseGeneral(**proj, name="value")
    constrain = lambda t: nn.with_logical_constraint(
        t, ("batch", "length", "activation_heads", "kv"))

    # Caches are per example (attention.use_kv_cache): the encoder's keys/values as
    # [batch, heads, length, dim], self-attention's in one slot per beam.
    if mode == PREFILL:
      if self.cross:
        shape = (kv.shape[0], n, kv.shape[1], h)
        cached_k = self.variable("cache", "cached_key", jnp.zeros, shape, self.dtype)
        cached_v = self.variable("cache", "cached_value", jnp.zeros, shape, self.dtype)
        cache = lambda t: nn.with_logical_constraint(
            to_cache_layout(constrain(t)), ("batch", "activation_heads", "length", "kv"))
        cached_k.value, cached_v.value = cache(key(kv)), cache(value(kv))
      else:
        zeros = jnp.zeros((x.shape[0], cache_len, n, h), self.dtype)
        use_kv_cache(self, zeros, zeros, PREFILL)
      return None

    # The projections carry Pax's names, which CHECKPOINT_POLICY=SAVE_QKV_OUT_PROJ saves.
    q = checkpoint_name(constrain(query(x)), "query_proj")
    if mode == EXTEND:
      if self.cross:
        k = self.variable("cache", "cached_key", jnp.zeros, (0,), self.dtype).value
        v = self.variable("cache", "cached_value", jnp.zeros, (0,), self.dtype).value
      else:  # bias and mask [batch, ., 1, length] hold for every slot
        k, v, written = use_kv_cache(self, key(x), value(x), EXTEND, index)
        bias, mask = tile_slots(bias, k), written & tile_slots(mask, k)
      # A row's beams attend their example's keys as its queries.
      context = cached_attention(q, k.astype(self.dtype), v.astype(self.dtype), bias=bias,
                                 mask=mask)
    else:
      source = x if kv is None else kv
      k = checkpoint_name(constrain(key(source)), "key_proj")
      v = checkpoint_name(constrain(value(source)), "value_proj")
      context = attend(self, q, k, v, bias, mask, self.dropout_rate, is_causal=self.causal)
    context = checkpoint_name(constrain(context), "context")
    out = DenseGeneral((d,), ("heads", "kv", "embed"), in_dims=2, dtype=self.dtype,
                       lora_rank=self.lora_rank, name="out")(context)
    return checkpoint_name(out, "out_proj")


# ------------------------------------------------------------- feed-forward


class T5FeedForward(nn.Module):
  """gated-gelu: wo(gelu_tanh(wi_0(x)) * wi_1(x)); relu: wo(relu(wi(x))). No biases.

  Dropout after the activation (the gating), before `wo`.
  """

  hidden_dims: int
  activation: str = "gated-gelu"
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  lora_rank: int = 0  # LoRA adapters on wi_0, wi_1 (or wi) and wo; 0: none

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    d = x.shape[-1]
    dense = dict(features=(self.hidden_dims,), axes=("embed", "mlp"),
                 distribution="truncated_normal", dtype=self.dtype, lora_rank=self.lora_rank)
    if self.activation == "gated-gelu":
      gate = jax.nn.gelu(DenseGeneral(**dense, name="wi_0")(x), approximate=True)
      h = gate * DenseGeneral(**dense, name="wi_1")(x)
    elif self.activation == "relu":
      h = jax.nn.relu(DenseGeneral(**dense, name="wi")(x))
    else:
      raise UserError(f"ACTIVATION={self.activation!r} is not one of {FFN_ACTIVATIONS}.")
    h = nn.with_logical_constraint(h, ("batch", "length", "activation_mlp"))
    h = checkpoint_name(h, "ffn1")
    h = nn.Dropout(self.dropout_rate)(h, deterministic=not dropout_active(self, self.dropout_rate))
    y = DenseGeneral((d,), ("mlp", "embed"), distribution="truncated_normal", dtype=self.dtype,
                     lora_rank=self.lora_rank, name="wo")(h)
    return checkpoint_name(y, "ffn2")


# ------------------------------------------------------------------- layers


class T5LayerConfig(nn.Module):
  """Fields every T5 layer shares (a base class, not a layer of its own)."""

  num_heads: int
  dim_per_head: int
  hidden_dims: int
  activation: str = "gated-gelu"
  layer_norm_epsilon: float = 1e-6
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  lora_rank: int = 0  # Pax's LORA_RANK / LORA_TARGET_LAYERS (USE_LORA)
  lora_target_layers: str = "all"

  def residual(self, x: jax.Array, y: jax.Array) -> jax.Array:
    """x + dropout(y), constrained like the residual stream."""
    y = nn.Dropout(self.dropout_rate)(
        y, deterministic=not dropout_active(self, self.dropout_rate))
    return nn.with_logical_constraint(x + y, ("batch", "length", "activation_embed"))

  def norm(self, name: str) -> RmsNorm:
    return RmsNorm(self.layer_norm_epsilon, self.dtype, scale_in_float32=True, name=name)

  def attention(self, name: str, cross: bool = False, causal: bool = False) -> T5Attention:
    return T5Attention(self.num_heads, self.dim_per_head, cross, self.dropout_rate, self.dtype,
                       lora_targets(self.lora_rank, self.lora_target_layers)[0], causal,
                       name=name)

  def mlp(self, x: jax.Array) -> jax.Array:
    h = self.norm("pre_mlp_layer_norm")(x)
    h = T5FeedForward(self.hidden_dims, self.activation, self.dropout_rate, self.dtype,
                      lora_targets(self.lora_rank, self.lora_target_layers)[1], name="mlp")(h)
    return self.residual(x, h)


class T5EncoderLayer(T5LayerConfig):
  """x + attention(norm(x)), then x + mlp(norm(x)); scan-compatible (carry, inputs)."""

  @nn.compact
  def __call__(self, x: jax.Array, inputs: dict[str, jax.Array]) -> tuple[jax.Array, None]:
    """inputs: `bias` [b|1, n, s, s] and `mask` [b, 1, s|1, s] (shared by every layer)."""
    h = self.norm("pre_attention_layer_norm")(x)
    h = self.attention("attention")(h, bias=inputs["bias"], mask=inputs["mask"])
    x = self.residual(x, h)
    return self.mlp(x), None


class T5DecoderLayer(T5LayerConfig):
  """Self-attention, cross-attention, mlp; pre-norm residual blocks.

  `mode` (FULL, PREFILL, EXTEND) is T5Attention's; PREFILL only fills the
  caches and passes x through.
  """

  mode: str = FULL
  cache_len: int = 0

  @nn.compact
  def __call__(self, x: jax.Array, inputs: dict[str, Any]) -> tuple[jax.Array, None]:
    """inputs: `self_bias`, `self_mask`, `cross_mask`, `encoded` (FULL and PREFILL) and
    `index` (EXTEND), shared by every layer. In FULL mode self-attention is causal
    besides `self_mask` (None: causal alone)."""
    self_attention = self.attention("self_attention", causal=True)
    cross_attention = self.attention("encoder_decoder_attention", cross=True)
    if self.mode == PREFILL:
      self_attention(x, mode=PREFILL, cache_len=self.cache_len)
      cross_attention(x, inputs["encoded"], mode=PREFILL)
      return x, None
    index = inputs.get("index")
    h = self.norm("pre_self_attention_layer_norm")(x)
    h = self_attention(h, bias=inputs["self_bias"], mask=inputs["self_mask"], mode=self.mode,
                       index=index)
    x = self.residual(x, h)
    h = self.norm("pre_cross_attention_layer_norm")(x)
    h = cross_attention(h, inputs.get("encoded"), mask=inputs["cross_mask"], mode=self.mode,
                        index=index)
    x = self.residual(x, h)
    return self.mlp(x), None
