"""Causal multi-head dot-product attention."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from paxlike.layers.linear import Linear

Dtype = Any


def causal_mask(q_len: int, k_len: int) -> jax.Array:
  """True where query position i may attend key position j (j <= i)."""
  return jnp.arange(q_len)[:, None] >= jnp.arange(k_len)[None, :]


class DotProductAttention(nn.Module):
  """Multi-head self-attention; combine_qkv fuses the three projections.

  With decode=True the layer keeps a key/value cache in the 'cache'
  collection: the init call (a full-length input) sizes it, and each later
  call with one new position attends to everything cached so far, so a new
  token costs one step instead of a re-run of the prefix.
  """

  num_heads: int
  dim_per_head: int
  combine_qkv: bool = False
  dtype: Dtype = jnp.float32
  decode: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    n, h = self.num_heads, self.dim_per_head
    if self.combine_qkv:
      qkv = Linear((3, n, h), ("embed", "qkv", "heads", "kv"), self.dtype, name="qkv")(x)
      q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    else:
      q = Linear((n, h), ("embed", "heads", "kv"), self.dtype, name="query")(x)
      k = Linear((n, h), ("embed", "heads", "kv"), self.dtype, name="key")(x)
      v = Linear((n, h), ("embed", "heads", "kv"), self.dtype, name="value")(x)
    q = q * jnp.asarray(h ** -0.5, self.dtype)
    t = x.shape[1]
    mask = causal_mask(t, t)
    if self.decode:
      k, v, mask = self._update_cache(k, v, mask)
    logits = jnp.einsum("btnh,bsnh->bnts", q, k).astype(jnp.float32)
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
    context = jnp.einsum("bnts,bsnh->btnh", probs, v)
    context = nn.with_logical_constraint(context, ("batch", "length", "activation_heads", "kv"))
    context = checkpoint_name(context, "context")
    out = jax.lax.dot_general(
        context, self.param("post", nn.with_logical_partitioning(
            nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal",
                                             in_axis=(0, 1), out_axis=2),
            ("heads", "kv", "embed")), (n, h, x.shape[-1]), jnp.float32).astype(self.dtype),
        (((2, 3), (0, 1)), ((), ())))
    return checkpoint_name(out, "out_proj")

  def _update_cache(self, k: jax.Array, v: jax.Array, mask: jax.Array):
    """Writes this step's keys/values at the cache index; returns the whole cache."""
    initialized = self.has_variable("cache", "cached_key")
    cached_k = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
    cached_v = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
    if not initialized:  # the sizing call: plain causal attention over the full input
      return k, v, mask
    i = index.value
    cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k, (0, i, 0, 0))
    cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v, (0, i, 0, 0))
    index.value = i + k.shape[1]
    max_len = cached_k.value.shape[1]
    mask = jnp.arange(max_len)[None, :] <= (i + jnp.arange(k.shape[1]))[:, None]
    return cached_k.value, cached_v.value, mask
