"""paxlike.layers.attention: which implementation runs where, and the XLA path's math."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.errors import UserError
from paxlike.layers import attention, attention_policy

BF16, F16, F32 = jnp.bfloat16, jnp.float16, jnp.float32


# platform, dtype, keyword arguments -> implementation, reason
RULES = [
    ("cuda", BF16, {}, "cudnn", "cuda, bfloat16"),
    ("cuda", F16, {}, "cudnn", "cuda, float16"),
    ("cuda", BF16, {"policy": "cudnn"}, "cudnn", "cuda, bfloat16"),
    ("cuda", BF16, {"policy": "xla"}, "xla", "cuda, bfloat16, policy xla"),
    ("cuda", F32, {}, "xla", "cuda, float32"),
    ("cuda", F32, {"policy": "cudnn"}, "xla", "cuda, float32"),
    ("cpu", BF16, {}, "xla", "cpu"),
    ("cpu", F32, {"policy": "cudnn"}, "xla", "cpu"),
    ("tpu", BF16, {}, "xla", "tpu"),
    ("rocm", BF16, {}, "xla", "rocm"),
    ("cuda", BF16, {"dropout": True}, "xla", "cuda, bfloat16, attention dropout"),
    ("cuda", BF16, {"logit_cap": 50.0}, "xla", "cuda, bfloat16, attention logit cap"),
    ("cuda", BF16, {"logit_cap": -1.0}, "cudnn", "cuda, bfloat16"),  # Pax's "no cap"
    ("cuda", BF16, {"q_len": 1, "kv_len": 128}, "xla", "cuda, bfloat16, one query position"),
    ("cuda", BF16, {"q_len": 1, "kv_len": 128, "has_bias": True}, "xla",
     "cuda, bfloat16, one query position"),
    ("cuda", BF16, {"q_len": 512, "kv_len": 512, "has_bias": True}, "cudnn", "cuda, bfloat16"),
    ("cuda", BF16, {"q_len": 7, "kv_len": 7, "has_bias": True}, "xla",
     "cuda, bfloat16, odd length 7x7 with a bias"),
    ("cuda", BF16, {"q_len": 7, "kv_len": 7}, "cudnn", "cuda, bfloat16"),
    ("cuda", BF16, {"head_dim": 12}, "xla", "cuda, bfloat16, head dim 12"),
    ("cuda", BF16, {"head_dim": 256}, "xla", "cuda, bfloat16, head dim 256"),
    ("cuda", BF16, {"head_dim": 256, "max_head_dim": 256}, "cudnn", "cuda, bfloat16"),
]


@pytest.mark.parametrize("platform,dtype,kwargs,implementation,reason", RULES)
def test_selection_rule(platform, dtype, kwargs, implementation, reason):
  assert attention.choose_implementation(platform, dtype, **kwargs) == (implementation, reason)


def test_log_text():
  assert attention_policy.describe("cudnn", "cuda, bfloat16") == "cudnn fused (cuda, bfloat16)"
  assert attention_policy.describe("xla", "cpu") == "xla (cpu)"


def test_pax_switches_map_onto_the_policy():
  assert attention_policy.policy_from_flags(None, None) == "auto"
  assert attention_policy.policy_from_flags(True, None) == "cudnn"
  assert attention_policy.policy_from_flags(None, True) == "cudnn"
  assert attention_policy.policy_from_flags(False, None) == "xla"
  assert attention_policy.policy_from_flags(False, True) == "xla"  # USE_CUDNN_FLASH_ATTENTION first
  with pytest.raises(UserError, match="USE_CUDNN_FLASH_ATTENTION must be True, False or None"):
    attention_policy.policy_from_flags(1, None)
  with pytest.raises(ValueError, match="choose one of auto, xla, cudnn"):
    attention_policy.set_attention_policy("flash")


def test_policy_context_nests_and_restores():
  before = attention.current_policy()
  with attention_policy.attention_policy("xla"):
    assert attention.current_policy() == "xla"
    with attention_policy.attention_policy("cudnn"):
      assert attention.current_policy() == "cudnn"
    assert attention.current_policy() == "xla"
  assert attention.current_policy() == before


# ------------------------------------------------------------- the XLA path's math


def _softmax(x):
  x = x - x.max(-1, keepdims=True)
  e = np.exp(x)
  return e / e.sum(-1, keepdims=True)


def _hand(q, k, v, *, bias=None, allowed=None, cap=0.0, scale=1.0):
  """float64 attention with numpy; allowed [b, 1|n, t, s] bool."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  logits = np.einsum("btnh,bsnh->bnts", q * scale, k)
  if bias is not None:
    logits = logits + np.asarray(bias, np.float64)
  if cap > 0:
    logits = cap * np.tanh(logits / cap)
  if allowed is not None:
    logits = np.where(allowed, logits, -1e300)
  return np.einsum("bnts,bsnh->btnh", _softmax(logits), v)


