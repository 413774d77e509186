"""Pax's MLP classifier (lm_cloud.py's SmallMlp / LargeMlp): praxis's forward, its
gradient-free accuracy loss, its weight shardings and the one-line refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import describe, run_cli, train_in_process

from paxlike import experiment, registry
from paxlike.errors import UserError
from paxlike.models.classifier import ClassificationMLP

SMALL = ["NUM_LAYER=3", "INPUT_DIM=32", "OUTPUT_DIM=32", "HIDDEN_DIM=64",
         "PERCORE_BATCH_SIZE=1", "MAX_SEQ_LEN=16"]


def _numpy_logits(params, ids):
  """praxis's ClassificationMLPModel by hand: the table's rows, ReLU layers, the table."""
  soft = params["softmax"]["logits_ffn"]
  w_s, b_s = np.asarray(soft["linear"]["w"]), np.asarray(soft["bias"]["b"])
  x = w_s.T[ids]
  layers = params["mlp_layers_0"]
  for i in range(len(layers)):
    layer = layers[f"mlp_layers_{i}"]
    x = np.maximum(x @ np.asarray(layer["linear"]["w"]) + np.asarray(layer["bias"]["b"]), 0)
  return x @ w_s + b_s


def test_forward_is_praxis_mlp_on_the_shared_table_and_its_loss_the_gradient_free_accuracy():
  model = ClassificationMLP(num_layers=3, input_dims=16, hidden_dims=24, output_dims=16,
                            num_classes=16)
  rng = np.random.default_rng(0)
  batch = {"ids": jnp.asarray(rng.integers(16, size=(4, 8)), jnp.int32),
           "labels": jnp.asarray(rng.integers(16, size=(4, 8)), jnp.int32),
           "weights": jnp.asarray(rng.integers(2, size=(4, 8)), jnp.float32)}
  params = jax.tree.map(lambda b: getattr(b, "value", b), model.init(
      jax.random.key(0), batch, method=ClassificationMLP.fprop)["params"],
      is_leaf=lambda x: hasattr(x, "value"))
  # praxis's names and shapes: the MLPBlock's layers, the softmax's linear and bias.
  shapes = jax.tree.map(np.shape, params)
  assert shapes["mlp_layers_0"]["mlp_layers_1"] == {"linear": {"w": (24, 24)},
                                                    "bias": {"b": (24,)}}
  assert shapes["softmax"]["logits_ffn"] == {"linear": {"w": (16, 16)}, "bias": {"b": (16,)}}
  # Zero biases leave the ReLUs half open; give them values so the test sees them.
  params = jax.tree.map(lambda p: p + 0.1 * rng.standard_normal(p.shape).astype(p.dtype),
                        params)
  logits = model.apply({"params": params}, batch["ids"], method=ClassificationMLP.logits)
  want = _numpy_logits(params, np.asarray(batch["ids"]))
  np.testing.assert_allclose(np.asarray(logits), want, rtol=1e-5, atol=1e-5)

  def loss(p):
    return model.apply({"params": p}, batch, method=ClassificationMLP.fprop)

  (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(params)
  w = np.asarray(batch["weights"])
  accuracy = ((want.argmax(-1) == np.asarray(batch["labels"])) * w).sum() / w.sum()
  assert 0 < accuracy < 1
  assert float(value) == float(metrics["accuracy"]) == pytest.approx(accuracy)
  assert all(not np.any(np.asarray(g)) for g in jax.tree.leaves(grads))


def test_pax_shardings_split_the_weights_and_a_step_runs_forward_only(tmp_path):
  """SmallMlp on [2, 2, 2] with the layers' weights over data x mdl and the softmax's input
  dim over mdl: each device holds its quarter or half; every step's loss is the accuracy
  with a zero gradient, and checkpoints come at Pax's cadence (5, 10)."""
  overrides = [*SMALL, "MESH_SHAPE=[2, 2, 2]", "MLP_WEIGHT_SHARDING=['data', 'mdl']",
               "SOFTMAX_WEIGHT_SHARDING=['mdl', -1]", "SUMMARY_INTERVAL_STEPS=1"]
  result, _, _ = train_in_process("lm_cloud.SmallMlp", overrides, tmp_path / "job",
                                  num_devices=8, main_rules=True)
  params = result.state.params
  hidden = params["mlp_layers_0"]["mlp_layers_1"]["linear"]["w"]
  table = params["softmax"]["logits_ffn"]["linear"]["w"]
  hidden, table = (getattr(a, "value", a) for a in (hidden, table))
  assert {s.data.shape for s in hidden.addressable_shards} == {(32, 32)}
  assert {s.data.shape for s in table.addressable_shards} == {(16, 32)}
  assert [h["step"] for h in result.history] == list(range(1, 11))
  for h in result.history:
    assert h["loss"] == h["accuracy"] and h["grad_norm"] == 0.0, h
  assert sorted(p.name for p in (tmp_path / "job" / "checkpoints").iterdir()) == [
      "checkpoint_00000005", "checkpoint_00000010"]
  # It has no decoder: exporting the trained job is one sentence, and writes nothing.
  before = sorted(p.name for p in (tmp_path / "job").iterdir())
  proc = run_cli(["--exp=lm_cloud.SmallMlp", f"--job_log_dir={tmp_path / 'job'}",
                  "--mode=export", "--export_format=stablehlo",
                  *(f"--set={o}" for o in overrides)], cwd=tmp_path, devices=8)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, describe(proc)
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "error: an MLP classifier (ClassificationMLP) has no decoder"), describe(proc)
  assert sorted(p.name for p in (tmp_path / "job").iterdir()) == before


