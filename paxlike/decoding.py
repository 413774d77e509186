"""Greedy, sampled and beam-search generation over any model's prefill + extend.

The model side is three things (see paxlike.models.base):

  extend(cache, tokens [N], index) -> (logits [N, vocab] float32, cache)
      feeds one token per row at position `index` (a scalar shared by rows);
  gather_cache(cache, indices [M]) -> cache
      the cache with rows taken at `indices` (beam search expands each row
      into num_beams rows with it, then reorders beams every step); a model
      may pass two cheaper hooks for beam search instead (see generate):
      expand_cache, which may keep a leaf that every beam of a row shares
      (T5's encoder keys/values) once per row, and reorder_cache, which may
      skip leaves that are the same in every beam of a row;
  DecodeStart
      what the prefill left: the first tokens to feed, the position they
      go to, how many output positions there are, and tokens the model
      forces at some positions (the LM's prompt, whose rows differ in length).

Output position i is chosen from the logits of step i, which fed the token
of position i - 1 (or first_tokens at i = 0) at index start_index + i. A
forced position takes its forced token, adds nothing to the score and
never ends a row. A row ends when it emits eos_id at a position that is
not forced; everything after is pad_id. The loop stops as soon as every row
(every beam that can still matter) has ended, or after `limit` steps. A row
with its own step limit (DecodeStart.row_limits) stops there whatever the
other rows do: a row's output never depends on the rest of its batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from paxlike.layers.linear import merge_lora


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
  """How to generate (hashable: it is a static argument of the jitted decode).

  Attributes:
    max_decode_length: output positions at most (None: the model's own maximum).
    temperature: 0 decodes greedily; above 0 samples from softmax(logits / T).
    top_k: sample among the k most likely tokens (0: no cut).
    top_p: sample from the smallest set whose probability reaches p (1.0: no cut).
    num_beams: above 1, beam search (temperature, top_k and top_p are then unused).
    alpha: beam search's brevity penalty exponent, ((5 + length) / 6) ** alpha.
    eos_id / pad_id: the end-of-sequence id and what fills a row after it.
    seed: sampling's seed (the decode program is the same for every seed: it takes the
      key as an argument, so the seed is no part of the settings' identity).
  """

  max_decode_length: int | None = None
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  num_beams: int = 1
  alpha: float = 0.6
  eos_id: int = 1
  pad_id: int = 0
  seed: int = dataclasses.field(default=0, compare=False)

  @property
  def samples(self) -> bool:
    return self.num_beams == 1 and self.temperature > 0

  def record(self) -> dict[str, Any]:
    """The settings as records hold them (an export's manifest, a decode's metrics file),
    with the mode spelled out; no seed (an export's caller passes its own, and a decode's
    metrics file adds the one it sampled with)."""
    mode = ("beam_search" if self.num_beams > 1 else "sample" if self.samples else "greedy")
    out = {"mode": mode, **dataclasses.asdict(self)}
    del out["seed"]
    return out


@struct.dataclass
class DecodeStart:
  """Where generation starts; a model's prefill returns it.

  Attributes:
    first_tokens: [B] int32, fed at step 0.
    start_index: scalar int32, the position step 0 feeds at.
    forced_tokens: [B, num_steps] int32 (any value where not forced).
    forced_mask: [B, num_steps] bool, True where output position i is forced.
    limit: scalar int32, how many steps may run (<= num_steps).
    num_steps: output positions (static).
    row_limits: [B] int32, how many steps row b may run (<= limit): the row
      ends there, as if the loop had stopped; None: `limit` for every row.
  """

  first_tokens: jax.Array
  start_index: jax.Array
  forced_tokens: jax.Array
  forced_mask: jax.Array
  limit: jax.Array
  num_steps: int = struct.field(pytree_node=False)
  row_limits: jax.Array | None = None


def prompt_start(batch: dict[str, jax.Array], settings: DecodeSettings,
                 fill: Callable[[jax.Array], Any]) -> DecodeStart:
  """A decoder-only model's start: fill(tokens) runs the prompts (batch's ids up to
  prompt_lens, zeros after) through the model once, filling its KV caches.

  Rows' prompts differ in length: extends start after the shortest, and the longer
  prompts' tokens are forced at the positions they cover. Output position i is buffer
  position p_min + i.

  Row b may generate length - lens[b] tokens (the room its row leaves), at most
  settings.max_decode_length: it stops after lens[b] - p_min + that many steps
  (row_limits), so neither its tokens nor its score depend on the other prompts.
  """
  ids, lens = batch["ids"], jnp.maximum(batch["prompt_lens"], 1)
  length = ids.shape[1]
  positions = jnp.arange(length)
  tokens = jnp.where(positions[None] < lens[:, None], ids, 0).astype(jnp.int32)
  fill(tokens)
  p_min = jnp.min(lens)
  out_pos = p_min + positions[:length - 1]  # buffer position of each output position
  new_tokens = length - lens  # the room each row leaves
  if settings.max_decode_length is not None:
    new_tokens = jnp.minimum(new_tokens, settings.max_decode_length)
  row_limits = lens - p_min + new_tokens
  return DecodeStart(
      first_tokens=jnp.take(tokens, p_min - 1, axis=1),
      start_index=(p_min - 1).astype(jnp.int32),
      forced_tokens=jnp.take(tokens, jnp.minimum(out_pos, length - 1), axis=1),
      forced_mask=out_pos[None] < lens[:, None],
      limit=jnp.max(row_limits).astype(jnp.int32), num_steps=length - 1,
      row_limits=row_limits.astype(jnp.int32))


@struct.dataclass
class DecodeOutput:
  """Generated ids, best first.

  Attributes:
    tokens: [B, K, num_steps] int32 (K = num_beams, 1 without beam search);
      pad_id after a row's EOS and after the last step run.
    scores: [B, K] float32; the sum of the chosen tokens' log-probabilities
      (forced positions excluded), divided by the brevity penalty under beam
      search; sorted in descending order along K.
    lengths: [B, K] int32, generated tokens up to and including EOS (forced
      positions excluded).
  """

  tokens: jax.Array
  scores: jax.Array
  lengths: jax.Array


def decoding_model(model: Any, params: Any = None) -> tuple[Any, Any]:
  """The model that decodes for `model` (decode, infer, export), and params in its layout.

  A model with a layer stack decodes as its twin model.for_decoding(): the same
  layers unpipelined and unrolled, so that each layer's KV cache is written in
  place (see BaseModel.for_decoding), whose parameters are these restacked (its
  restack_params). A model already in that layout decodes as it is. A model
  with LoRA adapters (lora_rank) decodes and exports as its twin without them,
  each adapter folded into its weight (paxlike.layers.linear.merge_lora): the
  same function, no adapter product per generated token, and exports whose
  weights are the plain model's.

  Args:
    model: the task's model.
    params: its parameters (arrays, or ShapeDtypeStructs: restacked abstractly), or None.

  Returns:
    (the decoding model, params in its layout, None when params is None).
  """
  plain = model.for_decoding()
  restack = plain.restack_params
  if getattr(plain, "lora_rank", 0) > 0:  # adapters folded into their weights (merge_lora)
    plain = plain.clone(lora_rank=0, parent=None)
    restack = lambda p: plain.restack_params(merge_lora(p))  # noqa: E731
  if plain is model or params is None:
    return plain, params
  if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params)):
    return plain, jax.eval_shape(restack, params)
  return plain, restack(params)


def brevity_penalty(length: jax.Array, alpha: float) -> jax.Array:
  """T5X's length normalisation: ((5 + length) / 6) ** alpha."""
  return ((5.0 + length.astype(jnp.float32)) / 6.0) ** alpha