@pytest.fixture(scope="module")
def qkv():
  rng = np.random.default_rng(0)
  b, t, n, h = 2, 6, 3, 8
  return [rng.normal(size=(b, t, n, h)).astype(np.float32) for _ in range(3)]


def test_causal_equals_hand_computation(qkv):
  q, k, v = qkv
  t = q.shape[1]
  got = attention.dot_product_attention(*map(jnp.asarray, qkv), is_causal=True, scale=0.35)
  allowed = np.tril(np.ones((t, t), bool))[None, None]
  np.testing.assert_allclose(got, _hand(q, k, v, allowed=allowed, scale=0.35), atol=1e-5)


def test_bias_and_padding_mask_equal_hand_computation(qkv):
  """T5's encoder: a [1, n, t, s] bias and a [b, 1, 1, s] key padding mask."""
  q, k, v = qkv
  b, t, n, _ = q.shape
  bias = np.random.default_rng(1).normal(size=(1, n, t, t)).astype(np.float32)
  valid = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)[:, None, None, :]
  got = attention.dot_product_attention(*map(jnp.asarray, qkv), bias=jnp.asarray(bias),
                                        mask=jnp.asarray(valid))
  np.testing.assert_allclose(got, _hand(q, k, v, bias=bias, allowed=valid), atol=1e-5)


def test_shared_bias_gradient_is_the_batch_sum(qkv):
  """T5's [1, n, t, s] bias, shared by the batch: its gradient on a CPU (summed as a matvec,
  not as XLA's slow reduce over the leading axis) is the plain broadcast's, and the
  jaxpr holds no reduction over the batch."""
  q, k, v = map(jnp.asarray, qkv)
  b, t, n, _ = q.shape
  bias = jnp.asarray(np.random.default_rng(1).normal(size=(1, n, t, t)).astype(np.float32))
  cot = jnp.asarray(np.random.default_rng(2).normal(size=q.shape).astype(np.float32))

  def loss(bias, attend):
    return jnp.sum(attend(q, k, v, bias=bias) * cot)

  def plain(q, k, v, bias):  # the same attention, with the broadcast add autodiff makes
    logits = jnp.einsum("btnh,bsnh->bnts", q, k) + bias
    return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(logits, axis=-1), v)

  got = jax.grad(loss)(bias, attention.dot_product_attention)
  want = jax.grad(loss)(bias, plain)
  assert got.shape == bias.shape
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  batch_sum = "reduce_sum[axes=(0,)"
  assert batch_sum in str(jax.make_jaxpr(jax.grad(loss), static_argnums=1)(bias, plain))
  assert batch_sum not in str(jax.make_jaxpr(jax.grad(loss), static_argnums=1)(
      bias, attention.dot_product_attention))
  # a bias with its own batch rows keeps the plain gradient
  full = jnp.broadcast_to(bias, (b, n, t, t))
  np.testing.assert_allclose(jax.grad(loss)(full, attention.dot_product_attention),
                             jax.grad(loss)(full, plain), rtol=1e-5, atol=1e-6)


def test_segment_ids_with_causal_equal_hand_computation(qkv):
  """Packed rows: a query attends earlier keys of its own segment only."""
  q, k, v = qkv
  t = q.shape[1]
  seg = np.array([[1, 1, 1, 2, 2, 0], [1, 2, 2, 2, 3, 3]], np.int32)
  got = attention.dot_product_attention(*map(jnp.asarray, qkv), is_causal=True,
                                        q_segment_ids=jnp.asarray(seg),
                                        kv_segment_ids=jnp.asarray(seg), scale=0.5)
  allowed = (np.tril(np.ones((t, t), bool))[None, None]
             & (seg[:, None, :, None] == seg[:, None, None, :]))
  np.testing.assert_allclose(got, _hand(q, k, v, allowed=allowed, scale=0.5), atol=1e-5)