@pytest.mark.parametrize(("overrides", "message"), [
    (["MESH_SHAPE=None", "MLP_WEIGHT_SHARDING=['data', None]"],
     "MLP_WEIGHT_SHARDING=['data', None] splits weights over a mesh, but MESH_SHAPE is None"),
    (["MESH_SHAPE=[1, 8, 1]", "HIDDEN_DIM=100", "MLP_WEIGHT_SHARDING=[-1, 'data']"],
     "MLP_WEIGHT_SHARDING=[-1, 'data'] splits HIDDEN_DIM=100 8 ways over 'data'"),
    (["SOFTMAX_WEIGHT_SHARDING=['x', None]"],
     "SOFTMAX_WEIGHT_SHARDING=['x', None]: each entry is None or -1 (not split), or mesh axes"),
    (["MLP_WEIGHT_SHARDING=[-1]"], "MLP_WEIGHT_SHARDING must be a list of 2 entries"),
    (["OUTPUT_DIM=512"], "OUTPUT_DIM=512 must equal INPUT_DIM=1024"),
    (["MESH_SHAPE=[8, 1]"], "MESH_SHAPE must be a list of three positive ints"),
    (["ICI_MESH_SHAPE=[1, 8, 1]"],
     "SmallMlp's ICI_MESH_SHAPE is Pax's MESH_SHAPE; write --set MESH_SHAPE=[1, 8, 1]."),
])
def test_what_pax_would_fail_on_late_is_one_sentence(overrides, message):
  with pytest.raises(UserError) as err:
    experiment.instantiate(registry.get("lm_cloud.SmallMlp"), overrides)
  assert str(err.value).startswith(message), err.value


def test_the_refusal_is_exit_2_and_writes_nothing(tmp_path):
  job = tmp_path / "job"
  proc = run_cli(["--exp=lm_cloud.SmallMlp", f"--job_log_dir={job}",
                  "--set", "MLP_WEIGHT_SHARDING=['replica', 'nope']"], cwd=tmp_path)
  assert proc.returncode == 2, describe(proc)
  assert "Traceback" not in proc.stderr and not job.exists(), describe(proc)
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "error: MLP_WEIGHT_SHARDING=['replica', 'nope']: each entry"), describe(proc)


@pytest.mark.parametrize(("override", "reason"), [
    ("USE_CUDNN_FLASH_ATTENTION=True", "the MLP classifier has no attention."),
    ("TRAINING_OPTIMIZED_SHARDING=False", "the MLP classifier's activations follow its weights"),
])
def test_a_set_of_a_knob_the_mlp_does_not_have_is_refused(override, reason):
  exp = experiment.instantiate(registry.get("lm_cloud.SmallMlp"), [override])
  with pytest.raises(UserError) as err:
    experiment.build_checked(exp)
  assert str(err.value).startswith(f"--set {override}: nothing reads it; {reason}"), err.value
