"""How key masks reach cuDNN in a whole T5 (the key-mask fold, key counts): the same loss and
gradients as the masked cuDNN calls.

This host has no cuDNN, so the cuDNN path is taken as on a GPU (the platform
reads 'cuda') and jax.nn's cuDNN call is answered by jax.nn's XLA
implementation of the same arguments.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.layers import attention, attention_policy
from paxlike.models.t5 import T5Model


@pytest.fixture
def cudnn_platform(monkeypatch, cudnn_via_xla):
  """The cuDNN path taken as on a GPU, its calls answered by XLA (conftest.cudnn_via_xla)."""
  monkeypatch.setattr(attention, "lowering_platform", lambda: "cuda")
  monkeypatch.setattr(attention, "cudnn_max_head_dim", lambda: 128)
  attention_policy.start_run("auto")
  yield cudnn_via_xla
  attention_policy.set_key_mask_fold(False)
  attention_policy.set_key_mask_lengths(True)
  attention_policy.start_run("auto")


def _t5_and_batch():
  model = T5Model(vocab_size=64, model_dims=32, num_encoder_layers=1, num_decoder_layers=1,
                  num_heads=2, dim_per_head=8, hidden_dims=64, fprop_dtype=jnp.bfloat16)
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, 64, (3, 16))
  tokens[0, 10:] = 0  # padding: masked keys in the encoder and the cross-attention
  tokens[1, 5:] = 0
  batch = {"encoder_input_tokens": jnp.asarray(tokens, jnp.int32),
           "decoder_input_tokens": jnp.asarray(rng.integers(2, 64, (3, 6)), jnp.int32),
           "decoder_target_tokens": jnp.asarray(rng.integers(2, 64, (3, 6)), jnp.int32),
           "decoder_loss_weights": jnp.ones((3, 6), jnp.float32)}
  return model, batch, jax.jit(model.init)(jax.random.key(0), batch)["params"]


def _loss_and_grads(calls, model, batch, params, *, fold=False, counts=True):
  attention_policy.set_key_mask_fold(fold)
  attention_policy.set_key_mask_lengths(counts)
  calls.clear()
  loss = lambda p: model.apply({"params": p}, batch, method=model.fprop)[0]
  out = jax.jit(jax.value_and_grad(loss))(params)
  return out, list(calls), attention_policy.run_record()


def _assert_same(got, want):
  (loss, grads), (want_loss, want_grads) = got, want
  np.testing.assert_allclose(loss, want_loss, rtol=1e-3)
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(grads),
                          jax.tree.leaves(want_grads), strict=True):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                               atol=2e-3, rtol=2e-2, err_msg=jax.tree_util.keystr(path))


def test_a_t5_with_the_fold_trains_as_without(cudnn_platform):
  model, batch, params = _t5_and_batch()
  plain, plain_calls, _ = _loss_and_grads(cudnn_platform, model, batch, params, counts=False)
  folded, calls, record = _loss_and_grads(cudnn_platform, model, batch, params, fold=True,
                                          counts=False)
  assert sorted({c["head_dim"] for c in plain_calls}) == [8]
  # The encoder's and the cross-attention's key padding folded (8 + 1 -> 16); the decoder's
  # causal self-attention mask spans the queries, so it stays a mask (8).
  assert sorted({c["head_dim"] for c in calls}) == [8, 16]
  assert record["key_mask_fold"] is True
  assert any("key mask in the head dim" in c["reason"] for c in record["choices"])
  _assert_same(folded, plain)


def test_a_t5_with_key_counts_trains_as_with_masks_as_bias(cudnn_platform):
  """The default: no [b, n, t, s] bias reaches cuDNN; loss and gradients as the bias call's."""
  model, batch, params = _t5_and_batch()
  plain, plain_calls, record = _loss_and_grads(cudnn_platform, model, batch, params,
                                               counts=False)
  assert record["key_mask_lengths"] is False
  assert any(c["bias"] == (3, 2, 16, 16) or c["mask"] == (3, 1, 16, 16) for c in plain_calls)
  got, calls, record = _loss_and_grads(cudnn_platform, model, batch, params)
  assert "key_mask_lengths" not in record
  counted = [c for c in calls if c["key_value_seq_lengths"] is not None]
  # the encoder's self-attention (its bias at a batch of 1) and the decoder's cross-attention
  assert sorted(str(c["bias"]) for c in counted) == ["(1, 2, 16, 16)", "None"], calls
  assert all(c["mask"] is None for c in calls), calls
  # the decoder's self-attention: cuDNN's causal flag, no mask
  assert any(c["is_causal"] and c["mask"] is None for c in calls), calls
  _assert_same(got, plain)