def generate(extend: Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]],
             cache: Any, start: DecodeStart, settings: DecodeSettings, key: jax.Array,
             gather_cache: Callable[[Any, jax.Array], Any],
             expand_cache: Callable[[Any, jax.Array], Any] | None = None,
             reorder_cache: Callable[[Any, jax.Array], Any] | None = None) -> DecodeOutput:
  """Runs the decode loop (jit-able; a lax.while_loop that ends early).

  num_beams == 1 decodes greedily (temperature 0) or samples (temperature > 0);
  num_beams > 1 runs T5X-style beam search. settings.max_decode_length is the
  prefill's business (it sets start.num_steps, limit and row_limits) and is not read
  here.

  Sampling draws from softmax(logits / temperature) cut first by top_k (ties
  with the k-th logit stay), then by top_p on what top_k left, renormalised
  (the smallest set of most likely tokens whose probability reaches top_p; the
  most likely token always stays, ties with the last kept token stay too).
  T5X takes one or the other; both set means top_k, then top_p.
  Step i draws with jax.random.fold_in(key, i). A sample's score is the sum of
  its tokens' log_softmax(logits / temperature): the temperature-scaled
  distribution before the top_k / top_p cut.

  Beam search keeps K live and K finished beams per row. Each step takes the
  top 2K of (live log-prob sum + log_softmax) over K * vocab: candidates that
  end in EOS (at a position that is not forced) go to the finished set,
  scored log-prob / brevity_penalty(length, alpha); the best K others stay
  live and the cache is reordered with gather_cache. It stops when, in every
  row, the finished set is full and no live beam's best possible final score
  (its log-prob, which can only fall, over the largest brevity penalty it can
  still reach) beats the worst finished score, or after `limit` steps. A row
  with fewer than K finished beams is filled with its best live beams, scored
  the same way at their current length.

  Args:
    extend: see the module docstring.
    cache: the prefill's cache.
    start: the prefill's DecodeStart.
    settings: greedy / sampling / beam search.
    key: PRNG key for sampling (folded with the step).
    gather_cache: see the module docstring.
    expand_cache: beam search's first step: (cache, indices [B * K], each row
      index K times) -> the cache of B * K beams; default gather_cache.
    reorder_cache: beam search's reorder: (cache, indices [B * K], beam rows
      taken from rows of the same example) -> cache; default gather_cache.
      Beams never move between examples, so a leaf equal in every beam of a
      row needs no reorder.

  Returns:
    DecodeOutput with K = settings.num_beams.

  Raises:
    ValueError: num_beams < 1, temperature < 0 or top_p outside (0, 1].
  """
  if settings.num_beams < 1:
    raise ValueError(f"num_beams must be at least 1, got {settings.num_beams}")
  if settings.temperature < 0:
    raise ValueError(f"temperature must be >= 0, got {settings.temperature}")
  if not 0.0 < settings.top_p <= 1.0:
    raise ValueError(f"top_p must be in (0, 1], got {settings.top_p}")
  if settings.num_beams > 1:
    return _beam_search(extend, cache, start, settings, settings.num_beams,
                        expand_cache or gather_cache, reorder_cache or gather_cache)
  return _greedy_or_sample(extend, cache, start, settings, key)


