"""paxlike.interop.t5x: T5X checkpoints (msgpack + TensorStore) read into T5 models.

The end-to-end check (a T5X checkpoint of a trained job scores as the job
did, through `--init_from=t5x:`) is in flan_t5_test.py; here the layouts
and the refusals, in process.
"""

from __future__ import annotations

import numpy as np
import pytest
import t5x_files

from paxlike.errors import UserError


def _model(scanned: bool = False, tie: bool = False):
  from paxlike.models.t5 import T5Model

  return T5Model(vocab_size=100, model_dims=32, num_encoder_layers=3, num_decoder_layers=2,
                 num_heads=3, dim_per_head=16, hidden_dims=48, activation="gated-gelu",
                 tie_embeddings=tie, use_repeated_layer=scanned)


def _params(model):
  import jax
  import jax.numpy as jnp
  from flax import linen as nn

  ones = jnp.ones((2, 5), jnp.int32)
  batch = {"encoder_input_tokens": ones, "decoder_input_tokens": ones,
           "decoder_target_tokens": ones, "decoder_loss_weights": jnp.ones((2, 5))}
  return jax.device_get(nn.meta.unbox(model.init(jax.random.key(0), batch,
                                                 method="fprop")["params"]))


@pytest.fixture(scope="module")
def t5x_dirs(tmp_path_factory):
  """({format: model_dir of a T5X checkpoint at step 1000}, the params it holds, unrolled)."""
  from paxlike.interop import hf

  root = tmp_path_factory.mktemp("t5x")
  model = _model()
  params = _params(model)
  hf.export_params(params, model, str(root / "hf"))
  t5x_files.write_from_hf(str(root / "hf"), str(root / "legacy"), step=1000)
  t5x_files.write_orbax_from_hf(str(root / "hf"), str(root / "orbax"), step=1000)
  return {"legacy": root / "legacy", "orbax": root / "orbax"}, params


@pytest.mark.parametrize("fmt", ["legacy", "orbax"])
@pytest.mark.parametrize("scanned", [False, True], ids=["unrolled", "scanned"])
def test_t5x_checkpoint_reads_back_the_exact_parameters(t5x_dirs, fmt, scanned):
  import jax

  from paxlike.interop import hf, t5x
  from paxlike.interop.hf_files import materialize

  dirs, params = t5x_dirs
  model_dir = dirs[fmt]
  model = _model(scanned=scanned)
  got = materialize(t5x.lazy_params(str(model_dir), None, model))
  if scanned:  # the same layers stacked on a leading axis
    params = hf.import_params(str(model_dir.parent / "hf"), model)
  assert jax.tree.structure(got) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(a, b)
  # The step folder names the same checkpoint (and, legacy, its msgpack file too).
  folder = model_dir / "checkpoint_1000"
  for path in (folder, folder / "checkpoint") if fmt == "legacy" else (folder, folder / "state"):
    again = materialize(t5x.lazy_params(str(path), None, _model()))
    np.testing.assert_array_equal(again["decoder"]["logits_dense"]["kernel"],
                                  params["decoder"]["logits_dense"]["kernel"])


def _error(path, step=None, model=None) -> str:
  from paxlike.interop import t5x

  with pytest.raises(UserError) as e:
    t5x.lazy_params(str(path), step, model or _model())
  return str(e.value)


def test_what_is_not_a_t5x_checkpoint_of_this_model_is_named(t5x_dirs, tmp_path):
  import orbax.checkpoint as ocp

  model_dir = t5x_dirs[0]["legacy"]
  assert "no checkpoint for step 5; available: [1000]" in _error(model_dir, 5)
  assert "neither a T5X checkpoint folder" in _error(tmp_path)
  assert "no such file or directory" in _error(tmp_path / "missing")
  tf_index = tmp_path / "tf" / "checkpoint"
  tf_index.parent.mkdir()
  tf_index.write_bytes(b'model_checkpoint_path: "model.ckpt-1000"\n')
  assert "is a TensorFlow checkpoint index" in _error(tf_index)
  # A paxlike job's checkpoint (Orbax too, but params/opt_state, not T5X's target/state).
  ocp.PyTreeCheckpointer().save(str(tmp_path / "job" / "checkpoint_5" / "state"),
                                {"params": {"w": np.ones(2, np.float32)}, "step": np.int32(5)})
  assert "read with paxlike:DIR" in _error(tmp_path / "job")
  # T5X's logits_via_embedding=True (original T5) against Flan-T5's own head.
  tied = _error(model_dir, model=_model(tie=True))
  assert "decoder/logits_dense/kernel" in tied and "set TIE_EMBEDDINGS=False" in tied
  other = _error(t5x_dirs[0]["orbax"], model=_model().clone(hidden_dims=64))
  assert "has encoder/layers_0/mlp/wi_0/kernel of shape [32, 48]" in other
  assert "needs [32, 64]" in other


def test_a_model_that_is_not_a_t5_is_refused(t5x_dirs):
  from paxlike.models.llama import LlamaModel

  llama = LlamaModel(vocab_size=100, model_dims=32, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=8, hidden_dims=64)
  assert "T5X checkpoints are read into T5 experiments" in _error(t5x_dirs[0]["legacy"],
                                                                model=llama)
