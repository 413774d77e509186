"""cuDNN's fused attention against the XLA path on a CUDA GPU (marker `gpu`).

The suite runs on fake CPU devices (conftest sets JAX_PLATFORMS=cpu unless it
is set), so these tests skip there. On a machine with a CUDA GPU:

    JAX_PLATFORMS=cuda python -m pytest -m gpu tests/gpu_attention_test.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY, cuda_only, train_in_process

from paxlike.layers import attention, attention_policy

pytestmark = cuda_only()

BF16 = jnp.bfloat16
TOL = 2e-2  # relative error of bf16 results: a few units of bf16's 2^-8


def _rel_err(got, want) -> float:
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-6))


def _compare(args, diff_argnums, **kwargs):
  """Outputs and gradients (of a random projection of the output) of both paths.

  args: q, k, v and optionally the bias; diff_argnums: which of them get gradients.
  """
  cot = jax.random.normal(jax.random.key(9), args[0].shape, jnp.float32).astype(args[0].dtype)

  def call(fn, q, k, v, bias=None):
    return fn(q, k, v, bias=bias, **kwargs)

  def loss(fn, *a):
    return jnp.sum((call(fn, *a) * cot).astype(jnp.float32))

  for name, fn in (("cudnn", attention.cudnn_attention), ("xla", attention.xla_attention)):
    out = jax.jit(lambda *a, fn=fn: call(fn, *a))(*args)
    grads = jax.jit(jax.grad(lambda *a, fn=fn: loss(fn, *a), argnums=diff_argnums))(*args)
    if name == "cudnn":
      fused_out, fused_grads = out, grads
  assert _rel_err(fused_out, out) < TOL
  for i, (g_fused, g_xla) in enumerate(zip(fused_grads, grads, strict=True)):
    assert _rel_err(g_fused, g_xla) < TOL, f"gradient {i}"


def _qkv(b, t, s, n, h, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return [jax.random.normal(k, (b, length, n, h), jnp.float32).astype(BF16)
          for k, length in zip(keys, (t, s, s), strict=True)]


def _bias(n, t, s, seed=1):
  return jax.random.normal(jax.random.key(seed), (1, n, t, s), jnp.float32)


def test_causal_lm():
  q, k, v = _qkv(2, 256, 256, 4, 128)
  _compare((q, k, v), (0, 1, 2), is_causal=True, scale=128 ** -0.5)


def test_t5_encoder_with_bias_and_padding():
  q, k, v = _qkv(2, 128, 128, 4, 64)
  lengths = jnp.array([128, 77])
  valid = (jnp.arange(128)[None, :] < lengths[:, None])[:, None, None, :]  # [b, 1, 1, s]
  _compare((q, k, v, _bias(4, 128, 128)), (0, 1, 2, 3), mask=valid)


def test_t5_encoder_with_bias_and_padding_as_an_additive_bias(masks_as_bias):
  """Key counts off: the padding and the bias reach cuDNN as one [b, n, t, s] bias."""
  q, k, v = _qkv(2, 128, 128, 4, 64)
  valid = (jnp.arange(128)[None, :] < jnp.array([128, 77])[:, None])[:, None, None, :]
  _compare((q, k, v, _bias(4, 128, 128)), (0, 1, 2, 3), mask=valid)


def test_a_boolean_key_mask_with_a_hole_takes_the_additive_bias():
  """A bool key mask (here with a hole, which no KeyLengths can say) reaches cuDNN folded
  into the bias, with counts on."""
  q, k, v = _qkv(2, 128, 128, 4, 64)
  valid = np.ones((2, 128), bool)
  valid[0, 30:40] = False
  valid[1, 100:] = False
  _compare((q, k, v, _bias(4, 128, 128)), (0, 1, 2, 3), mask=jnp.asarray(valid)[:, None, None, :])


def test_t5_encoder_and_cross_attention_with_the_key_mask_fold(key_mask_fold):
  """cuDNN with the padding as one more head dim (64 -> 72) against XLA's masked path."""
  q, k, v = _qkv(2, 128, 128, 4, 64)
  lengths = jnp.array([128, 77])
  valid = (jnp.arange(128)[None, :] < lengths[:, None])[:, None, None, :]  # [b, 1, 1, s]
  _compare((q, k, v, _bias(4, 128, 128)), (0, 1, 2, 3), mask=valid)
  _compare((q, k, v), (0, 1, 2), mask=valid)  # cross-attention: padding alone


def test_t5_decoder_with_bias():
  """Self-attention: bias and the causal mask T5 passes; cross-attention: encoder padding."""
  q, k, v = _qkv(2, 64, 64, 4, 64)
  tril = np.tril(np.ones((64, 64), bool))[None, None]
  _compare((q, k, v, _bias(4, 64, 64)), (0, 1, 2, 3), mask=tril)
  _compare((q, k, v, _bias(4, 64, 64)), (0, 1, 2, 3), is_causal=True)
  q, _, _ = _qkv(2, 64, 64, 4, 64, seed=2)
  _, k, v = _qkv(2, 64, 128, 4, 64, seed=3)
  valid = (jnp.arange(128)[None, :] < jnp.array([128, 90])[:, None])[:, None, None, :]
  _compare((q, k, v), (0, 1, 2), mask=valid)


def test_packed_segments():
  q, k, v = _qkv(2, 128, 128, 4, 64)
  seg = jnp.asarray(np.repeat([[1, 2, 3, 0], [1, 1, 2, 2]], 32, axis=1).astype(np.int32))
  _compare((q, k, v), (0, 1, 2), is_causal=True, q_segment_ids=seg, kv_segment_ids=seg,
           scale=0.125)


def test_default_policy_lowers_the_fused_kernel():
  q, k, v = _qkv(2, 128, 128, 4, 64)
  attention_policy.start_run("auto")
  lowered = jax.jit(lambda q, k, v: attention.dot_product_attention(q, k, v, is_causal=True)
                    ).lower(q, k, v)
  assert "__cudnn$fmha" in lowered.as_text()  # the fused kernel's custom call
  lowered.compile()
  assert attention_policy.run_record()["choices"] == [{"implementation": "cudnn",
                                                "reason": "cuda, bfloat16"}]


@pytest.mark.parametrize("exp_name,overrides", [
    (TINY, ["FPROP_DTYPE=bfloat16"]),
    ("FlanT5Tiny", ["FPROP_DTYPE=bfloat16", "DROPOUT_PROB=0.0"]),
])
def test_twenty_steps_train_alike_on_both_paths(exp_name, overrides, tmp_path):
  """The same 20 steps with fused and with XLA attention: the losses agree to bf16 tolerance."""
  overrides = [*overrides, "NUM_TRAIN_STEPS=20", "SUMMARY_INTERVAL_STEPS=1"]
  losses = {}
  for policy in ("cudnn", "xla"):
    attention_policy.start_run(policy)
    result, _, _ = train_in_process(exp_name, overrides, tmp_path / policy,
                                    enable_checkpoint_saving=False)
    implementations = {c["implementation"] for c in attention_policy.run_record()["choices"]}
    assert implementations == {policy}, attention_policy.run_record()
    losses[policy] = np.array([h["loss"] for h in result.history])
  attention_policy.start_run("auto")
  assert len(losses["xla"]) == 20
  assert losses["xla"][-1] < losses["xla"][0]  # it trains
  np.testing.assert_allclose(losses["cudnn"], losses["xla"], rtol=TOL)
