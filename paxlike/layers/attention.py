"""Multi-head dot-product attention, and the choice of its implementation per platform.

One function, `dot_product_attention`, computes the attention of every model
family. When a program is lowered it picks how (`choose_implementation`):

  cudnn  cuDNN's fused flash attention (jax.nn.dot_product_attention with
         implementation="cudnn") on CUDA GPUs for bfloat16/float16 inputs;
  xla    two einsums and a float32 softmax everywhere else: CPUs, TPUs,
         float32, attention dropout, a logit cap, one query position and
         any shape cuDNN refuses.

A decode step attends over its KV cache with `cached_attention` (XLA's math
on the cache's own layout, see to_cache_layout).

The policy that decides, and the run's record of the choices, are
paxlike.layers.attention_policy's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from paxlike.errors import UserError
from paxlike.layers.attention_policy import (
  CUDNN,
  XLA,
  choose_implementation,
  cudnn_max_head_dim,
  current_policy,
  key_mask_fold,
  key_mask_lengths,
  note,
)
from paxlike.layers.linear import Linear, fp8_project, lora_output, project
from paxlike.layers.platform import lowering_platform
from paxlike.layers.relative_position import RelativePositionBias

Dtype = Any

# ----------------------------------------------------------------- attention


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
                          dropout_rng: jax.Array | None = None,
                          extra_logit: float | None = None) -> jax.Array:
  """The attention every paxlike model family computes, in one place.

  The implementation is chosen as the program is lowered
  (choose_implementation, under the policy in force): cuDNN's fused kernel
  on CUDA for bf16/fp16 inputs, else the XLA einsum path. Should cuDNN
  refuse a call while it is traced, the XLA path runs instead (the reason
  is logged once and kept in run_env.json).

  The XLA path: two einsums, the plain-JAX references' math
  (benchmarks/reference_lm.py, reference_t5.py). q is scaled before the
  logit matmul (a [b, t, n, h] multiply, none when scale is 1), the logits
  leave the matmul in float32, the bias is added, the cap applied, masked
  keys get -0.7 * float32 max (jax.nn's value), softmax runs in float32 and
  the probabilities weight v in v's dtype. jax.nn's own XLA path vmaps the
  core over head groups, so logits and masks carry a [b, n, t, 1, s]-style
  group axis that XLA relayouts with copies/transposes of whole logit
  tensors, and it scales the float32 logits (and their gradient) after the
  matmul. Measured on a 2-core CPU with `python -m benchmarks.train_step`
  (float32; medians of 6-9 interleaved runs, paxlike / reference step
  time), jax.nn's path -> this one: LmCloudSpmdTiny at MODEL_DIMS=128, 4
  layers, length 128: 1.088 -> 1.019; FlanT5Tiny: 1.105 -> 1.037;
  FlanT5Tiny at MODEL_DIMS=128, HIDDEN_DIMS=256, DIMS_PER_HEAD=32, lengths
  64/32: 1.099 -> 1.014. Dropout on the attention probabilities (T5 while
  training) needs the probabilities, which a fused kernel never exposes: the
  einsum path drops them (scaling the kept ones by 1 / (1 - rate)).

  The cuDNN path: causal attention goes through is_causal (no [t, s] mask
  is built); the segment mask and any mask become an additive bias, and a
  bias or mask with a query axis of 1 is broadcast to the full query axis,
  which cuDNN requires.

  Args:
    q: [batch, q_len, heads, dim]; k, v: [batch, kv_len, heads, dim].
    bias: added to the logits, broadcastable to [batch, heads, q_len, kv_len]
      (T5's relative position bias).
    mask: bool, True where a query may attend a key; same broadcasting. Or KeyLengths:
      each row's first keys (trailing padding), which cuDNN takes as its padding mask.
    is_causal: query i attends key j only when j <= i (queries and keys aligned at
      position 0); no [t, s] mask needs to be passed.
    q_segment_ids, kv_segment_ids: int [batch, q_len] / [batch, kv_len]; a query
      attends only keys of its own segment (packed rows). Both or neither.
    logit_cap: > 0 caps the logits as cap * tanh(logits / cap) after the bias
      (Pax's ATTEN_LOGIT_CAP); 0 or less: no cap.
    scale: multiplies the logits (1/sqrt(dim) for the LM; T5 uses 1.0).
    dropout_rate: the probability of dropping an attention probability.
    dropout_rng: the key dropout draws with; None (eval, decode) drops nothing.
    extra_logit: not None (praxis's attention_extra_logit): the softmax's denominator also
      counts exp(extra_logit), as a key every query sees whose value is 0.

  Returns:
    [batch, q_len, heads, dim] in q's dtype.
  """
  if (q_segment_ids is None) != (kv_segment_ids is None):
    raise ValueError("give both q_segment_ids and kv_segment_ids, or neither")
  dropout = dropout_rng is not None and dropout_rate > 0.0
  platform = lowering_platform()
  implementation, reason = choose_implementation(
      platform, q.dtype, policy=current_policy(), dropout=dropout, logit_cap=logit_cap,
      q_len=q.shape[1], kv_len=k.shape[1], head_dim=q.shape[-1], has_bias=bias is not None,
      max_head_dim=cudnn_max_head_dim() if platform == "cuda" else 128,
      extra_logit=extra_logit)
  if isinstance(mask, KeyLengths) and not (implementation == CUDNN
                                           and cudnn_takes_counts(mask, q_segment_ids)):
    mask = mask.spelt_out(k.shape[1])
  if implementation == CUDNN and folds_key_mask(q, mask, q_segment_ids):
    reason = f"{reason}, key mask in the head dim"
  if implementation == CUDNN:
    try:
      out = cudnn_attention(q, k, v, bias=bias, mask=mask, is_causal=is_causal,
                            q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                            scale=scale)
    except (ValueError, NotImplementedError, RuntimeError) as e:  # refused while tracing
      first = (str(e).strip().splitlines() or [type(e).__name__])[0]
      implementation, reason = XLA, f"{reason}, cuDNN refused: {first}"
    else:
      note(implementation, reason)
      return out
  note(implementation, reason)
  return xla_attention(q, k, v, bias=bias, mask=mask, is_causal=is_causal,
                       q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                       logit_cap=logit_cap, scale=scale,
                       dropout_rng=dropout_rng if dropout else None, dropout_rate=dropout_rate,
                       extra_logit=extra_logit)


def xla_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, bias: jax.Array | None = None,
                  mask: jax.Array | None = None, is_causal: bool = False,
                  q_segment_ids: jax.Array | None = None,
                  kv_segment_ids: jax.Array | None = None, logit_cap: float = 0.0,
                  scale: float = 1.0, dropout_rate: float = 0.0,
                  dropout_rng: jax.Array | None = None,
                  extra_logit: float | None = None) -> jax.Array:
  """The portable path (dot_product_attention's arguments); runs on every platform."""
  if isinstance(mask, KeyLengths):
    mask = mask.spelt_out(k.shape[1])
  mask = combined_mask(q.shape[1], k.shape[1], mask, is_causal, q_segment_ids, kv_segment_ids)
  if scale != 1.0:
    q = q * jnp.asarray(scale, q.dtype)
  logits = jnp.einsum("btnh,bsnh->bnts", q, k, preferred_element_type=jnp.float32)
  if bias is not None:
    logits = add_bias(logits, bias.astype(jnp.float32))
  probs = _probabilities(logits, mask, logit_cap, extra_logit)
  if dropout_rng is not None and dropout_rate > 0.0:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
    probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
  return jnp.einsum("bnts,bsnh->btnh", probs.astype(v.dtype), v)


def _probabilities(logits: jax.Array, mask: jax.Array | None, logit_cap: float,
                   extra_logit: float | None = None) -> jax.Array:
  """softmax over the last axis of float32 logits (bias added), capped, masked keys out;
  with extra_logit, exp(extra_logit) joins the denominator (praxis's
  _log_softmax_with_extra_logit, its max taken without gradient)."""
  if logit_cap > 0.0:
    logits = logit_cap * jnp.tanh(logits / logit_cap)
  if mask is not None:
    logits = jnp.where(mask, logits, -0.7 * jnp.finfo(jnp.float32).max)
  if extra_logit is None:
    return jax.nn.softmax(logits, axis=-1)
  top = jnp.maximum(jnp.max(jax.lax.stop_gradient(logits), axis=-1, keepdims=True),
                    extra_logit)
  exp = jnp.exp(logits - top)
  return exp / (jnp.sum(exp, axis=-1, keepdims=True) + jnp.exp(extra_logit - top))


# ---------------------------------------------------------- decoding's KV cache
#
# A decode step attends its few new queries over the whole cache. The cache is
# kept as [batch, kv_heads, length, dim] (to_cache_layout), where both matmuls of
# the step take it as it lies: in the training layout [batch, length, heads, dim]
# the heads axis sits between the matmul's batch axes and XLA copies the cache
# into that order at every step of every layer (on a CPU, as many transposes of
# each layer's cross-attention keys and values as a T5 decode has steps). Query
# heads that share a key/value head (grouped-query attention) are grouped with it
# rather than the cache repeated per query head.
#
# Every cache leaf is per example. A self-attention cache (use_kv_cache) holds
# one slot per beam of its example, [batch, kv_heads, slots * length, dim], and a
# table `slot_origin` [batch, slots, length]: the slot that holds each position
# of the beam now in each slot. A step writes every beam's new key/value into its
# own slot, and a beam attends all its example's slots at once, masked to the
# positions of its own history. Beam search's reorder (reorder_slots) then only
# gathers that table: the keys and values never move, where gathering them for
# every beam at every step cost as much memory traffic as the attention itself
# (and, with the copy back into the loop's buffers, half of an LM's 4-beam decode
# on a CPU). Greedy decoding has one slot.

SLOT_KEY, SLOT_VALUE, SLOT_ORIGIN = "slot_key", "slot_value", "slot_origin"


def to_cache_layout(x: jax.Array) -> jax.Array:
  """keys or values [batch, length, heads, dim] -> the cache's [batch, heads, length, dim]."""
  return jnp.swapaxes(x, 1, 2)


def use_kv_cache(module: nn.Module, k: jax.Array, v: jax.Array, mode: str,
                 index: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array] | None:
  """A decoder self-attention's KV cache in `module`'s 'cache' collection, in slots.

  The keys and values are [b, kv_heads, slots * length, dim], slot-major; slot_origin
  [b, slots, length]. mode "prefill" stores k, v [b, length, kv_heads, dim] as one
  slot and returns None. "extend" takes k, v [b * slots, t, kv_heads, dim], one row
  per beam (slots beams of each example, as expand_slots made them), writes each
  row into its own slot at positions index..., and returns the example's keys and
  values with the mask [b, 1, slots * t, slots * length] of what each query (beam,
  position) sees: the written positions of its own history. cached_attention
  groups the beams' queries by example.
  """
  prefill = mode == "prefill"
  shape = to_cache_layout(k).shape if prefill else (0,)
  cached_k = module.variable("cache", SLOT_KEY, jnp.zeros, shape, k.dtype)
  cached_v = module.variable("cache", SLOT_VALUE, jnp.zeros, shape, v.dtype)
  origin = module.variable("cache", SLOT_ORIGIN, jnp.zeros,
                           (shape[0], 1, shape[2]) if prefill else shape, jnp.int32)
  if prefill:  # assigned, not only initialised: a second prefill over an old cache starts afresh
    cached_k.value, cached_v.value = to_cache_layout(k), to_cache_layout(v)
    origin.value = jnp.zeros(origin.value.shape, jnp.int32)
    return None
  b, slots, length = origin.value.shape
  t = k.shape[1]
  for cached, new in ((cached_k, k), (cached_v, v)):
    rows = to_cache_layout(new).astype(cached.value.dtype)  # [b * slots, kv_heads, t, dim]
    rows = rows.reshape(b, slots, *rows.shape[1:])
    for j in range(slots):  # one in-place write per slot
      cached.value = jax.lax.dynamic_update_slice(cached.value, rows[:, j],
                                                  (0, 0, j * length + index, 0))
  own = jnp.broadcast_to(jnp.arange(slots, dtype=jnp.int32)[None, :, None], (b, slots, t))
  origin.value = jax.lax.dynamic_update_slice(origin.value, own, (0, 0, index))
  written = jnp.arange(length)[None, :] <= (index + jnp.arange(t))[:, None]  # [t, length]
  same = origin.value[:, :, None, :] == jnp.arange(slots)[None, None, :, None]  # [b, q, j, p]
  mask = same[:, :, None] & written[None, None, :, None]  # [b, q, t, j, p]
  return cached_k.value, cached_v.value, mask.reshape(b, 1, slots * t, slots * length)


def tile_slots(x: jax.Array, keys: jax.Array) -> jax.Array:
  """A bias or mask [..., length] over one slot's positions, repeated over the slots of
  keys [b, kv_heads, slots * length, dim] (use_kv_cache's)."""
  return jnp.tile(x, (1,) * (x.ndim - 1) + (keys.shape[2] // x.shape[-1],))


def _slot_leaf(path: tuple[Any, ...]) -> str:
  return str(getattr(path[-1], "key", path[-1])) if path else ""


def expand_slots(cache: Any, indices: jax.Array, batch_axis: Callable[[Any], int]) -> Any:
  """Beam search's first step: each example's self-attention caches get one slot per beam.

  indices [b * beams] repeat each example's index `beams` times (decoding.generate);
  every other leaf stays once per example. batch_axis(path): the leaf's example axis
  (1 under a scanned stack's layer axis).
  """
  def expand(path: tuple[Any, ...], x: jax.Array) -> jax.Array:
    name = _slot_leaf(path)
    if name not in (SLOT_KEY, SLOT_VALUE, SLOT_ORIGIN):
      return x
    beams = indices.shape[0] // x.shape[batch_axis(path)]
    if name == SLOT_ORIGIN:
      return jnp.repeat(x, beams, axis=batch_axis(path) + 1)
    reps = [1] * x.ndim
    reps[batch_axis(path) + 2] = beams  # slot-major along the length axis
    return jnp.tile(x, reps)

  return jax.tree_util.tree_map_with_path(expand, cache)


def reorder_slots(cache: Any, indices: jax.Array, batch_axis: Callable[[Any], int]) -> Any:
  """Beam search's reorder: beam r now continues beam indices[r] (of the same example).

  Only the slot_origin tables move (see the section's comment)."""
  def reorder(path: tuple[Any, ...], x: jax.Array) -> jax.Array:
    if _slot_leaf(path) != SLOT_ORIGIN:
      return x
    axis = batch_axis(path)
    rows = x.reshape(*x.shape[:axis], -1, *x.shape[axis + 2:])
    return jnp.take(rows, indices, axis=axis).reshape(x.shape)

  return jax.tree_util.tree_map_with_path(reorder, cache)


def cached_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, bias: jax.Array | None = None,
                     mask: jax.Array | None = None, logit_cap: float = 0.0,
                     scale: float = 1.0, extra_logit: float | None = None) -> jax.Array:
  """A decode step's attention over a KV cache: xla_attention's math in the cache's layout.

  Args:
    q: [rows, q_len, heads, dim], q_len the step's few queries; rows a multiple
      of the cache's batch: the beams of each example, which attend their
      example's keys as its rows // batch * q_len queries (beam-major).
    k, v: the cache, [batch, kv_heads, kv_len, dim] (to_cache_layout); heads a
      multiple of kv_heads, query head i reading key/value head i // (heads / kv_heads).
    bias, mask: broadcastable to [batch, heads, rows // batch * q_len, kv_len], as
      for dot_product_attention; mask True where a key counts.
    logit_cap, scale, extra_logit: as for dot_product_attention.

  Returns:
    [rows, q_len, heads, dim] in q's dtype.
  """
  rows, q_len, n, h = q.shape
  b, kv = k.shape[:2]
  t = rows // b * q_len
  q = q.reshape(b, t, n, h)
  platform = lowering_platform()  # a CPU's choice is always "cpu", as dot_product_attention's
  note(XLA, platform if platform != "cuda" else
        f"{platform}, {np.dtype(q.dtype).name}, a decode step over the KV cache")
  if scale != 1.0:
    q = q * jnp.asarray(scale, q.dtype)
  q = q.reshape(b, t, kv, n // kv, h)
  logits = jnp.einsum("btkgh,bksh->bkgts", q, k, preferred_element_type=jnp.float32)

  def grouped(x: jax.Array) -> jax.Array:  # broadcastable to [b, n, t, s] -> to [b, kv, g, t, s]
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)
    if x.shape[1] == 1:
      return x[:, :, None]
    return x.reshape(x.shape[0], kv, n // kv, *x.shape[2:])

  if bias is not None:
    logits = logits + grouped(bias.astype(jnp.float32))
  probs = _probabilities(logits, None if mask is None else grouped(mask), logit_cap,
                         extra_logit)
  # The step's few queries come out after the cache's axes, moved to [b, t, ...]
  # after the matmul: asking the einsum for [b, t, kv, g, h] directly makes
  # XLA's CPU backend run it as a transposed batched dot, 3-8x slower whenever
  # a row has several queries (beams, grouped heads).
  out = jnp.einsum("bkgts,bksh->bkgth", probs.astype(v.dtype), v)
  return out.transpose(0, 3, 1, 2, 4).reshape(rows, q_len, n, h)


@jax.custom_vjp
def _add_batch_shared(logits: jax.Array, bias: jax.Array) -> jax.Array:
  """logits [B, ...] + bias [1, ...]; the bias's gradient sums the batch as a matvec."""
  return logits + bias


def _add_batch_shared_fwd(logits: jax.Array, bias: jax.Array) -> tuple[jax.Array, None]:
  return logits + bias, None


def _add_batch_shared_bwd(_: None, g: jax.Array) -> tuple[jax.Array, jax.Array]:
  rows = g.shape[0]
  summed = jnp.ones((rows,), g.dtype) @ g.reshape(rows, -1)
  return g, summed.reshape((1, *g.shape[1:]))


_add_batch_shared.defvjp(_add_batch_shared_fwd, _add_batch_shared_bwd)


def add_bias(logits: jax.Array, bias: jax.Array) -> jax.Array:
  """logits [B, n, t, s] + a bias broadcastable to them (float32 both).

  A bias shared by the batch ([1, n, t, s]: T5's relative position bias)
  gets, on a CPU, its gradient summed over the batch as a matrix-vector
  product. XLA's CPU compiler in jaxlib 0.10 sums a tensor over its leading
  axis ~30x slower than the same sum as a matvec (on a 2-core CPU:
  [4, 6, 512, 512] 60 ms against 1.3 ms; [32, 12, 512, 512] 0.95 s against
  23 ms). FlanT5Small's train step (batch 4, bfloat16, steps alternated in one
  process) took 7.91 s with the plain gradient, 7.27 s (0.92x) with this one;
  under jaxlib 0.12, which sums both ways alike, 1.01x. The sum is the same,
  in another order; other platforms keep the plain broadcast gradient.
  """
  # Concrete shapes only: an export's batch is symbolic ('b'), and a decode has no gradient.
  concrete = all(isinstance(d, int) for d in (*logits.shape, *bias.shape))
  if (concrete and lowering_platform() == "cpu" and bias.ndim == logits.ndim
      and bias.shape[0] == 1 and logits.shape[0] > 1 and bias.shape[1:] == logits.shape[1:]):
    return _add_batch_shared(logits, bias)
  return logits + bias


def _full_query_axis(x: jax.Array, q_len: int, kv_len: int) -> jax.Array:
  """x broadcastable to [b, n, t, s] as 4-D with t and s spelled out (cuDNN's requirement)."""
  x = x.reshape((1,) * (4 - x.ndim) + x.shape)
  return jnp.broadcast_to(x, (x.shape[0], x.shape[1], q_len, kv_len))


def folds_key_mask(q: jax.Array, mask: jax.Array | None, q_segment_ids: jax.Array | None
                   ) -> bool:
  """Whether the cuDNN path folds this call's mask into the head dim (fold_key_mask): the
  fold is on, the mask [b, 1, 1, s] says which keys count, the same for every query and
  head, and the widened head dim is one cuDNN takes."""
  return (key_mask_fold() and mask is not None and not isinstance(mask, KeyLengths)
          and q_segment_ids is None and mask.ndim == 4
          and mask.shape[1] == 1 and mask.shape[2] == 1
          and folded_head_dim(q.shape[-1]) <= cudnn_max_head_dim())


def folded_head_dim(h: int) -> int:
  """The head dim fold_key_mask widens h to: one more, rounded up to a multiple of 8."""
  return -(-(h + 1) // 8) * 8


# How far a masked key's logit drops under fold_key_mask: exp(-2**14) is 0 in float32.
MASKED_LOGIT_DROP = 2.0 ** 14


def fold_key_mask(q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array,
                  scale: float = 1.0) -> tuple[jax.Array, jax.Array, jax.Array]:
  """q, k, v whose unmasked attention is that of q, k, v under key_mask [b, 1, 1, s].

  One more head dim carries the mask: q gets c there, k gets -c at a masked
  key and 0 elsewhere, so a masked key's scaled logit drops by scale * c**2
  (at least MASKED_LOGIT_DROP; c a power of 2, exact in bf16 and fp16) and
  every other logit is unchanged. All three are padded with zeros to a head
  dim that is a multiple of 8 (cuDNN's rule; 64 -> 72); the attention's
  output is the first h dims of the result. The point: T5's encoder hands
  cuDNN its [1, n, s, s] relative-position bias as it is, instead of the
  bias plus the padding, a [b, n, s, s] tensor cuDNN reads, whose gradient
  it writes and XLA sums over the batch. cuDNN's own padding mask
  (sequence lengths) cannot take a bias gradient.
  """
  h = q.shape[-1]
  width = folded_head_dim(h)
  c = 2.0 ** int(np.ceil(np.log2(np.sqrt(MASKED_LOGIT_DROP / scale))))

  def widen(x: jax.Array, column: jax.Array | None) -> jax.Array:
    parts = [x] if column is None else [x, column.astype(x.dtype)]
    pad = width - h - (column is not None)
    return jnp.concatenate(parts + [jnp.zeros((*x.shape[:-1], pad), x.dtype)], axis=-1)

  keys = jnp.where(key_mask[:, 0, 0, :, None, None], 0.0, -c)  # [b, s, 1, 1]
  return (widen(q, jnp.full((*q.shape[:-1], 1), c)),
          widen(k, jnp.broadcast_to(keys, (*k.shape[:-1], 1))), widen(v, None))


@flax.struct.dataclass
class KeyLengths:
  """A key mask that keeps the first `lengths[i]` keys of row i: trailing padding.

  Any `mask` argument of dot_product_attention may be one. The XLA path
  spells it out as the [b, 1, 1, s] mask (`spelt_out`); the cuDNN path hands
  the lengths to cuDNN as its padding mask (key_value_seq_lengths), so a
  bias keeps its own batch and no [b, n, t, s] bias is built (T5's
  relative-position bias, and its gradient, at batch 1). A pytree: it passes
  through scan, remat and jit as its one array.
  """

  lengths: jax.Array  # [b] int32, each at least 1

  def spelt_out(self, kv_len: int) -> jax.Array:
    """The same mask as [b, 1, 1, kv_len] bool."""
    return (jnp.arange(kv_len)[None, :] < self.lengths[:, None])[:, None, None, :]


def key_lengths(keys: jax.Array) -> KeyLengths:
  """keys [b, s] bool -> the KeyLengths that keeps each row's keys up to its last True one
  (at least the first): the same mask wherever a row's Trues are a non-empty prefix."""
  last = jnp.max(jnp.where(keys, jnp.arange(1, keys.shape[-1] + 1), 0), axis=-1)
  return KeyLengths(jnp.maximum(last, 1).astype(jnp.int32))


def cudnn_takes_counts(mask: Any, q_segment_ids: jax.Array | None) -> bool:
  """Whether the cuDNN path hands this mask to cuDNN as key counts: a KeyLengths, with
  counts on (attention_policy.set_key_mask_lengths) and no segments."""
  return isinstance(mask, KeyLengths) and key_mask_lengths() and q_segment_ids is None


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, bias: jax.Array | None = None,
                    mask: jax.Array | None = None, is_causal: bool = False,
                    q_segment_ids: jax.Array | None = None,
                    kv_segment_ids: jax.Array | None = None, scale: float = 1.0) -> jax.Array:
  """cuDNN's fused attention (no dropout, no cap); raises where cuDNN refuses the call.

  mask may be KeyLengths: with key_mask_lengths on (the default;
  attention_policy.set_key_mask_lengths) cuDNN takes the lengths as its
  padding mask and the bias as it came, else they are spelt out as a mask.
  """
  if cudnn_takes_counts(mask, q_segment_ids):
    t, s = q.shape[1], k.shape[1]
    return jax.nn.dot_product_attention(
        q, k, v, bias=None if bias is None else _full_query_axis(bias.astype(q.dtype), t, s),
        is_causal=is_causal, key_value_seq_lengths=mask.lengths, scale=scale,
        implementation="cudnn")
  if isinstance(mask, KeyLengths):
    mask = mask.spelt_out(k.shape[1])
  t, s, h = q.shape[1], k.shape[1], q.shape[-1]
  folded = folds_key_mask(q, mask, q_segment_ids)
  if folded:  # the mask rides in the head dim; the output's first h dims are the attention
    q, k, v = fold_key_mask(q, k, v, jnp.broadcast_to(mask, (q.shape[0], 1, 1, s)), scale)
    mask = None
  if q_segment_ids is not None:
    same = q_segment_ids[:, None, :, None] == kv_segment_ids[:, None, None, :]
    mask = same if mask is None else mask & same
  if mask is not None:
    mask = _full_query_axis(mask, t, s)
  if bias is not None:
    bias = _full_query_axis(bias.astype(q.dtype), t, s)
  out = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, is_causal=is_causal,
                                     scale=scale, implementation="cudnn")
  return out[..., :h] if folded else out


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
  """Rotates x [B, T, heads, head_dim] by its positions [B|1, T] (rotate-half layout)."""
  freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, h/2]
  angles = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  xf = x.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
  return (xf * cos + rotated * sin).astype(x.dtype)


def rope_inv_timescales(head_dim: int, min_timescale: float, max_timescale: float
                        ) -> np.ndarray:
  """[head_dim // 2] inverse timescales of praxis's rotary embedding.

  timescale_i = min * (max / min) ** (2i / head_dim); with min 1 these are
  Llama's 1 / theta ** (2i / head_dim) for theta = max.
  """
  fraction = 2 * np.arange(head_dim // 2, dtype=np.float64) / head_dim
  timescale = min_timescale * (max_timescale / min_timescale) ** fraction
  return (1.0 / timescale).astype(np.float32)


class DotProductAttention(nn.Module):
  """Multi-head self-attention, causal unless causal=False (BERT's bidirectional
  encoder, praxis's LanguageModelType.BIDIRECTIONAL); combine_qkv fuses the three
  projections.

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
  every cached position up to it (cached_attention, over the cache's
  [batch, kv_heads, length, dim]), so a new token costs one step instead of
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
  # praxis's GroupedQueryAttention: num_kv_heads key/value heads (None: num_heads),
  # each shared by num_heads / num_kv_heads query heads.
  num_kv_heads: int | None = None
  # (min, max) timescales of rotary positions on q and k (praxis's
  # use_rotary_position_emb / rope_min_max_timescales); None: none.
  rope_timescales: tuple[float, float] | None = None
  # LoRA adapters (paxlike.layers.linear.lora_output) on the q/k/v (or combined) and
  # output projections, as praxis's LoRA attention projections; 0: none.
  lora_rank: int = 0
  # praxis's internal_enable_query_scale: False leaves the query unscaled (GLaM's
  # attention, whose init makes up for it); with per_dim_scale off only.
  query_scale: bool = True
  # praxis's attention_extra_logit: see dot_product_attention; None: a plain softmax.
  extra_logit: float | None = None
  # praxis's relative_bias_tpl (GLaM): this layer's own causal T5-style bias,
  # (num_buckets, max_distance), on every logit; None: none.
  relative_bias: tuple[int, int] | None = None
  causal: bool = True
  fp8: bool = False  # Pax's USE_FP8: the q/k/v and output projections in FP8 (linear.fp8_project)
  # The key/value projections in FP8 or not, where they differ from the rest (praxis's
  # one-key/value-head attention projects them through headless_proj_tpl); None: fp8.
  kv_fp8: bool | None = None

  def _relative_bias(self, query_pos: jax.Array, key_pos: jax.Array) -> jax.Array | None:
    if self.relative_bias is None:
      return None
    buckets, distance = self.relative_bias
    return RelativePositionBias(buckets, distance, self.num_heads, bidirectional=False,
                                dtype=jnp.float32, name="relative_bias")(query_pos, key_pos)

  @nn.compact
  def __call__(self, x: jax.Array, index: jax.Array | None = None,
               segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None) -> jax.Array:
    n, h, b, r = self.num_heads, self.dim_per_head, self.use_bias, self.lora_rank
    kv = self.num_kv_heads or n
    if kv <= 0 or n % kv:
      raise UserError(f"NUM_KV_HEADS={kv} must divide NUM_HEADS={n}.")
    kv_fp8 = self.fp8 if self.kv_fp8 is None else self.kv_fp8
    if self.combine_qkv:
      if kv_fp8 != self.fp8:
        raise UserError("combined q/k/v projections are in FP8 all or none; set COMBINE_QKV="
                        "False to quantise the key/value projections differently.")
      if kv != n:
        raise UserError("combined q/k/v projections need as many key/value heads as query "
                        f"heads ({kv} != {n}); set COMBINE_QKV=False.")
      qkv = Linear((3, n, h), ("embed", "qkv", "heads", "kv"), self.dtype, b, r, self.fp8,
                   name="qkv")(x)
      qkv = checkpoint_name(qkv, "combined_qkv_proj")
      q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    else:
      q = checkpoint_name(Linear((n, h), ("embed", "heads", "kv"), self.dtype, b, r, self.fp8,
                                 name="query")(x), "query_proj")
      k = checkpoint_name(Linear((kv, h), ("embed", "heads", "kv"), self.dtype, b, r, kv_fp8,
                                 name="key")(x), "key_proj")
      v = checkpoint_name(Linear((kv, h), ("embed", "heads", "kv"), self.dtype, b, r, kv_fp8,
                                 name="value")(x), "value_proj")
    if self.rope_timescales is not None:
      if positions is None:
        start = 0 if index is None else index
        positions = (start + jnp.arange(x.shape[1]))[None]
      inv_freq = rope_inv_timescales(h, *self.rope_timescales)
      q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
    scale = h ** -0.5 if self.query_scale else 1.0
    if self.per_dim_scale:
      q = scale_query_per_dim(q, self.param("per_dim_scale", nn.with_logical_partitioning(
          nn.initializers.zeros, ("kv",)), (h,), jnp.float32))
      scale = 1.0
    if self.cache_mode == "extend":  # the mask says which cached positions exist
      k, v, mask = use_kv_cache(self, k, v, "extend", index)
      bias = self._relative_bias((index + jnp.arange(x.shape[1]))[None],
                                 jnp.arange(k.shape[2])[None])
      context = cached_attention(q, k, v, bias=bias, mask=mask, logit_cap=self.logit_cap,
                                 scale=scale, extra_logit=self.extra_logit)
    else:  # training, eval and prefill: over aligned positions
      if self.relative_bias is not None:
        pos = positions
        if pos is None:
          pos = np.arange(x.shape[1])[None] + (0 if index is None else index)
        bias = self._relative_bias(pos, pos)
      else:
        bias = None
      if self.cache_mode == "prefill":
        use_kv_cache(self, k, v, "prefill")
        segment_ids = None  # decoding runs one sequence per row
      if kv != n:  # the attention function takes equal heads: repeat inside this call only
        k, v = jnp.repeat(k, n // kv, axis=2), jnp.repeat(v, n // kv, axis=2)
      rng = None
      if self.dropout_rate > 0.0 and self.has_rng("dropout"):
        rng = self.make_rng("dropout")
      context = dot_product_attention(q, k, v, bias=bias, is_causal=self.causal,
                                      q_segment_ids=segment_ids, kv_segment_ids=segment_ids,
                                      logit_cap=self.logit_cap, scale=scale,
                                      dropout_rate=self.dropout_rate, dropout_rng=rng,
                                      extra_logit=self.extra_logit)
    context = nn.with_logical_constraint(context, ("batch", "length", "activation_heads", "kv"))
    context = checkpoint_name(context, "context")
    post = self.param("post", nn.with_logical_partitioning(
        nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal",
                                         in_axis=(0, 1), out_axis=2),
        ("heads", "kv", "embed")), (n, h, x.shape[-1]), jnp.float32)
    if self.fp8:
      out = fp8_project(self, context, post.astype(self.dtype), 2, name="post_fp8")
    else:
      out = project(context, post.astype(self.dtype), 2)
    adapted = lora_output(self, context, post.shape, 2, r, self.dtype, "post_")
    if adapted is not None:
      out = out + adapted
    if b:
      out = out + self.param("post_bias", nn.with_logical_partitioning(
          nn.initializers.zeros, ("embed",)), (x.shape[-1],), jnp.float32).astype(self.dtype)
    return checkpoint_name(out, "out_proj")