# --------------------------------------------------------------- helpers


def _column(x: jax.Array, i: jax.Array) -> jax.Array:
  """x[:, i] for a traced i."""
  return jax.lax.dynamic_index_in_dim(x, i, axis=1, keepdims=False)


def _steps_to_run(start: DecodeStart) -> tuple[jax.Array, jax.Array]:
  """(steps the loop may run, [B] steps each row may run): start.limit and
  start.row_limits, capped at num_steps (more would write past the buffers)."""
  limit = jnp.minimum(jnp.asarray(start.limit, jnp.int32), start.num_steps)
  rows = limit if start.row_limits is None else jnp.minimum(start.row_limits, limit)
  return limit, jnp.broadcast_to(rows, start.first_tokens.shape).astype(jnp.int32)


def _cut_logits(logits: jax.Array, top_k: int, top_p: float) -> jax.Array:
  """logits [N, V] with the tokens outside the top_k, then top_p, set at -inf.

  Both cuts are thresholds, so tokens tied with the last kept value stay.
  With top_k, the nucleus is found on the k sorted values lax.top_k returns.
  With top_p alone it is found without sorting the vocabulary, see _nucleus_cut.
  """
  vocab = logits.shape[-1]
  if 0 < top_k < vocab:
    top_values = jax.lax.top_k(logits, top_k)[0]  # [N, k], descending
    # The min rather than top_values[:, -1:]: XLA's CPU backend rewrites that
    # slice of a top_k into a full sort of the vocabulary (~60x slower).
    kth = jnp.min(top_values, axis=-1, keepdims=True)
    logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p < 1.0:
      # Renormalised over every token the cut kept: a tie with the k-th value stays
      # beyond the k sorted values, so their softmax alone would overstate each share.
      top = top_values[..., :1]
      total = jnp.sum(jnp.exp(logits - top), axis=-1, keepdims=True)  # exp(-inf) = 0
      probs = jnp.exp(top_values - top) / total
      # A token stays while the tokens before it are still short of top_p;
      # the first always does. `kept` is a prefix since `before` only grows.
      before = jnp.cumsum(probs, axis=-1) - probs
      kept = before < top_p
      smallest = jnp.min(jnp.where(kept, top_values, jnp.inf), axis=-1, keepdims=True)
      logits = jnp.where(logits < smallest, -jnp.inf, logits)
  elif top_p < 1.0:
    logits = _nucleus_cut(logits, top_p)
  return logits


