"""Model FLOPs: a hand count, the model's own matmuls, XLA's cost analysis; peaks; MFU/HFU."""

from __future__ import annotations

import types

import fiddle as fdl
import jax
import jax.numpy as jnp
import pytest

from paxlike import config, experiment, flops, mesh, registry
from paxlike.partitioning import SpmdPartitioner
from paxlike.steps import make_train_step
from paxlike.train_state import init_fn, logical_specs

SMALL = flops.LmDims(num_layers=2, model_dims=8, hidden_dims=32, num_heads=2, dims_per_head=4,
                     vocab_size=16, seq_len=8)


def test_model_flops_per_token_by_hand():
  # Per layer: q, k, v, post = 4 x 8 x (2 x 4) = 256 weights; ffn 2 x 8 x 32 = 512.
  # Two layers: 1536; the shared table 16 x 8 = 128: N = 1664 matmul weights.
  n = 2 * (4 * 8 * 2 * 4 + 2 * 8 * 32) + 16 * 8
  assert flops.matmul_params(SMALL) == n == 1664
  # Attention: QK^T and PV are 2 x 2 x S x D_attn per layer and token forward, x3 with the
  # backward: 12 x L x S x D_attn = 12 x 2 x 8 x 8 = 1536, halved for the causal mask.
  assert flops.model_flops_per_token(SMALL, causal_halving=False) == 6 * n + 1536 == 11520
  assert flops.model_flops_per_token(SMALL) == 6 * n + 768 == 10752
  assert flops.model_flops_per_step(SMALL, global_batch=3) == 10752 * 3 * 8


def _tiny_model(**kw):
  fields = dict(vocab_size=16, model_dims=8, num_layers=2, num_heads=2, dim_per_head=4,
                hidden_dims=32, use_repeated_layer=False, checkpoint_policy="SAVE_EVERYTHING")
  fields.update(kw)
  from paxlike.models.language_model import LanguageModel

  return LanguageModel(**fields)


def test_formula_is_three_times_the_models_forward_matmuls():
  """The unhalved formula equals 3 x every matmul the model's forward pass runs."""
  model = _tiny_model()
  ids = jnp.zeros((3, 8), jnp.int32)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), ids))
  forward = jax.make_jaxpr(lambda p: model.apply(p, ids))(params)
  assert 3 * flops.jaxpr_matmul_flops(forward) == flops.model_flops_per_step(
      SMALL, global_batch=3, causal_halving=False)


def _compiled_step(overrides, devices=1):
  exp = experiment.instantiate(registry.get("LmCloudSpmdTiny"), overrides)
  task = config.build(exp.task())
  seq = exp.MAX_SEQ_LEN
  batch_size = exp.PERCORE_BATCH_SIZE * devices
  part = SpmdPartitioner(mesh.build(exp.ICI_MESH_SHAPE, None, devices=jax.devices()[:devices]))
  tx = task.learner.transform()
  batch = {k: jax.ShapeDtypeStruct((batch_size, seq), dt, sharding=part.batch_sharding)
           for k, dt in (("ids", jnp.int32), ("labels", jnp.int32), ("weights", jnp.float32))}
  sample = task.model.init_batch(batch)
  _, logical = logical_specs(task.model, tx, sample)
  part.set_state_specs(logical)
  state = part.abstract_state(jax.eval_shape(init_fn(task.model, tx, sample), jax.random.key(0)))
  key = jax.eval_shape(lambda: jax.random.key(0))
  step = part.compile(make_train_step(task.model, tx, task.learner.lr_schedule(), part.reduce))
  dims = task.model.flops_dims(seq)
  return step, (state, batch, key), dims, batch_size


# Matmul-dominated shapes; XLA also counts the elementwise work (softmax, norms,
# Adam), a few percent here.
XLA_SETTINGS = ["MODEL_DIMS=128", "NUM_HEADS=4", "VOCAB_SIZE=512", "MAX_SEQ_LEN=64",
                "PERCORE_BATCH_SIZE=4", "NUM_LAYERS=2"]
TOLERANCE = 0.06


def test_model_flops_match_xla_cost_analysis_without_remat_or_loops():
  """No remat, no scan: XLA's count of the compiled step is the model FLOPs (with the
  full, unmasked attention XLA actually computes) within TOLERANCE."""
  step, args, dims, batch = _compiled_step(
      [*XLA_SETTINGS, "USE_REPEATED_LAYER=False", "CHECKPOINT_POLICY='SAVE_EVERYTHING'"])
  hw = flops.hardware_flops(step, args, num_devices=1)
  model = flops.model_flops_per_step(dims, batch, causal_halving=False)
  assert hw.loop_correction == 0
  assert hw.xla_flops == pytest.approx(model, rel=TOLERANCE)
  assert hw.jaxpr_matmul_flops == pytest.approx(model, rel=0.001)


def test_hardware_flops_count_every_scanned_layer_and_the_remat():
  """Scanned layers with SAVE_NOTHING remat on a 2-device mesh: XLA's own number counts
  the loop body once; the corrected count matches the unrolled matmuls and exceeds the
  model FLOPs by the recomputed forward pass (between 1x and 4/3x)."""
  step, args, dims, batch = _compiled_step(
      [*XLA_SETTINGS, "NUM_LAYERS=4", "ICI_MESH_SHAPE=[1,2,1]"], devices=2)
  hw = flops.hardware_flops(step, args, num_devices=2)
  model = flops.model_flops_per_step(dims, batch, causal_halving=False)
  assert hw.loop_correction > 0.3 * hw.xla_flops
  assert hw.total == pytest.approx(hw.jaxpr_matmul_flops, rel=TOLERANCE)
  assert model < hw.total < 4 / 3 * model * (1 + TOLERANCE)


def test_peak_comes_from_the_flag_then_the_table_then_a_cpu_calibration():
  tpu = types.SimpleNamespace(device_kind="TPU v4", platform="tpu")
  odd = types.SimpleNamespace(device_kind="Accelerator 9000", platform="accel")
  assert flops.resolve_peak([tpu], "bfloat16", 123.0) == (123e12, "--peak_tflops_per_device")
  assert flops.resolve_peak([tpu], "bfloat16")[0] == 275e12
  assert flops.resolve_peak([odd], "bfloat16")[0] is None
  peak, source = flops.resolve_peak(jax.devices()[:2], "float32")
  assert source.startswith("calibrated: 2-device float32 matmul")
  assert 1e8 < peak < 1e13  # a CPU core does GFLOP/s, not TFLOP/s


def test_add_mfu_reports_mfu_and_hfu():
  from paxlike.trainer import TrainOptions, _add_mfu

  options = TrainOptions(model_flops_per_step=6e12, peak_flops_per_device=1e12,
                         hardware_flops_per_step=8e12)
  values = {"steps_per_sec": 0.5}
  _add_mfu(values, options, num_devices=4)
  assert values["tflops_per_device"] == pytest.approx(0.75)
  assert values["mfu"] == pytest.approx(0.75)
  assert values["hfu"] == pytest.approx(1.0)


def test_lm_dims_come_from_the_built_model():
  exp = experiment.instantiate(registry.get("C4Spmd1BAdam4Replicas"))
  model = fdl.build(exp.model())
  dims = model.flops_dims(exp.MAX_SEQ_LEN)
  assert dims == flops.LmDims(13, 2560, 10240, 20, 128, 32000, 1024)
  assert model.compute_dtype() == "bfloat16"
