"""Tests for paxlike.decoding.generate: greedy, sampling and beam search.

The model is a toy whose cache is a rolling hash of every (token, index) fed
so far, one per row: logits = table[hash] + bias[index]. The logits depend on
the whole prefix, so a wrong cache reorder in beam search shows up, and a
numpy mirror of it can enumerate all V**L sequences for exhaustive checks.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

VOCAB = 5
EOS = 1
PAD = 0
NUM_HASHES = 257

# extend calls actually executed (a jax.debug.callback per call), to see the
# while loop exit early.
_calls = [0]


def _count_call():
  _calls[0] += 1


def _next_hash(h, tokens, index):
  return (h * 31 + tokens * 7 + index * 3 + 1) % NUM_HASHES


def _make_run():
  """The jitted decode over the toy model; compiled once per settings/shapes."""
  import jax
  import jax.numpy as jnp

  from paxlike import decoding

  def gather_cache(cache, indices):
    return jax.tree.map(lambda x: jnp.take(x, indices, axis=0), cache)

  @functools.partial(jax.jit, static_argnames=("settings", "private_beams"))
  def run(table, bias, h0, start, key, settings, private_beams=0):
    def extend(cache, tokens, index):
      jax.debug.callback(_count_call)
      h = _next_hash(cache["h"], tokens, index)
      logits = table[h] + bias[index][None, :]
      return logits, {"h": h}

    cache = {"h": h0}
    if private_beams:
      # Beam search with a beam count generate() would route to greedy.
      return decoding._beam_search(extend, cache, start, settings, private_beams, gather_cache)
    return decoding.generate(extend, cache, start, settings, key, gather_cache)

  return run


_RUN = None


def _run(model, start, settings, key=None, private_beams=0):
  """Decodes with the toy model; returns numpy (tokens, scores, lengths) and the call count."""
  import jax

  global _RUN
  if _RUN is None:
    _RUN = _make_run()
  key = jax.random.key(0) if key is None else key
  jax.effects_barrier()
  before = _calls[0]
  out = _RUN(model.table, model.bias, model.h0, start, key, settings,
             private_beams=private_beams)
  out = jax.tree.map(np.asarray, out)
  jax.effects_barrier()
  return out.tokens, out.scores, out.lengths, _calls[0] - before


class ToyModel:
  """Random logits table plus a per-index bias; a numpy mirror for references."""

  def __init__(self, seed, batch, scale=1.5, max_index=64, table=None):
    rng = np.random.default_rng(seed)
    self.table = (rng.normal(size=(NUM_HASHES, VOCAB)) * scale).astype(np.float32)
    if table is not None:
      self.table = table.astype(np.float32)
    self.bias = np.zeros((max_index, VOCAB), np.float32)
    self.h0 = rng.integers(0, NUM_HASHES, size=batch).astype(np.int32)
    self.batch = batch

  def step(self, h, token, index):
    """(new hash, log-probs [V] in float64) of feeding token at index."""
    h = int(_next_hash(h, token, index))
    logits = self.table[h].astype(np.float64) + self.bias[index]
    logits = logits - logits.max()
    return h, logits - np.log(np.exp(logits).sum())


def _start(model, num_steps, first=3, start_index=2, limit=None, forced=None):
  """A DecodeStart; forced is {row: [tokens forced from position 0]}."""
  import jax.numpy as jnp

  from paxlike import decoding

  batch = model.batch
  forced_tokens = np.zeros((batch, num_steps), np.int32)
  forced_mask = np.zeros((batch, num_steps), bool)
  for row, toks in (forced or {}).items():
    forced_tokens[row, :len(toks)] = toks
    forced_mask[row, :len(toks)] = True
  return decoding.DecodeStart(
      first_tokens=jnp.full((batch,), first, jnp.int32),
      start_index=jnp.int32(start_index),
      forced_tokens=jnp.asarray(forced_tokens),
      forced_mask=jnp.asarray(forced_mask),
      limit=jnp.int32(num_steps if limit is None else limit),
      num_steps=num_steps)


def _settings(**kw):
  from paxlike import decoding

  kw.setdefault("eos_id", EOS)
  kw.setdefault("pad_id", PAD)
  return decoding.DecodeSettings(**kw)


def _bp(length, alpha):
  return ((5.0 + length) / 6.0) ** alpha


def _rescore(model, start, row, tokens, alpha=None):
  """(score, length) of one output row under the toy model; checks the pad rule.

  alpha None: the plain log-prob sum (greedy / sampling); else divided by the
  brevity penalty (beam search).
  """
  first = int(np.asarray(start.first_tokens)[row])
  index = int(start.start_index)
  mask = np.asarray(start.forced_mask)[row]
  h, prev, total, length = int(model.h0[row]), first, 0.0, 0
  ended_at = None
  for i, tok in enumerate(tokens):
    if ended_at is not None or i >= int(start.limit):
      assert tok == PAD, f"row {row}: token {tok} after EOS ({ended_at}) or limit: {tokens}"
      continue
    h, logp = model.step(h, prev, index + i)
    if not mask[i]:
      total += logp[tok]
      length += 1
      if tok == EOS:
        ended_at = i
    prev = tok
  score = total if alpha is None else total / _bp(length, alpha)
  return score, length


def _greedy_reference(model, start, num_steps, limit=None):
  """Greedy decode in numpy: (tokens [B, S], scores [B], lengths [B])."""
  limit = num_steps if limit is None else limit
  fmask, ftok = np.asarray(start.forced_mask), np.asarray(start.forced_tokens)
  tokens = np.full((model.batch, num_steps), PAD, np.int32)
  scores = np.zeros(model.batch)
  lengths = np.zeros(model.batch, np.int32)
  for b in range(model.batch):
    h, prev = int(model.h0[b]), int(np.asarray(start.first_tokens)[b])
    for i in range(limit):
      h, logp = model.step(h, prev, int(start.start_index) + i)
      tok = int(ftok[b, i]) if fmask[b, i] else int(np.argmax(logp))
      tokens[b, i] = tok
      prev = tok
      if not fmask[b, i]:
        scores[b] += logp[tok]
        lengths[b] += 1
        if tok == EOS:
          break
  return tokens, scores, lengths


def _completed_sequences(model, start, row, num_steps, alpha):
  """Every sequence that ends in EOS within num_steps, best first: [(score, tokens)]."""
  out = []
  index0 = int(start.start_index)

  def rec(h, prev, prefix, total):
    i = len(prefix)
    if i == num_steps:
      return
    h, logp = model.step(h, prev, index0 + i)
    for v in range(VOCAB):
      if v == EOS:
        seq = prefix + (v,)
        out.append((float((total + logp[v]) / _bp(len(seq), alpha)), seq))
      else:
        rec(h, v, prefix + (v,), total + logp[v])

  rec(int(model.h0[row]), int(np.asarray(start.first_tokens)[row]), (), 0.0)
  return sorted(out, key=lambda x: -x[0])


def _check_beams(model, start, tokens, scores, lengths, alpha):
  """Scores sorted, and each beam's score/length/padding match a recomputation."""
  batch, k, _ = tokens.shape
  for b in range(batch):
    assert np.all(np.diff(scores[b]) <= 1e-6), scores[b]
    for j in range(k):
      want, length = _rescore(model, start, b, tokens[b, j].tolist(), alpha)
      np.testing.assert_allclose(scores[b, j], want, rtol=1e-5, atol=1e-5)
      assert lengths[b, j] == length


