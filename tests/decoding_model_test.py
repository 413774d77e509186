"""decoding.decoding_model: a scanned (or pipelined) model decodes as its unrolled twin.

Unrolled, each layer's KV cache is an array of its own, written in place at each
step; a scanned stack copies the whole cache out and back per generated token.
The twin must generate exactly what the model itself generates.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike import decoding
from paxlike.layers import pipeline
from paxlike.models.language_model import LanguageModel
from paxlike.models.llama import LlamaModel
from paxlike.models.t5 import T5Model

ROWS, LENGTH, VOCAB = 3, 10, 48


def _lm_batch():
  ids = np.random.default_rng(0).integers(2, VOCAB, (ROWS, LENGTH))
  return {"ids": jnp.asarray(ids, jnp.int32), "prompt_lens": jnp.asarray([3, 4, 2], jnp.int32)}


def _family(name):
  """A tiny scanned model of the family, a batch it decodes, and its parameters."""
  if name == "t5":
    model = T5Model(vocab_size=VOCAB, model_dims=16, num_encoder_layers=2,
                    num_decoder_layers=3, num_heads=2, dim_per_head=8, hidden_dims=24,
                    use_repeated_layer=True, max_target_len=6)
    ids = np.random.default_rng(0).integers(2, VOCAB, (ROWS, 7))
    ids[0, 5:] = 0  # padding the encoder masks
    batch = {"encoder_input_tokens": jnp.asarray(ids, jnp.int32),
             "decoder_input_tokens": jnp.zeros((ROWS, 6), jnp.int32),
             "decoder_target_tokens": jnp.zeros((ROWS, 6), jnp.int32),
             "decoder_loss_weights": jnp.ones((ROWS, 6), jnp.float32)}
    params = jax.jit(model.init)(jax.random.key(1), batch)["params"]
  else:
    if name == "lm":
      model = LanguageModel(vocab_size=VOCAB, model_dims=16, num_layers=3, num_heads=2,
                            dim_per_head=8, hidden_dims=24, use_repeated_layer=True)
    else:
      model = LlamaModel(vocab_size=VOCAB, model_dims=16, num_layers=3, num_heads=4,
                         num_kv_heads=2, head_dim=8, hidden_dims=24, max_seq_len=LENGTH,
                         use_repeated_layer=True)
    batch = _lm_batch()
    params = jax.jit(lambda k: model.init(k, jnp.zeros((1, 4), jnp.int32)))(
        jax.random.key(1))["params"]
  return model, batch, nn.meta.unbox(params)


def _decode(model, params, batch, settings):
  return jax.jit(lambda p, b: model.decode(p, b, jax.random.key(0), settings))(params, batch)


@pytest.mark.parametrize("family", ["lm", "llama", "t5"])
def test_a_scanned_model_decodes_as_its_unrolled_twin_with_the_same_output(family):
  model, batch, params = _family(family)
  twin, twin_params = decoding.decoding_model(model, params)
  assert twin.use_repeated_layer is False
  # The twin's parameters are the same weights, one subtree per layer, and go back exactly.
  assert "layers_2" in str(jax.tree_util.tree_structure(twin_params))
  back = model.restack_params(twin_params)
  assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), back, params))
  # Each layer's KV cache is its own array: none leads with a layer axis.
  _, cache = jax.eval_shape(
      lambda p, b: twin.apply({"params": p}, b, decoding.DecodeSettings(), method="prefill",
                              mutable=["cache"]), twin_params, batch)
  paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(cache)]
  assert any("layers_0" in p for p in paths) and not any("'layers'" in p for p in paths)
  # Beam search: each step extends, and reorders the slot tables the twin keeps per layer.
  settings = decoding.DecodeSettings(eos_id=-1, num_beams=2)
  want = _decode(model, params, batch, settings)
  got = _decode(twin, twin_params, batch, settings)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5, atol=1e-5)


def test_abstract_parameters_restack_to_the_twins_shapes():
  """An export describes the twin from ShapeDtypeStructs (decoding_model restacks them
  abstractly): the shapes are those of the twin's own initialisation."""
  model, batch, params = _family("t5")
  twin, abstract = decoding.decoding_model(model, jax.eval_shape(lambda: params))
  own = jax.eval_shape(twin.init, jax.random.key(1), batch)["params"]
  shapes = lambda t: jax.tree.map(lambda x: x.shape, nn.meta.unbox(t))
  assert shapes(abstract) == shapes(own)
  assert pipeline.layout_of(pipeline.to_stack(abstract["decoder"])).use_repeated_layer is False
