"""T5's relative position bias: bucketed key-query distances -> a learned [buckets, heads] bias.

T5 (paxlike.layers.t5) shares one table per stack; praxis's RelativeBias
(GLaM's attention) gives every attention layer its own. The buckets are the
same: exact for small distances, log-spaced up to max_distance.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from paxlike.errors import UserError

Dtype = Any


def bucket_table(bidirectional: bool, num_buckets: int, max_distance: int) -> np.ndarray:
  """Bucket of every distance 0..max_distance for one direction (a static lookup table).

  The log-spaced part is computed here in float64 once, so a bucket boundary
  that falls exactly on an integer distance (16, 32, 64 for the defaults)
  lands where the exact formula puts it, whatever the device's float32 log.
  Distances above max_distance share the last bucket.
  """
  n = num_buckets // 2 if bidirectional else num_buckets
  max_exact = n // 2
  if max_exact < 1 or max_distance <= max_exact:
    raise UserError(f"RELATIVE_ATTENTION_NUM_BUCKETS={num_buckets} and "
                    f"RELATIVE_ATTENTION_MAX_DISTANCE={max_distance} leave no log-spaced "
                    "buckets; use at least 4 buckets and a max distance above num_buckets / 4.")
  table = []
  for dist in range(max_distance + 1):
    if dist < max_exact:
      table.append(dist)
    else:
      log_part = math.log(dist / max_exact) / math.log(max_distance / max_exact)
      table.append(min(n - 1, max_exact + int(log_part * (n - max_exact))))
  return np.asarray(table, np.int32)


def relative_position_bucket(relative_position: jax.Array | np.ndarray, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> jax.Array | np.ndarray:
  """T5's bucket of key_pos - query_pos (int32 array of any shape; numpy stays numpy).

  Bidirectional (encoder): half the buckets for keys before the query, half
  for keys after it. Causal (decoder): only keys at or before the query
  count; later ones share bucket 0 (the causal mask removes them anyway).
  Small distances get a bucket each, larger ones log-spaced buckets up to
  max_distance, and everything further the last bucket.
  """
  # numpy in, numpy out: static positions give buckets that are constants of the program.
  xp = np if isinstance(relative_position, np.ndarray) else jnp
  table = xp.asarray(bucket_table(bidirectional, num_buckets, max_distance))
  rel = relative_position.astype(np.int32)
  offset = 0
  if bidirectional:
    offset = xp.where(rel > 0, num_buckets // 2, 0)
    dist = xp.abs(rel)
  else:
    dist = -xp.minimum(rel, 0)
  return (offset + table[xp.minimum(dist, max_distance)]).astype(np.int32)


class RelativePositionBias(nn.Module):
  """One stack's [num_buckets, heads] table `rel_embedding` -> attention logit bias.

  Called once per stack; the bias it returns is added in every layer of
  that stack (T5's layer 0 owns the table, later layers reuse its bias).
  """

  num_buckets: int
  max_distance: int
  num_heads: int
  bidirectional: bool
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
    """Bias [batch, heads, q_len, k_len] from positions [batch, q_len] and [batch, k_len].

    Batch may be 1 (positions shared by every row); with packing the
    positions restart at 0 in every example, so distances stay per example.
    numpy positions (the unpacked default, 0..len-1) make the buckets a
    constant of the program instead of a per-step computation.
    """
    table = self.param(
        "rel_embedding", nn.with_logical_partitioning(
            nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
            ("relpos_buckets", "heads")),
        (self.num_buckets, self.num_heads), jnp.float32)
    rel = key_positions[:, None, :] - query_positions[:, :, None]
    buckets = relative_position_bucket(rel, self.bidirectional, self.num_buckets,
                                       self.max_distance)
    # Gathered from the [heads, buckets] transpose (tiny): [heads, batch, q, k], whose
    # transpose to [batch, heads, q, k] moves no data when batch is 1.
    bias = jnp.take(table.T, buckets, axis=1)
    return jnp.transpose(bias, (1, 0, 2, 3)).astype(self.dtype)
