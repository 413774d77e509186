"""Token embedding (shared with the softmax or separate), and position embeddings."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from paxlike.errors import UserError

Dtype = Any

LOOKUP_STYLES = ("index", "matmul")


def sinusoidal_position_embedding(length: int, dims: int, max_timescale: float = 1.0e4,
                                  offset: int | jax.Array = 0) -> jax.Array:
  """[length, dims] sin/cos position embedding (float32), positions offset.. ."""
  return sinusoidal_at(jnp.arange(length) + offset, dims, max_timescale)


def sinusoidal_at(positions: jax.Array, dims: int, max_timescale: float = 1.0e4) -> jax.Array:
  """[..., dims] sin/cos embedding (float32) of integer positions of any shape."""
  pos = jnp.asarray(positions, jnp.float32)
  num_timescales = dims // 2
  log_inc = np.log(max_timescale) / max(num_timescales - 1, 1)
  inv = jnp.exp(jnp.arange(num_timescales, dtype=jnp.float32) * -log_inc)
  scaled = pos[..., None] * inv
  emb = jnp.concatenate([jnp.sin(scaled), jnp.cos(scaled)], axis=-1)
  if dims % 2:
    emb = jnp.pad(emb, [(0, 0)] * (emb.ndim - 1) + [(0, 1)])
  return emb


def padded_vocab(vocab_size: int, multiple: int) -> int:
  """vocab_size rounded up to a multiple of `multiple` (the 'mdl' axis the table is split over).

  A device mesh shards parameters only in equal parts, so a vocabulary that the
  'mdl' axis does not divide (GPT-3's over 24 ways) gets zero-initialised rows
  that no id selects and whose logits are cut off before the softmax.
  """
  multiple = max(int(multiple), 1)
  return -(-vocab_size // multiple) * multiple


def lookup(table: jax.Array, ids: jax.Array, style: str, dtype: Dtype) -> jax.Array:
  """table[ids] in dtype, by gather ('index') or one-hot matmul ('matmul', Pax's option)."""
  if style == "index":
    return jnp.take(table, ids, axis=0).astype(dtype)
  if style == "matmul":
    one_hot = jax.nn.one_hot(ids, table.shape[0], dtype=dtype)
    return jnp.einsum("...v,vd->...d", one_hot, table.astype(dtype))
  raise UserError(f"EMBEDDING_LOOKUP_STYLE={style!r} is not one of {list(LOOKUP_STYLES)}.")


def soft_cap(logits: jax.Array, cap: float) -> jax.Array:
  """cap * tanh(logits / cap) for cap > 0 (Pax's logit caps); unchanged otherwise."""
  if cap and cap > 0.0:
    return cap * jnp.tanh(logits / cap)
  return logits


def _table(module: nn.Module, name: str, rows: int, real_rows: int, dims: int,
           stddev: float | None = None) -> jax.Array:
  """A [rows, dims] N(0, stddev^2) table (default 1/dims) whose rows past real_rows
  (padding) start at zero."""

  def init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
    table = nn.initializers.normal(stddev=dims ** -0.5 if stddev is None else stddev)(
        key, shape, dtype)
    return table.at[real_rows:].set(0.0) if rows > real_rows else table

  return module.param(name, nn.with_logical_partitioning(init, ("vocab", "table_embed")),
                      (rows, dims), jnp.float32)


class SharedEmbeddingSoftmax(nn.Module):
  """One [vocab, embed] table: embeds ids (scaled by sqrt(embed)) and scores logits.

  padded_rows > vocab_size pads the table (see padded_vocab); logits cover
  the real vocabulary only. use_bias (Pax's default: praxis's softmax is a
  feed-forward layer with has_bias) adds a learned [vocab] bias, zeros at
  init, to the logits. soft_cap_logits > 0 then caps them as
  cap * tanh(logits / cap) (Pax's SOFTMAX_CAP_LOGITS).

  gshard (praxis's GShardSharedEmbeddingSoftmax): the table starts N(0, 1) and the
  logits are scored from the activations scaled by 1/sqrt(embed).
  """

  vocab_size: int
  dims: int
  dtype: Dtype = jnp.float32
  padded_rows: int = 0  # 0: vocab_size
  lookup_style: str = "index"
  soft_cap_logits: float = 0.0
  use_bias: bool = True
  scale_sqrt_depth: bool = True  # praxis's: embedded rows x sqrt(embed) (off in Pax's GPT-3)
  gshard: bool = False

  def setup(self) -> None:
    rows = max(self.padded_rows, self.vocab_size)
    self.table = _table(self, "embedding", rows, self.vocab_size, self.dims,
                        stddev=1.0 if self.gshard else None)
    if self.use_bias:  # padded like the table, so it shards over 'mdl' the same way
      self.bias = self.param("bias", nn.with_logical_partitioning(
          nn.initializers.zeros, ("vocab",)), (rows,), jnp.float32)

  def embed(self, ids: jax.Array) -> jax.Array:
    x = lookup(self.table, ids, self.lookup_style, self.dtype)
    return x * jnp.asarray(self.dims ** 0.5, self.dtype) if self.scale_sqrt_depth else x

  def logits(self, x: jax.Array) -> jax.Array:
    x = x.astype(self.dtype)
    if self.gshard:
      x = x * jnp.asarray(self.dims ** -0.5, self.dtype)
    logits = jnp.einsum("btd,vd->btv", x, self.table.astype(self.dtype))
    if logits.shape[-1] > self.vocab_size:
      logits = logits[..., :self.vocab_size]
    if self.use_bias:
      logits = logits + self.bias[:self.vocab_size].astype(self.dtype)
    return soft_cap(logits, self.soft_cap_logits)


class Embedding(nn.Module):
  """A separate input embedding (Pax's SEPARATE_EMBEDDING): ids -> rows x sqrt(embed)."""

  vocab_size: int
  dims: int
  dtype: Dtype = jnp.float32
  padded_rows: int = 0
  lookup_style: str = "index"
  scale_sqrt_depth: bool = True

  @nn.compact
  def __call__(self, ids: jax.Array) -> jax.Array:
    table = _table(self, "embedding", max(self.padded_rows, self.vocab_size), self.vocab_size,
                   self.dims)
    x = lookup(table, ids, self.lookup_style, self.dtype)
    return x * jnp.asarray(self.dims ** 0.5, self.dtype) if self.scale_sqrt_depth else x


class TrainablePositionalEmbedding(nn.Module):
  """A learned [max_seq_len, embed] position table (Pax's TRAINABLE_POSITION_EMB)."""

  max_seq_len: int
  dims: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, positions: jax.Array) -> jax.Array:
    table = self.param("embedding", nn.with_logical_partitioning(
        nn.initializers.normal(stddev=self.dims ** -0.5), (None, "table_embed")),
        (self.max_seq_len, self.dims), jnp.float32)
    return jnp.take(table, positions, axis=0).astype(self.dtype)