def _nucleus_cut(logits: jax.Array, top_p: float) -> jax.Array:
  """logits [N, V] outside the smallest most-likely set of mass >= top_p at -inf.

  That set is every token whose probability is at least t, for the largest t
  whose set still holds top_p of the mass. Non-negative float32 values order
  like their int32 bit patterns, so bisecting over the bit patterns finds t
  exactly in 32 passes over the vocabulary: O(V) a row where a sort is
  O(V log V), and on XLA's CPU backend a sort of 32k logits costs ~7x more.
  The most likely token always stays (top_p > 0).
  """
  probs = jax.nn.softmax(logits, axis=-1)
  bits = jax.lax.bitcast_convert_type(probs, jnp.int32)
  # Invariant: the set at `low` holds top_p of the mass, the set at `high` does not.
  low = jnp.zeros((*bits.shape[:-1], 1), jnp.int32)
  high = jnp.max(bits, axis=-1, keepdims=True) + 1

  def halve(_, bounds):
    low, high = bounds
    mid = low + (high - low) // 2
    enough = jnp.sum(jnp.where(bits >= mid, probs, 0.0), axis=-1, keepdims=True) >= top_p
    return jnp.where(enough, mid, low), jnp.where(enough, high, mid)

  # Probabilities are <= 1.0 (0x3f800000 < 2**30): 31 halvings close the gap.
  low, _ = jax.lax.fori_loop(0, 32, halve, (low, high))
  return jnp.where(bits < low, -jnp.inf, logits)


# ------------------------------------------------- greedy and sampling


class _SampleState(NamedTuple):
  step: jax.Array       # scalar int32: the output position chosen next
  cache: Any
  inputs: jax.Array     # [B] tokens fed at this step
  tokens: jax.Array     # [B, num_steps] output buffer
  scores: jax.Array     # [B] float32
  lengths: jax.Array    # [B] int32
  ended: jax.Array      # [B] bool


def _greedy_or_sample(extend, cache, start: DecodeStart, settings: DecodeSettings,
                      key: jax.Array) -> DecodeOutput:
  """num_beams == 1: argmax, or a draw from the temperature / top-k / top-p cut."""
  batch = start.first_tokens.shape[0]
  sample = settings.temperature > 0
  limit, row_limits = _steps_to_run(start)

  def cond(s: _SampleState) -> jax.Array:
    return (s.step < limit) & ~jnp.all(s.ended)

  def body(s: _SampleState) -> _SampleState:
    logits, new_cache = extend(s.cache, s.inputs, start.start_index + s.step)
    logits = logits.astype(jnp.float32)
    if sample:
      scaled = logits / settings.temperature
      cut = _cut_logits(scaled, settings.top_k, settings.top_p)
      chosen = jax.random.categorical(jax.random.fold_in(key, s.step), cut, axis=-1)
      log_probs = jax.nn.log_softmax(scaled, axis=-1)
    else:
      chosen = jnp.argmax(logits, axis=-1)
      log_probs = jax.nn.log_softmax(logits, axis=-1)
    chosen = chosen.astype(jnp.int32)
    forced = _column(start.forced_mask, s.step)
    chosen = jnp.where(forced, _column(start.forced_tokens, s.step).astype(jnp.int32), chosen)
    counts = ~forced & ~s.ended
    chosen_log_prob = jnp.take_along_axis(log_probs, chosen[:, None], axis=-1)[:, 0]
    out = jnp.where(s.ended, settings.pad_id, chosen)
    return _SampleState(
        step=s.step + 1,
        cache=new_cache,
        inputs=out,
        tokens=jax.lax.dynamic_update_index_in_dim(s.tokens, out, s.step, axis=1),
        scores=s.scores + jnp.where(counts, chosen_log_prob, 0.0),
        lengths=s.lengths + counts.astype(jnp.int32),
        # A row at its own limit ends, as if the loop stopped there.
        ended=s.ended | (counts & (chosen == settings.eos_id)) | (s.step + 1 >= row_limits))

  init = _SampleState(
      step=jnp.zeros((), jnp.int32),
      cache=cache,
      inputs=start.first_tokens.astype(jnp.int32),
      tokens=jnp.full((batch, start.num_steps), settings.pad_id, jnp.int32),
      scores=jnp.zeros((batch,), jnp.float32),
      lengths=jnp.zeros((batch,), jnp.int32),
      ended=row_limits <= 0)
  s = jax.lax.while_loop(cond, body, init)
  return DecodeOutput(tokens=s.tokens[:, None], scores=s.scores[:, None],
                      lengths=s.lengths[:, None])


# ----------------------------------------------------------- beam search