def test_logit_cap_equals_hand_computation(qkv):
  q, k, v = (3 * x for x in qkv)  # logits well beyond the cap
  got = attention.dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                        is_causal=True, logit_cap=5.0)
  allowed = np.tril(np.ones((q.shape[1],) * 2, bool))[None, None]
  want = _hand(q, k, v, allowed=allowed, cap=5.0)
  np.testing.assert_allclose(got, want, atol=1e-4)
  uncapped = _hand(q, k, v, allowed=allowed)
  assert np.abs(want - uncapped).max() > 0.1  # the cap changes the answer here


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_a_decode_step_over_the_cache_layout_is_the_same_attention(kv_heads, fresh_run):
  """cached_attention (a decode step, keys/values as [b, kv_heads, s, h], query heads grouped
  on them) equals the attention of the keys/values repeated per query head, with a per-row
  bias, the mask of the written slots, a cap and a scale; a write lands at its position."""
  rng = np.random.default_rng(3)
  b, t, n, s, h = 2, 3, 4, 7, 8
  q = rng.normal(size=(b, t, n, h)).astype(np.float32) * 2
  k, v = (rng.normal(size=(b, s, kv_heads, h)).astype(np.float32) * 2 for _ in range(2))
  bias = rng.normal(size=(b, n, t, s)).astype(np.float32)
  written = (np.arange(s) <= 4)[None, None, None, :]
  got = attention.cached_attention(
      jnp.asarray(q), attention.to_cache_layout(jnp.asarray(k)),
      attention.to_cache_layout(jnp.asarray(v)), bias=jnp.asarray(bias),
      mask=jnp.asarray(written), logit_cap=4.0, scale=0.5)
  repeat = lambda x: np.repeat(x, n // kv_heads, axis=2)  # query head i reads kv head i // g
  want = _hand(q, repeat(k), repeat(v), bias=bias, allowed=written, cap=4.0, scale=0.5)
  np.testing.assert_allclose(got, want, atol=1e-5)
  # Two rows (beams) over one example's keys are that example's queries, beam-major.
  beams = attention.cached_attention(jnp.asarray(q[:, :1]), attention.to_cache_layout(
      jnp.asarray(k[:1])), attention.to_cache_layout(jnp.asarray(v[:1])))
  one = _hand(q[:, :1].reshape(1, b, n, h), repeat(k[:1]), repeat(v[:1]))
  np.testing.assert_allclose(beams, one.reshape(b, 1, n, h), atol=1e-5)
  assert fresh_run == ["attention: xla (cpu)"]


class _Cache(nn.Module):
  @nn.compact
  def __call__(self, k, v, mode, index=None):
    return attention.use_kv_cache(self, k, v, mode, index)


def test_each_beam_writes_its_own_slot_and_sees_only_its_own_history():
  """A decode's self-attention cache: prefill fills one slot per example, beam search's
  expand gives each beam a slot, a step writes each beam's key/value into its slot, a
  reorder moves only the slot table, and a beam's mask covers the written positions of
  its own history (inherited from its parents' slots)."""
  rng = np.random.default_rng(5)
  examples, length, kv, h, beams = 2, 6, 2, 3, 3
  new = lambda: jnp.asarray(rng.normal(size=(examples * beams, 1, kv, h)), jnp.float32)
  prompt = jnp.asarray(rng.normal(size=(examples, length, kv, h)), jnp.float32)
  cache = _Cache().apply({}, prompt, prompt, "prefill", mutable=["cache"])[1]["cache"]
  axis = lambda path: 0
  cache = attention.expand_slots(cache, jnp.repeat(jnp.arange(examples), beams), axis)

  def step(cache, index):
    k = new()
    (keys, _, mask), mutated = _Cache().apply({"cache": cache}, k, k, "extend", index,
                                              mutable=["cache"])
    return k, np.asarray(keys), np.asarray(mask)[:, 0], mutated["cache"]

  k2, keys, mask, cache = step(cache, 2)
  assert keys.shape == (examples, kv, beams * length, h)
  for e in range(examples):
    for j in range(beams):
      slot = keys[e, :, j * length:(j + 1) * length]
      np.testing.assert_array_equal(slot[:, 2], k2[e * beams + j, 0])
      others = np.delete(np.arange(length), 2)
      np.testing.assert_array_equal(slot[:, others], np.swapaxes(prompt[e], 0, 1)[:, others])
  # At first every beam reads the prompt from slot 0 and its own position 2.
  want = np.zeros((beams, beams, length), bool)
  want[:, 0, :2] = True
  want[np.arange(beams), np.arange(beams), 2] = True
  np.testing.assert_array_equal(mask, np.broadcast_to(want.reshape(beams, -1), mask.shape))
  # Beam 0 of example 0 continues its beam 2; beam 1 of example 1 continues its beam 0.
  parents = np.array([2, 2, 0, 5, 3, 4])
  cache = attention.reorder_slots(cache, jnp.asarray(parents), axis)
  k3, keys, mask, cache = step(cache, 3)
  np.testing.assert_array_equal(keys[1, :, length + 3], k3[4, 0])
  sees = mask.reshape(examples, beams, beams, length)
  np.testing.assert_array_equal(sees[0, 0], [[1, 1, 0, 1, 0, 0], [0] * 6, [0, 0, 1, 0, 0, 0]])
  np.testing.assert_array_equal(sees[1, 1], [[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0], [0] * 6])


def test_cudnn_inputs_mean_the_same_attention(qkv, cudnn_via_xla, masks_as_bias):
  """What the cuDNN path hands over (segments and masks as one mask spanning the query
  axis, the bias in q's dtype, is_causal) is the same attention: checked through
  jax.nn's XLA implementation, since this host has no cuDNN."""
  seen = cudnn_via_xla
  q, k, v = map(jnp.asarray, qkv)
  b, t, n, h = q.shape
  bias = jnp.asarray(np.random.default_rng(2).normal(size=(1, n, t, t)), F32)
  valid = jnp.asarray(np.array([[1, 1, 1, 1, 1, 0], [1] * 6], bool))[:, None, None, :]
  seg = jnp.asarray(np.array([[1, 1, 1, 2, 2, 0], [1, 2, 2, 2, 3, 3]], np.int32))
  cases = [dict(is_causal=True, scale=0.3), dict(bias=bias, mask=valid),
           dict(bias=bias, is_causal=True),
           dict(is_causal=True, q_segment_ids=seg, kv_segment_ids=seg)]
  for case in cases:
    got = attention.cudnn_attention(q, k, v, **case)
    want = attention.xla_attention(q, k, v, **case)
    np.testing.assert_allclose(got, want, atol=1e-5, err_msg=str(case))
  # causal alone: no [t, s] mask built
  none = {"key_value_seq_lengths": None}
  assert seen[0] == {"head_dim": h, "is_causal": True, "bias": None, "mask": None, **none}
  # padding spans the queries
  assert seen[1] == {"head_dim": h, "is_causal": False, "bias": (1, n, t, t),
                     "mask": (b, 1, t, t), **none}
  assert seen[3] == {"head_dim": h, "is_causal": True, "bias": None, "mask": (b, 1, t, t),
                     **none}


def test_a_key_mask_folded_into_the_head_dim_is_the_same_attention(qkv, cudnn_via_xla,
                                                                     key_mask_fold):
  """T5's encoder on cuDNN with the fold: no mask reaches cuDNN, the bias keeps its batch of
  1, and the attention and its gradients (q, k, v and the bias) are those of the masked call.
  Checked through jax.nn's XLA implementation, since this host has no cuDNN."""
  seen = cudnn_via_xla
  q, k, v = map(jnp.asarray, qkv)
  b, t, n, h = q.shape
  bias = jnp.asarray(np.random.default_rng(3).normal(size=(1, n, t, t)), F32)
  valid = jnp.asarray(np.array([[1, 1, 1, 0, 0, 0], [1] * 6], bool))[:, None, None, :]
  for case in (dict(mask=valid, scale=1.0), dict(mask=valid, is_causal=True, scale=0.3)):
    def loss(fn, q, k, v, bias, case=case):
      out = fn(q, k, v, bias=bias, **case)
      return jnp.sum(out * jnp.cos(out)), out

    (_, want), want_grads = jax.value_and_grad(
        lambda *a: loss(attention.xla_attention, *a), argnums=(0, 1, 2, 3), has_aux=True)(
            q, k, v, bias)
    (_, got), got_grads = jax.value_and_grad(
        lambda *a: loss(attention.cudnn_attention, *a), argnums=(0, 1, 2, 3), has_aux=True)(
            q, k, v, bias)
    np.testing.assert_allclose(got, want, atol=1e-5, err_msg=str(case))
    for name, g, w in zip(("q", "k", "v", "bias"), got_grads, want_grads, strict=True):
      np.testing.assert_allclose(g, w, atol=1e-5, err_msg=f"d{name} {case}")
  # h = 8 plus the mask's column, padded to 16; the bias as it came, no mask.
  assert seen and all(c["head_dim"] == 16 and c["bias"] == (1, n, t, t) and c["mask"] is None
                      for c in seen), seen


def test_key_lengths_reach_cudnn_as_its_padding_mask(qkv, cudnn_via_xla):
  """T5's padding as KeyLengths: cuDNN gets each row's key count (its padding mask) beside
  the bias at its batch of 1 (the encoder) or alone (the cross-attention), and no mask; the
  attention and its gradients (q, k, v and the bias) are the spelt-out mask's. Checked
  through jax.nn's XLA implementation, since this host has no cuDNN."""
  seen = cudnn_via_xla
  q, k, v = map(jnp.asarray, qkv)
  b, t, n, h = q.shape
  bias = jnp.asarray(np.random.default_rng(4).normal(size=(1, n, t, t)), F32)
  keys = attention.KeyLengths(jnp.asarray([3, 6], jnp.int32))
  spelt = keys.spelt_out(t)
  np.testing.assert_array_equal(spelt[:, 0, 0], [[1, 1, 1, 0, 0, 0], [1] * 6])
  cases = {"encoder": (dict(), True), "cross": (dict(scale=0.3), False),
           "causal": (dict(is_causal=True), True)}
  for name, (case, with_bias) in cases.items():
    seen.clear()

    def loss(fn, mask, q, k, v, bias, case=case):
      out = fn(q, k, v, bias=bias, mask=mask, **case)
      return jnp.sum(out * jnp.cos(out)), out

    args = (q, k, v, bias if with_bias else None)
    argnums = (0, 1, 2, 3) if with_bias else (0, 1, 2)
    (_, want), want_grads = jax.value_and_grad(
        lambda *a: loss(attention.xla_attention, spelt, *a), argnums=argnums,
        has_aux=True)(*args)
    for fn in (attention.cudnn_attention, attention.xla_attention):
      (_, got), got_grads = jax.value_and_grad(
          lambda *a, fn=fn: loss(fn, keys, *a), argnums=argnums, has_aux=True)(*args)
      np.testing.assert_allclose(got, want, atol=1e-5, err_msg=name)
      for i, g, w in zip(argnums, got_grads, want_grads, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5, err_msg=f"{name}: gradient {i}")
    assert seen == [{"head_dim": h, "is_causal": name == "causal", "mask": None,
                     "bias": (1, n, t, t) if with_bias else None,
                     "key_value_seq_lengths": (b,)}], (name, seen)


def test_key_lengths_are_spelt_out_where_cudnn_takes_no_counts(qkv, cudnn_via_xla,
                                                                masks_as_bias):
  seen = cudnn_via_xla
  q, k, v = map(jnp.asarray, qkv)
  b, t, n, h = q.shape
  keys = attention.KeyLengths(jnp.asarray([3, 6], jnp.int32))
  got = attention.cudnn_attention(q, k, v, mask=keys)
  np.testing.assert_allclose(got, attention.xla_attention(q, k, v, mask=keys.spelt_out(t)),
                             atol=1e-5)
  assert seen == [{"head_dim": h, "is_causal": False, "bias": None, "mask": (b, 1, t, t),
                   "key_value_seq_lengths": None}], seen


def test_key_lengths_keep_each_row_up_to_its_last_real_key():
  rows = {"prefix": ([[1, 1, 0, 0], [1, 1, 1, 1]], [2, 4]),
          "a pad inside": ([[1, 0, 1, 0], [1, 1, 1, 1]], [3, 4]),
          "leading pads": ([[0, 1, 1, 0], [1, 1, 1, 1]], [3, 4]),
          "empty row: its first key": ([[0, 0, 0, 0], [1, 1, 1, 1]], [1, 4])}
  for name, (keys, lengths) in rows.items():
    got = jax.jit(attention.key_lengths)(jnp.asarray(keys, bool))
    np.testing.assert_array_equal(got.lengths, lengths, err_msg=name)


# ------------------------------------------------- the choice as programs are lowered


@pytest.fixture
def fresh_run():
  """A run's bookkeeping for one test; the process-wide policy restored after it."""
  lines: list[str] = []
  attention_policy.start_run("auto", log=lines.append)
  yield lines
  attention_policy.start_run("auto")


def test_fused_attention_asked_for_on_cpu_warns(fresh_run):
  """USE_CUDNN_FLASH_ATTENTION=True on a CPU run: main warns that XLA runs instead."""
  attention_policy.start_run(attention_policy.policy_from_flags(True, None))
  assert attention_policy.policy_warning() == (
      "fused attention was asked for, but this run is on cpu: attention runs on XLA")
  attention_policy.start_run(attention_policy.policy_from_flags(None, None))
  assert attention_policy.policy_warning() is None


def test_cpu_choice_is_logged_once_and_recorded(qkv, fresh_run):
  records = []
  attention_policy.on_choice(records.append)
  for causal in (True, False, True):
    jax.jit(lambda q, k, v, c=causal: attention.dot_product_attention(q, k, v, is_causal=c))(
        *qkv)
  assert fresh_run == ["attention: xla (cpu)"]
  assert records[-1] == {"policy": "auto",
                         "choices": [{"implementation": "xla", "reason": "cpu"}]}


def test_cudnn_refusal_falls_back_to_the_xla_path(qkv, fresh_run, monkeypatch):
  """A CUDA lowering whose cuDNN call is refused (here: no cuDNN in this process) runs
  the XLA path, with the refusal as the logged reason."""
  monkeypatch.setattr(attention, "lowering_platform", lambda: "cuda")
  q, k, v = (jnp.asarray(x, BF16) for x in qkv)
  bias = jnp.zeros((1, q.shape[2], q.shape[1], q.shape[1]), F32)
  got = attention.dot_product_attention(q, k, v, bias=bias, is_causal=True)
  want = attention.xla_attention(q, k, v, bias=bias, is_causal=True)
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
  assert fresh_run == ["attention: xla (cuda, bfloat16, cuDNN refused: cuDNN is not detected.)"]


# ----------------------------------------------------------------------- exports


class _AttendingModel:
  """A decode made of one bf16 causal self-attention over the prompt ids' embeddings."""

  def decode_features(self):
    return ("ids",)

  def decode(self, params, batch, key, settings):
    from paxlike import decoding

    x = params["embed"].astype(BF16)[batch["ids"]][:, :, None, :]  # [b, t, 1 head, 8]
    y = attention.dot_product_attention(x, x, x, is_causal=True, scale=0.5)
    tokens = jnp.argmax(y[:, :, 0].astype(F32), axis=-1)[:, None, :]
    return decoding.DecodeOutput(tokens.astype(jnp.int32), jnp.zeros(tokens.shape[:2]),
                                 jnp.full(tokens.shape[:2], tokens.shape[-1], jnp.int32))


def _job(platforms):
  from paxlike import decoding
  from paxlike.export import job as job_lib

  return job_lib.ExportJob(
      experiment="x", model=_AttendingModel(), settings=decoding.DecodeSettings(),
      abstract_params={"embed": jax.ShapeDtypeStruct((16, 8), F32)},
      features=(job_lib.Feature("ids", (4,), "int32", None),), vocabulary={"kind": "none"},
      append_eos=None, examples={}, example_texts=(), platforms=platforms, job_log_dir="")


def test_export_for_every_platform_keeps_the_portable_path(monkeypatch, fresh_run):
  """Even where the host would fuse attention (a CUDA host, policy cudnn), an export for
  cpu,cuda,tpu lowers XLA attention and succeeds from this CPU host."""
  from paxlike.export import serving

  calls = []

  def fused(*args, **kwargs):
    calls.append(1)
    return attention.xla_attention(*args, **kwargs)

  monkeypatch.setattr(attention, "lowering_platform", lambda: "cuda")
  monkeypatch.setattr(attention, "cudnn_attention", fused)
  attention_policy.set_attention_policy("cudnn")
  # Outside an export, this lowering would take the fused kernel.
  jax.jit(serving.serving_fn(_job(("cpu",)).model, _job(("cpu",)).settings,
                             _job(("cpu",)).abstract_params)).trace(
      *serving.arg_specs(_job(("cpu",)), 2))
  assert calls == [1]
  calls.clear()
  exported = serving.lower(_job(("cpu", "cuda", "tpu")))
  assert calls == []
  assert exported.platforms == ("cpu", "cuda", "tpu")
  assert "cudnn" not in exported.mlir_module()
  assert fresh_run[-1] == "attention: xla (cuda, bfloat16, policy xla)"