# Most tests share one shape and two settings, so the decode compiles once
# for each (compiling, not running, is what these tests spend their time on).
BATCH, STEPS = 4, 6


def _greedy():
  return _settings()


def _beam():
  return _settings(num_beams=3, alpha=0.6)


# ------------------------------------------------------------ beam search


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_search_matches_exhaustive_search(alpha):
  num_steps = 4
  model = ToyModel(seed=1, batch=2)
  # Only EOS is possible at the last position, so every sequence completes
  # and the 4**3 = 64 live prefixes of the widest step all fit in 64 beams:
  # beam search then sees every completed sequence and must return the top 64.
  model.bias[2 + num_steps - 1, :] = -1e9
  model.bias[2 + num_steps - 1, EOS] = 0.0
  k = 64
  start = _start(model, num_steps, start_index=2)
  tokens, scores, lengths, _ = _run(model, start, _settings(num_beams=k, alpha=alpha))
  assert tokens.shape == (2, k, num_steps) and scores.shape == (2, k)
  _check_beams(model, start, tokens, scores, lengths, alpha)
  for b in range(2):
    ranked = _completed_sequences(model, start, b, num_steps, alpha)
    assert len(ranked) == 1 + 4 + 16 + 64
    best_score, best_seq = ranked[0]
    want = list(best_seq) + [PAD] * (num_steps - len(best_seq))
    assert tokens[b, 0].tolist() == want
    np.testing.assert_allclose(scores[b, 0], best_score, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(scores[b], [s for s, _ in ranked[:k]], atol=1e-5, rtol=1e-5)


def test_beam_search_is_consistent_and_fills_with_live_beams():
  # A weak EOS: rows end with fewer than K finished beams, so live ones fill
  # in; every beam must still score what its tokens score.
  model = ToyModel(seed=2, batch=BATCH)
  model.bias[:, EOS] = -3.0
  start = _start(model, STEPS)
  tokens, scores, lengths, _ = _run(model, start, _beam())
  assert tokens.shape == (BATCH, 3, STEPS) and lengths.shape == (BATCH, 3)
  _check_beams(model, start, tokens, scores, lengths, alpha=0.6)
  assert np.all(np.isfinite(scores))
  assert np.any(tokens[:, :, -1] != PAD)  # some beams are live ones that ran to the end
  for b in range(BATCH):
    assert len({tuple(t) for t in tokens[b].tolist()}) == 3  # distinct beams


def test_beam_search_waits_for_live_beams_the_brevity_penalty_can_lift():
  # Logits depend on the position only. After two steps the finished set is
  # full (worst [3, EOS]: -2.26) and the best live beam, [2, 0], has log-prob
  # -2.77: over the penalty of its next length (-2.33) it could not win, but
  # over that of the longest length (6 tokens: -1.92) it can, and it does, as it
  # goes on for free to [2, 0, 2, 2, 2, EOS]. Stopping on the first bound
  # would return the three finished beams of step 1.
  model = ToyModel(seed=10, batch=BATCH, table=np.zeros((NUM_HASHES, VOCAB)))
  probs = {0: [0.06, 0.3, 0.45, 0.14, 0.05],  # tokens 0..4; EOS is 1
           1: [0.14, 0.6, 0.05, 0.12, 0.09]}
  sure = np.full(VOCAB, -30.0)
  for i in range(STEPS):
    model.bias[2 + i] = np.log(probs[i]) if i in probs else sure
  model.bias[2 + 2:2 + STEPS - 1, 2] = 0.0
  model.bias[2 + STEPS - 1, EOS] = 0.0
  start = _start(model, STEPS)
  tokens, scores, lengths, calls = _run(model, start, _beam())
  _check_beams(model, start, tokens, scores, lengths, alpha=0.6)
  assert calls == STEPS
  assert tokens[0].tolist() == [[2, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], [2, 0, 2, 2, 2, 1]]
  np.testing.assert_allclose(scores[0, 2], np.log(0.45 * 0.14) / _bp(6, 0.6), rtol=1e-4)


def test_beam_search_with_one_beam_equals_greedy():
  model = ToyModel(seed=3, batch=BATCH)
  # EOS is either far ahead or far behind every other token, so it is never
  # the runner-up that one-beam search could finish on while greedy goes on.
  h = np.arange(NUM_HASHES)
  model.table[:, EOS] = np.where(h % 5 == 0, 20.0, -20.0)
  start = _start(model, STEPS)
  greedy_tokens, greedy_scores, greedy_lengths, _ = _run(model, start, _greedy())
  beam_tokens, beam_scores, beam_lengths, _ = _run(model, start, _settings(alpha=0.0),
                                                   private_beams=1)
  assert beam_tokens.shape == greedy_tokens.shape == (BATCH, 1, STEPS)
  np.testing.assert_array_equal(beam_tokens, greedy_tokens)
  np.testing.assert_allclose(beam_scores, greedy_scores, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(beam_lengths, greedy_lengths)
  ref_tokens, ref_scores, _ = _greedy_reference(model, start, STEPS)
  np.testing.assert_array_equal(greedy_tokens[:, 0], ref_tokens)
  np.testing.assert_allclose(greedy_scores[:, 0], ref_scores, rtol=1e-5, atol=1e-5)
  # Some rows do end early, so the EOS path is exercised.
  assert np.any(greedy_lengths < STEPS)


# ------------------------------------------------------------ greedy / EOS


def test_eos_ends_rows_and_the_loop_exits_early():
  model = ToyModel(seed=4, batch=BATCH)
  start_index = 2
  # EOS wins from output position 2 on (index start_index + 2).
  model.bias[start_index + 2:, EOS] = 30.0
  start = _start(model, STEPS, start_index=start_index)
  tokens, scores, lengths, calls = _run(model, start, _greedy())
  ref_tokens, ref_scores, ref_lengths = _greedy_reference(model, start, STEPS)
  np.testing.assert_array_equal(tokens[:, 0], ref_tokens)
  np.testing.assert_allclose(scores[:, 0], ref_scores, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(lengths[:, 0], ref_lengths)
  assert np.all(lengths[:, 0] <= 3)
  for b in range(BATCH):
    n = lengths[b, 0]
    assert tokens[b, 0, n - 1] == EOS and np.all(tokens[b, 0, n:] == PAD)
  assert calls == int(lengths.max()) < STEPS

  # Beam search stops too once no live beam can beat the finished ones.
  tokens, scores, lengths, calls = _run(model, start, _beam())
  _check_beams(model, start, tokens, scores, lengths, alpha=0.6)
  assert np.all(tokens[:, :, 3:] == PAD)
  assert calls <= 4 < STEPS


def test_forced_positions_are_kept_and_not_scored():
  model = ToyModel(seed=5, batch=BATCH)
  # Row 1's forced prefix holds EOS: it must not end the row.
  forced = {1: [4, EOS], 2: [2, 3, 4], 3: [EOS]}
  start = _start(model, STEPS, forced=forced)
  tokens, scores, lengths, _ = _run(model, start, _greedy())
  ref_tokens, ref_scores, ref_lengths = _greedy_reference(model, start, STEPS)
  np.testing.assert_array_equal(tokens[:, 0], ref_tokens)
  np.testing.assert_allclose(scores[:, 0], ref_scores, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(lengths[:, 0], ref_lengths)
  for row, toks in forced.items():
    assert tokens[row, 0, :len(toks)].tolist() == toks
    assert lengths[row, 0] <= STEPS - len(toks)
  # The forced EOS did not end rows 1 and 3: they generated after it.
  assert lengths[1, 0] >= 1 and tokens[1, 0, 2] != PAD
  assert lengths[3, 0] >= 1 and tokens[3, 0, 1] != PAD

  tokens, scores, lengths, _ = _run(model, start, _beam())
  _check_beams(model, start, tokens, scores, lengths, alpha=0.6)
  for row, toks in forced.items():
    assert np.all(tokens[row, :, :len(toks)] == np.array(toks)), tokens[row]
    assert np.all(lengths[row] <= STEPS - len(toks))
  for b in range(BATCH):
    assert len({tuple(t) for t in tokens[b].tolist()}) == 3


def test_limit_stops_early():
  limit = 2
  model = ToyModel(seed=6, batch=BATCH)
  model.bias[:, EOS] = -30.0  # no row ends by itself
  start = _start(model, STEPS, limit=limit)
  tokens, scores, lengths, calls = _run(model, start, _greedy())
  ref_tokens, ref_scores, _ = _greedy_reference(model, start, STEPS, limit=limit)
  np.testing.assert_array_equal(tokens[:, 0], ref_tokens)
  np.testing.assert_allclose(scores[:, 0], ref_scores, rtol=1e-5, atol=1e-5)
  assert np.all(tokens[:, 0, limit:] == PAD) and np.all(tokens[:, 0, :limit] != PAD)
  assert np.all(lengths == limit) and calls == limit

  tokens, scores, lengths, calls = _run(model, start, _beam())
  assert np.all(tokens[:, :, limit:] == PAD) and calls == limit
  # The best beams are live ones cut at the limit (a finished beam, if any,
  # ends in the unlikely EOS and ranks below them).
  assert np.all(lengths <= limit) and np.all(lengths[:, 0] == limit)
  _check_beams(model, start, tokens, scores, lengths, alpha=0.6)


# ------------------------------------------------------------------ sampling


def test_sampling_with_top_k_1_or_tiny_top_p_is_greedy():
  import jax

  model = ToyModel(seed=7, batch=BATCH)
  start = _start(model, STEPS)
  greedy = _run(model, start, _greedy())
  for settings in (_settings(temperature=1.0, top_k=1), _settings(temperature=1.0, top_p=1e-6)):
    for seed in (0, 1):
      tokens, scores, lengths, _ = _run(model, start, settings, key=jax.random.key(seed))
      np.testing.assert_array_equal(tokens, greedy[0])
      # At temperature 1 the score is the plain log-prob sum, as greedy's.
      np.testing.assert_allclose(scores, greedy[1], rtol=1e-5, atol=1e-5)
      np.testing.assert_array_equal(lengths, greedy[2])


def test_sampling_is_reproducible_per_key():
  import jax

  model = ToyModel(seed=8, batch=BATCH, table=np.zeros((NUM_HASHES, VOCAB)))
  model.bias[:, EOS] = -30.0  # flat over the other tokens, no row ends
  start = _start(model, STEPS)
  settings = _settings(temperature=1.0)
  a = _run(model, start, settings, key=jax.random.key(11))[0]
  b = _run(model, start, settings, key=jax.random.key(11))[0]
  c = _run(model, start, settings, key=jax.random.key(12))[0]
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  assert not np.any(a == EOS)
  # Steps draw with different keys: a row is not one token repeated.
  assert all(len(set(row.tolist())) > 1 for row in a[:, 0])


# top_k 2 keeps {2, 3}; top_p 0.7 keeps {2, 3, 4}; top_k 3 then top_p 0.7 keeps
# {2, 3} (0.2 / 0.85 is the tail past 0.7 once the top 3 are renormalised).
_FIRST_STEP_PROBS = np.array([0.05, 0.1, 0.35, 0.3, 0.2])


def _first_step_samples(settings, batch=4000):
  """Samples of output position 0 for many copies of one row, and its logits."""
  import jax

  model = ToyModel(seed=9, batch=batch)
  model.h0[:] = model.h0[0]
  start = _start(model, 1)
  # At temperature 0.7 the first step's probabilities are _FIRST_STEP_PROBS.
  h = _next_hash(int(model.h0[0]), 3, int(start.start_index))
  model.table[h] = 0.7 * np.log(_FIRST_STEP_PROBS)
  tokens, scores, _, _ = _run(model, start, settings, key=jax.random.key(3))
  _, logp = model.step(int(model.h0[0]), 3, int(start.start_index))
  return tokens[:, 0, 0], scores[:, 0], logp


def _expected_probs(logp, temperature, top_k=0, top_p=1.0):
  """numpy mirror of the documented cut: top_k, then top_p on the renormalised rest."""
  logits = logp / temperature
  probs = np.exp(logits - logits.max())
  if top_k:
    probs[np.argsort(-probs)[top_k:]] = 0.0
  probs /= probs.sum()
  if top_p < 1.0:
    order = np.argsort(-probs)
    before = np.cumsum(probs[order]) - probs[order]
    probs[order[before >= top_p]] = 0.0
    probs /= probs.sum()
  return probs, logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()


@pytest.mark.parametrize("top_k,top_p,kept", [(2, 1.0, {2, 3}), (0, 0.7, {2, 3, 4}),
                                             (3, 0.7, {2, 3})])
def test_sampling_frequencies_follow_the_cut(top_k, top_p, kept):
  temperature = 0.7
  samples, scores, logp = _first_step_samples(
      _settings(temperature=temperature, top_k=top_k, top_p=top_p))
  probs, scaled_log_probs = _expected_probs(logp, temperature, top_k, top_p)
  assert set(np.flatnonzero(probs).tolist()) == kept  # the mirror cuts as intended
  assert set(samples.tolist()) == kept, np.bincount(samples, minlength=VOCAB)
  freqs = np.bincount(samples, minlength=VOCAB) / len(samples)
  np.testing.assert_allclose(freqs, probs, atol=0.03)
  # The documented score: log-prob under the temperature-scaled, uncut distribution.
  np.testing.assert_allclose(scores, scaled_log_probs[samples], rtol=1e-5, atol=1e-5)


def test_settings_are_checked():
  with pytest.raises(ValueError, match="num_beams"):
    model = ToyModel(seed=0, batch=1)
    _run(model, _start(model, 2), _settings(num_beams=0))


def test_exhaustive_helper_covers_all_sequences():
  # Guard for the exhaustive test: 5**4 sequences, each ending at its first EOS.
  model = ToyModel(seed=1, batch=1)
  start = _start(model, 4)
  ranked = _completed_sequences(model, start, 0, 4, 0.0)
  seqs = {s for _, s in ranked}
  want = set()
  for seq in itertools.product(range(VOCAB), repeat=4):
    if EOS in seq:
      want.add(seq[:seq.index(EOS) + 1])
  assert seqs == want
  # Probabilities of the completed and unfinished sequences sum to one.
  total = sum(np.exp(s) for s, _ in ranked)
  assert 0 < total < 1


def test_top_k_then_top_p_renormalises_over_the_tokens_tied_with_the_kth():
  import jax.numpy as jnp

  from paxlike.decoding import _cut_logits

  rng = np.random.default_rng(5)
  logits = rng.integers(0, 4, size=(300, 12)).astype(np.float32)  # many ties
  top_k, top_p = 3, 0.6
  got = np.isfinite(np.asarray(_cut_logits(jnp.asarray(logits), top_k, top_p)))
  for row, kept in zip(logits, got, strict=True):
    kth = np.sort(row)[::-1][top_k - 1]
    probs = np.where(row >= kth, np.exp(row - row.max()), 0.0)  # ties with the k-th stay
    probs /= probs.sum()
    order = np.argsort(-row, kind="stable")
    before = np.cumsum(probs[order]) - probs[order]
    smallest = row[order][(before < top_p) & (probs[order] > 0)].min()
    np.testing.assert_array_equal(kept, (row >= kth) & (row >= smallest), err_msg=str(row))