class _BeamState(NamedTuple):
  step: jax.Array            # scalar int32
  cache: Any                 # B * K rows, row b * K + k is beam k of row b
  inputs: jax.Array          # [B * K] tokens fed at this step
  live_tokens: jax.Array     # [B, K, num_steps]
  live_log_probs: jax.Array  # [B, K] sums of log-probs, -inf for empty beams
  live_lengths: jax.Array    # [B, K]
  finished_tokens: jax.Array  # [B, K, num_steps]
  finished_scores: jax.Array  # [B, K] normalised, sorted descending, -inf if empty
  finished_lengths: jax.Array  # [B, K]


def _best_live_bound(live_log_probs: jax.Array, live_lengths: jax.Array, max_length: jax.Array,
                     alpha: float) -> jax.Array:
  """[B]: the best normalised score any live beam can still finish with.

  Log-probs only fall, so a beam's final score is at most its current sum over
  the largest brevity penalty among the lengths it can finish at (one more
  token up to max_length). The penalty is monotonic in the length, so the
  largest is at one end: max_length for alpha >= 0 (T5X's bound), the next
  length for alpha < 0.
  """
  shortest = brevity_penalty(live_lengths + 1, alpha)
  longest = brevity_penalty(jnp.broadcast_to(max_length, live_lengths.shape), alpha)
  bound = jnp.maximum(live_log_probs / shortest, live_log_probs / longest)
  return jnp.max(bound, axis=-1)


