"""Causal multi-head dot-product attention."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from paxlike.layers.linear import Linear

Dtype = Any

# 1 / softplus(0) = 1 / ln 2: a zero per-dim-scale parameter then scales by 1/sqrt(dim) exactly.
_R_SOFTPLUS_0 = 1.0 / np.log(2.0)


def scale_query_per_dim(q: jax.Array, theta: jax.Array) -> jax.Array:
  """Pax's per-dimension query scale: q * softplus(theta) / (softplus(0) * sqrt(dim)).

  theta is a learned [dim_per_head] vector (praxis's PerDimScale, initialised
  to zeros, where it equals the plain 1/sqrt(dim) scaling); the scale is
  computed in float32 and applied in q's dtype.
  """
  dim = q.shape[-1]
  scale = (_R_SOFTPLUS_0 / np.sqrt(dim)) * jax.nn.softplus(theta.astype(jnp.float32))
  return q * scale.astype(q.dtype)


def causal_mask(q_len: int, k_len: int) -> jax.Array:
  """True where query position i may attend key position j (j <= i)."""
  return jnp.arange(q_len)[:, None] >= jnp.arange(k_len)[None, :]


def combined_mask(q_len: int, kv_len: int, mask: jax.Array | None, is_causal: bool,
                  q_segment_ids: jax.Array | None, kv_segment_ids: jax.Array | None
                  ) -> jax.Array | None:
  """mask AND causal AND same-segment, broadcastable to [batch, heads, q_len, kv_len]."""
  if is_causal:
    causal = causal_mask(q_len, kv_len)[None, None]
    mask = causal if mask is None else mask & causal
  if q_segment_ids is not None:
    same = q_segment_ids[:, None, :, None] == kv_segment_ids[:, None, None, :]
    mask = same if mask is None else mask & same
  return mask


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                          bias: jax.Array | None = None, mask: jax.Array | None = None,
                          is_causal: bool = False, q_segment_ids: jax.Array | None = None,
                          kv_segment_ids: jax.Array | None = None, logit_cap: float = 0.0,
                          scale: float = 1.0, dropout_rate: float = 0.0,
                          dropout_rng: jax.Array | None = None) -> jax.Array:
  """The attention every paxlike model family computes, in one place.

  On GPUs (without dropout): jax.nn.dot_product_attention with
  implementation=None, so JAX's own choice of kernel applies there. On JAX
  0.10 that choice is still its XLA path; cuDNN's fused kernel needs an
  explicit implementation="cudnn", which fails for float32 inputs and would
  tie an exported multi-platform program to CUDA, so it is left to JAX.

  Everywhere else (CPUs, TPUs), and with dropout anywhere: two einsums, the
  plain-JAX references' math (benchmarks/reference_lm.py, reference_t5.py).
  q is scaled before the logit matmul (a [b, t, n, h] multiply, none when
  scale is 1), the logits leave the matmul in float32, the bias is added,
  masked keys get -0.7 * float32 max (jax.nn's value), softmax runs in
  float32 and the probabilities weight v in v's dtype. jax.nn's XLA path
  vmaps the core over head groups, so logits and masks carry a
  [b, n, t, 1, s]-style group axis that XLA relayouts with copies/transposes
  of whole logit tensors, and it scales the float32 logits (and their
  gradient) after the matmul. Measured on a 2-core CPU with
  `python -m benchmarks.train_step` (float32; medians of 6-9 interleaved
  runs, paxlike / reference step time), jax.nn's path -> this one:
  LmCloudSpmdTiny at MODEL_DIMS=128, 4 layers, length 128: 1.088 -> 1.019
  (the LM's own einsums before this function existed: 1.015 on the same
  machine); FlanT5Tiny: 1.105 -> 1.037; FlanT5Tiny at MODEL_DIMS=128,
  HIDDEN_DIMS=256, DIMS_PER_HEAD=32, lengths 64/32: 1.099 -> 1.014. The
  optimized HLOs then hold no more copies or transposes than the
  references'; the ops left over come from the train step's non-finite
  check (paxlike.steps).

  Dropout on the attention probabilities (T5 while training) needs the
  probabilities, which jax.nn.dot_product_attention never exposes: the einsum
  path drops them (scaling the kept ones by 1 / (1 - rate)) before they
  weight the values.

  Args:
    q: [batch, q_len, heads, dim]; k, v: [batch, kv_len, heads, dim].
    bias: added to the logits, broadcastable to [batch, heads, q_len, kv_len]
      (T5's relative position bias).
    mask: bool, True where a query may attend a key; same broadcasting.
    is_causal: query i attends key j only when j <= i (queries and keys aligned at
      position 0); no [t, s] mask needs to be passed.
    q_segment_ids, kv_segment_ids: int [batch, q_len] / [batch, kv_len]; a query
      attends only keys of its own segment (packed rows). Both or neither.
    logit_cap: > 0 caps the logits as cap * tanh(logits / cap) after the bias
      (Pax's ATTEN_LOGIT_CAP); 0 or less: no cap.
    scale: multiplies the logits (1/sqrt(dim) for the LM; T5 uses 1.0).
    dropout_rate: the probability of dropping an attention probability.
    dropout_rng: the key dropout draws with; None (eval, decode) drops nothing.

  Returns:
    [batch, q_len, heads, dim] in q's dtype.
  """
  if (q_segment_ids is None) != (kv_segment_ids is None):
    raise ValueError("give both q_segment_ids and kv_segment_ids, or neither")
  dropout = dropout_rng is not None and dropout_rate > 0.0
  if not dropout and logit_cap <= 0.0 and jax.default_backend() == "gpu":
    mask = combined_mask(q.shape[1], k.shape[1], mask, is_causal, q_segment_ids, kv_segment_ids)
    if bias is not None:
      bias = bias.astype(q.dtype)
    return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale,
                                        implementation=None)
  mask = combined_mask(q.shape[1], k.shape[1], mask, is_causal, q_segment_ids, kv_segment_ids)
  if scale != 1.0:
    q = q * jnp.asarray(scale, q.dtype)
  logits = jnp.einsum("btnh,bsnh->bnts", q, k, preferred_element_type=jnp.float32)
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  if logit_cap > 0.0:
    logits = logit_cap * jnp.tanh(logits / logit_cap)
  if mask is not None:
    logits = jnp.where(mask, logits, -0.7 * jnp.finfo(jnp.float32).max)
  probs = jax.nn.softmax(logits, axis=-1)
  if dropout:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
    probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
  return jnp.einsum("bnts,bsnh->btnh", probs.astype(v.dtype), v)


class DotProductAttention(nn.Module):
  """Multi-head causal self-attention; combine_qkv fuses the three projections.

  per_dim_scale (Pax's default, praxis's internal_enable_per_dim_scale) scales
  the query by a learned [dim_per_head] vector (see scale_query_per_dim); off, by
  1/sqrt(dim_per_head). use_bias adds biases to the q/k/v and output projections (Pax's USE_BIAS);
  logit_cap > 0 caps the attention logits as cap * tanh(logits / cap) (Pax's
  ATTEN_LOGIT_CAP); dropout_rate drops attention probabilities while
  training. segment_ids [batch, length] (packed rows) keep each query to the
  keys of its own segment.

  cache_mode drives decoding (paxlike.decoding): "prefill" runs the whole
  input and stores its keys/values in the 'cache' collection; "extend" takes
  one new position at `index`, writes its key/value there and attends to
  every cached position up to it, so a new token costs one step instead of
  a re-run of the prefix. None (training, eval) keeps no cache.
  """

  num_heads: int
  dim_per_head: int
  combine_qkv: bool = False
  dtype: Dtype = jnp.float32
  cache_mode: str | None = None
  use_bias: bool = False
  logit_cap: float = 0.0
  dropout_rate: float = 0.0
  per_dim_scale: bool = True

  @nn.compact
  def __call__(self, x: jax.Array, index: jax.Array | None = None,
               segment_ids: jax.Array | None = None) -> jax.Array:
    n, h, b = self.num_heads, self.dim_per_head, self.use_bias
    if self.combine_qkv:
      qkv = Linear((3, n, h), ("embed", "qkv", "heads", "kv"), self.dtype, b, name="qkv")(x)
      q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    else:
      q = Linear((n, h), ("embed", "heads", "kv"), self.dtype, b, name="query")(x)
      k = Linear((n, h), ("embed", "heads", "kv"), self.dtype, b, name="key")(x)
      v = Linear((n, h), ("embed", "heads", "kv"), self.dtype, b, name="value")(x)
    scale = h ** -0.5
    if self.per_dim_scale:
      q = scale_query_per_dim(q, self.param("per_dim_scale", nn.with_logical_partitioning(
          nn.initializers.zeros, ("kv",)), (h,), jnp.float32))
      scale = 1.0
    mask = None
    if self.cache_mode is not None:
      k, v, mask = self._use_cache(k, v, index)
      segment_ids = None  # decoding runs one sequence per row
    rng = None
    if self.dropout_rate > 0.0 and self.has_rng("dropout"):
      rng = self.make_rng("dropout")
    # Training, eval and prefill are causal over aligned positions; an extend's
    # mask says which cached positions exist.
    context = dot_product_attention(q, k, v, mask=mask, is_causal=mask is None,
                                    q_segment_ids=segment_ids, kv_segment_ids=segment_ids,
                                    logit_cap=self.logit_cap, scale=scale,
                                    dropout_rate=self.dropout_rate, dropout_rng=rng)
    context = nn.with_logical_constraint(context, ("batch", "length", "activation_heads", "kv"))
    context = checkpoint_name(context, "context")
    out = jax.lax.dot_general(
        context, self.param("post", nn.with_logical_partitioning(
            nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal",
                                             in_axis=(0, 1), out_axis=2),
            ("heads", "kv", "embed")), (n, h, x.shape[-1]), jnp.float32).astype(self.dtype),
        (((2, 3), (0, 1)), ((), ())))
    if b:
      out = out + self.param("post_bias", nn.with_logical_partitioning(
          nn.initializers.zeros, ("embed",)), (x.shape[-1],), jnp.float32).astype(self.dtype)
    return checkpoint_name(out, "out_proj")

  def _use_cache(self, k: jax.Array, v: jax.Array, index: jax.Array | None):
    """prefill: stores k, v (mask None: causal). extend: writes them at index; returns
    the whole cache and the mask of the positions written so far."""
    cached_k = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
    cached_v = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
    if self.cache_mode == "prefill":
      cached_k.value, cached_v.value = k, v
      return k, v, None
    cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k, (0, index, 0, 0))
    cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v, (0, index, 0, 0))
    max_len = cached_k.value.shape[1]
    mask = (jnp.arange(max_len)[None, :] <= (index + jnp.arange(k.shape[1]))[:, None])[None, None]
    return cached_k.value, cached_v.value, mask
