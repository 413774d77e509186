"""Pax's USE_FP8: projections through FP8 with delayed scaling, whose scales and amax
histories the train step writes over (never optimises), and an LM that learns with them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_KEY, train_in_process

from paxlike.layers.linear import Linear
from paxlike.steps import fp8_meta


def test_an_fp8_projection_is_the_product_of_the_quantised_operands():
  x = jax.random.normal(jax.random.key(0), (4, 16, 64))
  layer = Linear((32,), ("embed", "mlp"), fp8=True)
  params = nn_unbox(jax.jit(layer.init)(jax.random.key(1), x)["params"])
  assert sorted(params["fp8"]) == sorted(f"{w}_{m}" for w in ("input", "kernel", "output_grad")
                                          for m in ("scale", "amax_history"))
  y = jax.jit(layer.apply)({"params": params}, x)
  exact = x @ params["w"]
  error = float(jnp.linalg.norm(y - exact) / jnp.linalg.norm(exact))
  assert 0.0 < error < 0.1, error  # float8_e4m3 operands: about 3 bits of mantissa
  # The gradient of the scales and histories is their next value: the kernel's history
  # now starts with the kernel's largest magnitude.
  grads = jax.jit(jax.grad(lambda p: jnp.sum(layer.apply({"params": p}, x))))(params)
  new = grads["fp8"]["kernel_amax_history"]
  assert float(new[0]) == pytest.approx(float(jnp.max(jnp.abs(params["w"]))), rel=1e-6)
  assert float(grads["fp8"]["output_grad_amax_history"][0]) == 1.0  # d sum / d y


def test_fp8_experts_compute_near_the_exact_experts_and_track_their_weights():
  """praxis's Fp8EinsumOp / Fp8EinsumGatedOp on a mixture of experts (Grok's USE_FP8): each
  of the gated pair and the output einsum has its own scales; routing is left exact."""
  from paxlike.layers.moe import MoeFeedForward

  x = jax.random.normal(jax.random.key(0), (2, 16, 32))
  kw = dict(num_experts=4, hidden_dims=64, gated_activation=True, num_groups=2)
  layer = MoeFeedForward(fp8=True, **kw)
  # Jitted, as the train step runs it: one compile instead of op-by-op dispatch.
  params = nn_unbox(jax.jit(layer.init)(jax.random.key(1), x)["params"])
  assert sorted(k for k in params if k.endswith("fp8")) == ["wi_fp8", "wi_gate_fp8", "wo_fp8"]
  y, _ = jax.jit(layer.apply)({"params": params}, x)
  exact, _ = jax.jit(MoeFeedForward(**kw).apply)(
      {"params": {k: v for k, v in params.items() if not k.endswith("fp8")}}, x)
  error = float(jnp.linalg.norm(y - exact) / jnp.linalg.norm(exact))
  assert 0.0 < error < 0.15, error
  grads = jax.jit(jax.grad(lambda p: jnp.sum(layer.apply({"params": p}, x)[0])))(params)
  assert float(grads["wo_fp8"]["kernel_amax_history"][0]) == pytest.approx(
      float(jnp.max(jnp.abs(params["wo"]))), rel=1e-6)


def test_one_key_value_head_keeps_its_own_fp8_choice():
  """praxis's one-key/value-head attention projects k and v through headless_proj_tpl, which
  USE_FP8 leaves exact: kv_fp8=False keeps those two exact while q and the output are FP8."""
  from paxlike.layers.attention import DotProductAttention

  x = jax.random.normal(jax.random.key(0), (2, 8, 32))
  kw = dict(num_heads=4, dim_per_head=8, num_kv_heads=1, fp8=True)
  params = nn_unbox(jax.jit(DotProductAttention(kv_fp8=False, **kw).init)(jax.random.key(1),
                                                                         x)["params"])
  fp8_scopes = sorted(k for k in fp8_meta(params) if k.endswith("kernel_scale"))
  assert fp8_scopes == ["post_fp8/kernel_scale", "query/fp8/kernel_scale"], fp8_scopes
  everything = nn_unbox(jax.jit(DotProductAttention(**kw).init)(jax.random.key(1), x)["params"])
  assert {"key", "value"} <= {k.split("/")[0] for k in fp8_meta(everything)}


def nn_unbox(tree):
  import flax.linen as nn

  return nn.unbox(tree)


STEPS = 10


def test_an_fp8_lm_learns_and_its_scales_follow_its_weights(tmp_path):
  # An FP8 step of the tiny LM at its own batch of 16 takes about 0.9 s on a CPU; at 4 rows
  # a quarter of that. Without the 20-step warmup, 10 steps go 6.21 -> 4.16.
  result, _, _ = train_in_process(TINY_KEY, ["USE_FP8=True", f"NUM_TRAIN_STEPS={STEPS}",
                                             "PERCORE_BATCH_SIZE=4", "LR_COS_WARMUP=0",
                                             "LR_COS_DECAY_START=0",
                                             "SUMMARY_INTERVAL_STEPS=5"], tmp_path / "job")
  losses = [h["loss"] for h in result.history]
  assert losses[-1] < losses[0] - 1.0, losses
  params = jax.device_get(result.state.params)
  meta = fp8_meta(params)
  # Every attention and feed-forward projection has its state; the softmax has none.
  assert meta and not any(k.startswith("softmax") for k in meta)
  assert any("/attention/" in k and "post_fp8" in k for k in meta)
  for path in (k for k in meta if k.endswith("ffn1/fp8/kernel_amax_history")):
    kernel = params_at(params, path.replace("fp8/kernel_amax_history", "w"))
    history = np.asarray(meta[path])
    # Written by the step: the newest entry (first) is the kernel's largest magnitude one
    # update ago (Adam moves it by about the learning rate), and each of the STEPS steps
    # added one entry (the history rolls: the older ones sit at its end).
    lead = history.reshape(-1, history.shape[-1]) if history.ndim > 1 else history[None]
    top = np.abs(kernel).reshape(lead.shape[0], -1).max(axis=1)
    np.testing.assert_allclose(lead[:, 0], top, rtol=0.05)
    assert ((lead > 0).sum(axis=1) == STEPS).all() and (lead[:, 1 - STEPS:] > 0).all()
    scale = np.asarray(meta[path.replace("kernel_amax_history", "kernel_scale")])
    assert (scale != 1.0).all()


def params_at(tree, path):
  for key in path.split("/"):
    tree = tree[key]
  return np.asarray(tree)


def test_freezing_weights_leaves_the_fp8_state_to_the_step():
  """USE_LORA trains the adapters only; the scales and histories are still written."""
  from paxlike.layers.linear import LORA_NAMES
  from paxlike.learners import Learner

  tree = {"ffn1": {"w": 1.0, "lora_a": 2.0, "fp8": {"kernel_scale": 3.0}},
          "attention": {"post": 4.0, "post_fp8": {"input_amax_history": 5.0}}}
  kept = Learner(bprop_variable_inclusion=[LORA_NAMES]).trainable(tree)
  assert kept == {"ffn1": {"w": None, "lora_a": 2.0, "fp8": {"kernel_scale": 3.0}},
                  "attention": {"post": None, "post_fp8": {"input_amax_history": 5.0}}}


def test_fp8_on_a_pipeline_is_refused_in_one_line():
  from paxlike import experiment, registry
  from paxlike.errors import UserError

  with pytest.raises(UserError, match=r"^USE_FP8=True on a pipelined experiment: .*; drop "
                     r"USE_FP8 or the pipeline\.$"):
    experiment.instantiate(registry.get("LmCloudSpmdPipelineTiny"), ["USE_FP8=True"]).validate()
