"""T5Model: KV-cached decoding, packing, dropout, relative position buckets.

Parity with transformers' T5 lives in hf_interop_test.py; these tests hold
the model to itself (cached vs recomputed, packed vs unpacked).
"""

from __future__ import annotations

import numpy as np
import pytest

VOCAB = 50


def _model(**kwargs):
  from paxlike.models.t5 import T5Model

  fields = dict(vocab_size=VOCAB, model_dims=16, num_encoder_layers=2, num_decoder_layers=2,
                num_heads=2, dim_per_head=8, hidden_dims=24)
  return T5Model(**{**fields, **kwargs})


def _batch(enc_lens=(7, 3), dec_len=6, seed=0) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  enc = rng.integers(2, VOCAB, (len(enc_lens), max(enc_lens))).astype(np.int32)
  for r, n in enumerate(enc_lens):
    enc[r, n:] = 0
  targets = rng.integers(2, VOCAB, (len(enc_lens), dec_len)).astype(np.int32)
  inputs = np.concatenate([np.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1)
  return {"encoder_input_tokens": enc, "decoder_input_tokens": inputs,
          "decoder_target_tokens": targets,
          "decoder_loss_weights": np.ones(targets.shape, np.float32)}


def _init(model, batch, seed=0):
  """Random parameters in the model's tree (T5-like scales).

  Filled with numpy from the init's shapes: compiling T5's jax.random
  initialisers costs several seconds on CPU, the model's init adds nothing
  these tests look at.
  """
  import jax
  from flax import linen as nn

  abstract = nn.meta.unbox(jax.eval_shape(
      lambda: model.init(jax.random.key(0), batch, method="fprop")["params"]))
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    names = [p.key for p in path]
    shape = leaf.shape
    if names[-1] == "scale":
      return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if names[-1] in ("embedding", "rel_embedding"):
      std = 1.0 if names[-1] == "embedding" else 0.5
    elif names[-2] in ("query", "key", "value"):  # [d, heads, d_kv]
      std = shape[-3] ** -0.5
    elif names[-2] == "out":  # [heads, d_kv, d]
      std = (shape[-3] * shape[-2]) ** -0.5
    else:  # [in, out]
      std = shape[-2] ** -0.5
    return (std * rng.standard_normal(shape)).astype(np.float32)

  return jax.tree_util.tree_map_with_path(fill, abstract)


@pytest.mark.parametrize("scanned", [False, True], ids=["unrolled", "scanned"])
def test_cached_decode_equals_recomputation(scanned):
  """prefill + one extend per position gives fprop's logits; so does a reordered cache."""
  import jax
  import jax.numpy as jnp

  from paxlike.decoding import DecodeSettings

  model = _model(use_repeated_layer=scanned, tie_embeddings=scanned)
  batch = _batch()
  params = _init(model, batch)
  want = np.asarray(jax.jit(lambda p, b: model.apply({"params": p}, b))(params, batch))
  steps = batch["decoder_input_tokens"].shape[1]
  prefill = jax.jit(lambda p, b: model.apply({"params": p}, b, DecodeSettings(
      max_decode_length=steps), method="prefill", mutable=["cache"]))
  start, variables = prefill(params, {"encoder_input_tokens": batch["encoder_input_tokens"]})
  assert start.num_steps == steps and not np.asarray(start.forced_mask).any()
  np.testing.assert_array_equal(start.first_tokens, [model.decoder_start_id] * 2)

  @jax.jit
  def extend(cache, tokens, index):
    logits, mutated = model.apply({"params": params, "cache": cache}, tokens, index,
                                  method="extend", mutable=["cache"])
    return logits, mutated["cache"]

  cache, order = variables["cache"], np.arange(2)
  for i in range(steps):
    if i == steps // 2:  # what beam search does: rows swap places mid-decode
      order = order[::-1]
      cache = model.gather_cache(cache, jnp.asarray([1, 0]))
    tokens = batch["decoder_input_tokens"][order, i]
    logits, cache = extend(cache, jnp.asarray(tokens), jnp.asarray(i, jnp.int32))
    diff = np.abs(np.asarray(logits) - want[order, i]).max()
    assert diff < 1e-5, f"position {i}: cached logits differ from fprop's by {diff}"


@pytest.mark.parametrize("scanned", [False, True], ids=["unrolled", "scanned"])
def test_beam_search_shares_encoder_caches_across_beams(scanned):
  """Beam search keeps encoder keys/values once per example and decodes as with a copy per beam.

  The reference expands and reorders every cache leaf (decoding.generate's
  plain gather_cache path); T5Model's hooks must give the same beams.
  """
  import jax

  from paxlike import decoding

  model = _model(use_repeated_layer=scanned, tie_embeddings=scanned)
  batch = _batch(enc_lens=(7, 3, 5))
  params = _init(model, batch)
  settings = decoding.DecodeSettings(max_decode_length=6, num_beams=3, eos_id=-1)
  key = jax.random.key(0)
  enc = {"encoder_input_tokens": batch["encoder_input_tokens"]}
  start, variables = model.apply({"params": params}, enc, settings, method="prefill",
                                 mutable=["cache"])
  shapes = []

  def extend(cache, tokens, index):
    shapes.append({jax.tree_util.keystr(p): x.shape
                   for p, x in jax.tree_util.tree_leaves_with_path(cache)})
    logits, mutated = model.apply({"params": params, "cache": cache}, tokens, index,
                                  method="extend", mutable=["cache"])
    return logits, mutated["cache"]

  def run(hooks):
    return jax.jit(lambda c: decoding.generate(extend, c, start, settings, key, **hooks))(
        variables["cache"])

  shared = run({"gather_cache": model.gather_cache, "expand_cache": model.expand_cache,
                "reorder_cache": model.reorder_cache})
  cross = [s for p, s in shapes[0].items() if "encoder_decoder_attention" in p]
  assert cross and all(s[int(scanned)] == 3 for s in cross), cross  # rows, not rows x beams
  copied = run({"gather_cache": model.gather_cache})
  np.testing.assert_array_equal(shared.tokens, copied.tokens)
  np.testing.assert_allclose(shared.scores, copied.scores, rtol=1e-5)


def test_packed_examples_score_like_unpacked_ones():
  """Two examples in one row (segment ids, positions) lose what they lose in two rows."""
  import jax

  model = _model()
  a, b = _batch(enc_lens=(5,), dec_len=4, seed=1), _batch(enc_lens=(3,), dec_len=3, seed=2)
  unpacked = _batch(enc_lens=(5, 3), dec_len=4)
  for k in ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens"):
    unpacked[k] = np.zeros_like(unpacked[k])
    unpacked[k][0, :a[k].shape[1]] = a[k][0]
    unpacked[k][1, :b[k].shape[1]] = b[k][0]
  unpacked["decoder_loss_weights"] = (np.arange(4)[None] < [[4], [3]]).astype(np.float32)

  enc_len, dec_len = 10, 9  # both examples, then padding
  packed = {k: np.zeros((1, n), np.int32) for k, n in (
      ("encoder_input_tokens", enc_len), ("encoder_segment_ids", enc_len),
      ("encoder_positions", enc_len), ("decoder_input_tokens", dec_len),
      ("decoder_target_tokens", dec_len), ("decoder_segment_ids", dec_len),
      ("decoder_positions", dec_len))}
  packed["encoder_input_tokens"][0, :8] = np.concatenate([a["encoder_input_tokens"][0, :5],
                                                          b["encoder_input_tokens"][0, :3]])
  packed["encoder_segment_ids"][0, :8] = [1] * 5 + [2] * 3
  packed["encoder_positions"][0, :8] = [*range(5), *range(3)]
  for k in ("decoder_input_tokens", "decoder_target_tokens"):
    packed[k][0, :7] = np.concatenate([a[k][0], b[k][0]])
  packed["decoder_segment_ids"][0, :7] = [1] * 4 + [2] * 3
  packed["decoder_positions"][0, :7] = [*range(4), *range(3)]

  params = _init(model, unpacked)
  fprop = jax.jit(lambda p, batch: model.apply({"params": p}, batch, method="fprop")[1])

  def loss_sum(batch, weights):
    metrics = fprop(params, {**batch, "decoder_loss_weights": weights.astype(np.float32)})
    return float(metrics["loss"] * metrics["num_tokens"])

  rows, cols = np.indices(unpacked["decoder_target_tokens"].shape)
  for example, (row, n) in enumerate([(0, 4), (1, 3)]):
    want = loss_sum(unpacked, (rows == row) & (cols < n))
    got = loss_sum(packed, packed["decoder_segment_ids"] == example + 1)
    assert abs(got - want) < 1e-5 * max(1.0, abs(want)), (example, got, want)


def test_dropout_only_with_a_dropout_rng():
  import jax

  batch = _batch()
  # No remat: forward-only, it changes nothing but XLA's compile time (2.5x with dropout).
  kwargs = dict(use_repeated_layer=True, checkpoint_policy="SAVE_EVERYTHING")
  model = _model(dropout_rate=0.3, **kwargs)
  no_dropout = _model(dropout_rate=0.0, **kwargs)
  params = _init(model, batch)
  fprop = lambda m, p, **kw: m.apply({"params": p}, batch, method="fprop", **kw)[0]
  plain, rate_zero = jax.device_get(jax.jit(
      lambda p: (fprop(model, p), fprop(no_dropout, p)))(params))
  train = jax.jit(lambda p, key: fprop(model, p, rngs={"dropout": key}))
  dropped = [float(train(params, jax.random.key(k))) for k in (1, 1, 2)]
  assert plain == rate_zero
  assert dropped[0] != plain
  assert dropped[0] == dropped[1]  # a function of the key
  assert dropped[0] != dropped[2]


def test_relative_position_buckets():
  """T5's buckets: exact near the query, log-spaced further out, one per side (encoder)."""
  import jax.numpy as jnp

  from paxlike.layers.relative_position import relative_position_bucket

  rel = jnp.asarray([0, -1, -7, -8, -15, -16, -127, -128, -500, 1, 7, 16, 500])
  got = relative_position_bucket(rel, bidirectional=True, num_buckets=32, max_distance=128)
  # 16 buckets per side, 8 exact; 8..127 over 8 log buckets; keys after the query + 16.
  np.testing.assert_array_equal(got, [0, 1, 7, 8, 9, 10, 15, 15, 15, 17, 23, 26, 31])
  causal = relative_position_bucket(rel, bidirectional=False, num_buckets=32, max_distance=128)
  np.testing.assert_array_equal(causal[:9], [0, 1, 7, 8, 15, 16, 31, 31, 31])
  np.testing.assert_array_equal(causal[9:], [0, 0, 0, 0])  # later keys: masked anyway


def test_scanned_params_carry_the_layers_axis():
  import jax
  from flax import linen as nn

  model = _model(use_repeated_layer=True)
  boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), _batch(), method="fprop"))
  specs = nn.get_partition_spec(boxed)["params"]
  assert tuple(specs["encoder"]["layers"]["attention"]["query"]["kernel"]) == (
      "layers", "embed", "heads", "kv")
  assert tuple(specs["decoder"]["relpos_bias"]["rel_embedding"]) == ("relpos_buckets", "heads")
  assert tuple(specs["decoder"]["logits_dense"]["kernel"]) == ("embed", "vocab")
