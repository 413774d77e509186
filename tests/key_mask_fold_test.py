"""The key-mask fold in a whole T5: the same loss and gradients as the masked cuDNN calls.

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
  attention_policy.start_run("auto")


def test_a_t5_with_the_fold_trains_as_without(cudnn_platform):
  calls = cudnn_platform
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
  params = jax.jit(model.init)(jax.random.key(0), batch)["params"]

  def loss_and_grads(fold):
    attention_policy.set_key_mask_fold(fold)
    calls.clear()
    loss = lambda p: model.apply({"params": p}, batch, method=model.fprop)[0]
    out = jax.jit(jax.value_and_grad(loss))(params)
    return out, sorted({c["head_dim"] for c in calls}), attention_policy.run_record()

  (plain_loss, plain_grads), plain_dims, _ = loss_and_grads(False)
  (loss, grads), dims, record = loss_and_grads(True)
  assert plain_dims == [8]
  # The encoder's and the cross-attention's key padding folded (8 + 1 -> 16); the decoder's
  # causal self-attention mask spans the queries, so it stays a mask (8).
  assert dims == [8, 16]
  assert record["key_mask_fold"] is True
  assert any("key mask in the head dim" in c["reason"] for c in record["choices"])
  np.testing.assert_allclose(loss, plain_loss, rtol=1e-3)
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(grads),
                          jax.tree.leaves(plain_grads), strict=True):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                               atol=2e-3, rtol=2e-2, err_msg=jax.tree_util.keystr(path))

