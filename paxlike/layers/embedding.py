"""Token embedding shared with the softmax, and sinusoidal positions."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Dtype = Any


def sinusoidal_position_embedding(length: int, dims: int, max_timescale: float = 1.0e4,
                                  offset: int | jax.Array = 0) -> jax.Array:
  """[length, dims] sin/cos position embedding (float32), positions offset.. ."""
  pos = jnp.arange(length, dtype=jnp.float32) + offset
  num_timescales = dims // 2
  log_inc = np.log(max_timescale) / max(num_timescales - 1, 1)
  inv = jnp.exp(jnp.arange(num_timescales, dtype=jnp.float32) * -log_inc)
  scaled = pos[:, None] * inv[None, :]
  emb = jnp.concatenate([jnp.sin(scaled), jnp.cos(scaled)], axis=1)
  if dims % 2:
    emb = jnp.pad(emb, ((0, 0), (0, 1)))
  return emb


class SharedEmbeddingSoftmax(nn.Module):
  """One [vocab, embed] table: embeds ids (scaled by sqrt(embed)) and scores logits."""

  vocab_size: int
  dims: int
  dtype: Dtype = jnp.float32

  def setup(self) -> None:
    self.table = self.param(
        "embedding", nn.with_logical_partitioning(
            nn.initializers.normal(stddev=self.dims ** -0.5), ("vocab", "embed")),
        (self.vocab_size, self.dims), jnp.float32)

  def embed(self, ids: jax.Array) -> jax.Array:
    x = jnp.take(self.table, ids, axis=0).astype(self.dtype)
    return x * jnp.asarray(self.dims ** 0.5, self.dtype)

  def logits(self, x: jax.Array) -> jax.Array:
    return jnp.einsum("btd,vd->btv", x.astype(self.dtype), self.table.astype(self.dtype))