def _beam_search(extend, cache, start: DecodeStart, settings: DecodeSettings, num_beams: int,
                 expand_cache, reorder_cache=None) -> DecodeOutput:
  """T5X-style beam search with num_beams beams (see generate; also runs with 1 beam).

  expand_cache also reorders when no reorder_cache is given (a plain gather_cache).
  """
  reorder_cache = reorder_cache or expand_cache
  batch = start.first_tokens.shape[0]
  k = num_beams
  alpha = settings.alpha
  row_base = (jnp.arange(batch, dtype=jnp.int32) * k)[:, None]  # [B, 1]
  limit, row_limits = _steps_to_run(start)

  def cond(s: _BeamState) -> jax.Array:
    # finished_scores is sorted, and an empty slot holds -inf, which no live
    # bound beats: a row with room left goes on while any live beam is possible.
    worst_finished = s.finished_scores[:, -1]
    bound = _best_live_bound(s.live_log_probs, s.live_lengths, row_limits[:, None], alpha)
    return (s.step < limit) & jnp.any((bound > worst_finished) & (s.step < row_limits))

  def body(s: _BeamState) -> _BeamState:
    step = s.step
    logits, new_cache = extend(s.cache, s.inputs, start.start_index + step)
    vocab = logits.shape[-1]
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1).reshape(batch, k, vocab)
    # A forced position leaves one choice per beam, at no cost, so the beams
    # go through it unchanged.
    forced = _column(start.forced_mask, step)  # [B]
    forced_token = _column(start.forced_tokens, step).astype(jnp.int32)
    forced_log_probs = jnp.where(jnp.arange(vocab) == forced_token[:, None], 0.0, -jnp.inf)
    log_probs = jnp.where(forced[:, None, None], forced_log_probs[:, None, :], log_probs)

    # 2K candidates hold at most K EOS ones (one per beam), so always K to go on.
    candidates = (s.live_log_probs[:, :, None] + log_probs).reshape(batch, k * vocab)
    cand_log_probs, flat = jax.lax.top_k(candidates, min(2 * k, k * vocab))  # sorted
    cand_beam = (flat // vocab).astype(jnp.int32)
    cand_token = (flat % vocab).astype(jnp.int32)
    cand_lengths = (jnp.take_along_axis(s.live_lengths, cand_beam, axis=1)
                    + (~forced)[:, None].astype(jnp.int32))
    cand_eos = (cand_token == settings.eos_id) & ~forced[:, None]

    # Live: the best K candidates without EOS. A stable sort on the EOS flag
    # keeps the score order and, unlike masking EOS to -inf, never lets an
    # EOS candidate tie in with impossible (-inf) ones.
    pick = jnp.argsort(cand_eos, axis=1, stable=True)[:, :k]
    live_beam = jnp.take_along_axis(cand_beam, pick, axis=1)
    live_token = jnp.take_along_axis(cand_token, pick, axis=1)
    live_tokens = jnp.take_along_axis(s.live_tokens, live_beam[:, :, None], axis=1)

    # Finished: the best K of the old finished beams and this step's EOS ones.
    new_scores = jnp.where(cand_eos, cand_log_probs / brevity_penalty(cand_lengths, alpha),
                           -jnp.inf)
    finished_scores, fin_pick = jax.lax.top_k(
        jnp.concatenate([s.finished_scores, new_scores], axis=1), k)
    from_old = fin_pick < k
    old_pick = jnp.minimum(fin_pick, k - 1)
    new_pick = jnp.maximum(fin_pick - k, 0)
    new_seqs = jnp.take_along_axis(
        s.live_tokens, jnp.take_along_axis(cand_beam, new_pick, axis=1)[:, :, None], axis=1)
    new_seqs = jax.lax.dynamic_update_index_in_dim(
        new_seqs, jnp.full((batch, k), settings.eos_id, jnp.int32), step, axis=2)
    old_seqs = jnp.take_along_axis(s.finished_tokens, old_pick[:, :, None], axis=1)
    finished_lengths = jnp.where(from_old,
                                 jnp.take_along_axis(s.finished_lengths, old_pick, axis=1),
                                 jnp.take_along_axis(cand_lengths, new_pick, axis=1))

    # A row past its own limit keeps its beams, as if the loop had stopped there.
    active = step < row_limits  # [B]
    live_beam = jnp.where(active[:, None], live_beam, jnp.arange(k, dtype=jnp.int32))

    def keep(new, old):
      return jnp.where(active.reshape(-1, *([1] * (new.ndim - 1))), new, old)

    return _BeamState(
        step=step + 1,
        cache=reorder_cache(new_cache, (row_base + live_beam).reshape(-1)),
        inputs=live_token.reshape(-1),
        live_tokens=keep(
            jax.lax.dynamic_update_index_in_dim(live_tokens, live_token, step, axis=2),
            s.live_tokens),
        live_log_probs=keep(jnp.take_along_axis(cand_log_probs, pick, axis=1),
                            s.live_log_probs),
        live_lengths=keep(jnp.take_along_axis(cand_lengths, pick, axis=1), s.live_lengths),
        finished_tokens=keep(jnp.where(from_old[:, :, None], old_seqs, new_seqs),
                             s.finished_tokens),
        finished_scores=keep(finished_scores, s.finished_scores),
        finished_lengths=keep(finished_lengths, s.finished_lengths))

  init = _BeamState(
      step=jnp.zeros((), jnp.int32),
      cache=expand_cache(cache, jnp.repeat(jnp.arange(batch, dtype=jnp.int32), k)),
      inputs=jnp.repeat(start.first_tokens.astype(jnp.int32), k),
      live_tokens=jnp.full((batch, k, start.num_steps), settings.pad_id, jnp.int32),
      # Only beam 0 is alive at first, so the K copies of a row do not all
      # pick the same first token.
      live_log_probs=jnp.tile(jnp.where(jnp.arange(k) == 0, 0.0, -jnp.inf), (batch, 1)),
      live_lengths=jnp.zeros((batch, k), jnp.int32),
      finished_tokens=jnp.full((batch, k, start.num_steps), settings.pad_id, jnp.int32),
      finished_scores=jnp.full((batch, k), -jnp.inf, jnp.float32),
      finished_lengths=jnp.zeros((batch, k), jnp.int32))
  s = jax.lax.while_loop(cond, body, init)

  # Rows short of K finished beams take their best live ones: finished beams
  # first, then live beams by normalised score; then all by score.
  live_scores = s.live_log_probs / brevity_penalty(s.live_lengths, alpha)
  scores = jnp.concatenate([s.finished_scores, live_scores], axis=1)  # [B, 2K]
  is_finished = jnp.concatenate([s.finished_scores > -jnp.inf,
                                 jnp.zeros((batch, k), bool)], axis=1)
  chosen = jnp.lexsort((-scores, ~is_finished), axis=-1)[:, :k]
  chosen = jnp.take_along_axis(
      chosen, jnp.argsort(-jnp.take_along_axis(scores, chosen, axis=1), axis=1, stable=True),
      axis=1)
  tokens = jnp.concatenate([s.finished_tokens, s.live_tokens], axis=1)
  lengths = jnp.concatenate([s.finished_lengths, s.live_lengths], axis=1)
  return DecodeOutput(tokens=jnp.take_along_axis(tokens, chosen[:, :, None], axis=1),
                      scores=jnp.take_along_axis(scores, chosen, axis=1),
                      lengths=jnp.take_along_axis(lengths, chosen, axis=1))
