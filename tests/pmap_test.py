"""The pmap loop: agrees with SPMD, resumes exactly, shares checkpoints with SPMD."""

from __future__ import annotations

import os
import shutil

import jax
import numpy as np
import pytest

from paxlike import config, experiment, mesh, registry, trainer
from paxlike.errors import UserError
from paxlike.partitioning import PmapPartitioner, SpmdPartitioner

PMAP_TINY = "LmCloudTransformerAdamTiny"
SMALL = ["PERCORE_BATCH_SIZE=2", "SUMMARY_INTERVAL_STEPS=1", "CHECKPOINT_EVERY_N_STEPS=3"]


def run(exp_name, overrides, job_log_dir, num_devices=4, **options):
  """Trains in-process on the first num_devices devices, pmap or SPMD as the experiment says."""
  exp = experiment.instantiate(registry.get(exp_name), overrides)
  devices = jax.devices()[:num_devices]
  if exp.ICI_MESH_SHAPE is None:
    partitioner = PmapPartitioner(devices)
  else:
    partitioner = SpmdPartitioner(mesh.build(exp.ICI_MESH_SHAPE, exp.DCN_MESH_SHAPE, devices))
  task = config.build(exp.task())
  train_input = config.build(exp.datasets()[0])
  train_input.bind_host(1, 0)
  options.setdefault("enable_summary_writer", False)
  options.setdefault("async_checkpoint", False)
  if partitioner.kind == "pmap":
    options.setdefault("checkpoint_format", "msgpack")
  os.makedirs(job_log_dir, exist_ok=True)
  result = trainer.train(task, train_input, partitioner, str(job_log_dir),
                         trainer.TrainOptions(**options))
  state = result.state
  if partitioner.kind == "pmap":
    state = partitioner.to_saveable(state)
  return result, jax.tree.map(np.asarray, jax.device_get(state))


def losses(result):
  return np.array([h["loss"] for h in result.history])


def assert_trees_equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb, strict=True):
    np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """The 6-step pmap run and state: the same for either checkpoint format."""
  return run(PMAP_TINY, SMALL + ["NUM_TRAIN_STEPS=6"], tmp_path_factory.mktemp("full"),
             enable_checkpoint_saving=False)


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory):
  """fmt -> (job_log_dir, result, state) of a 3-step pmap run that saved step 3 in that
  checkpoint format; run once per format. A test that trains on copies the directory."""
  runs = {}

  def get(fmt):
    if fmt not in runs:
      job = tmp_path_factory.mktemp(f"three_{fmt}")
      runs[fmt] = (job, *run(PMAP_TINY, SMALL + ["NUM_TRAIN_STEPS=3"], job,
                             checkpoint_format=fmt))
    return runs[fmt]

  return get


def test_pmap_and_spmd_give_the_same_losses(tmp_path, uninterrupted):
  pmap_result, _ = uninterrupted
  spmd_result, _ = run(PMAP_TINY, SMALL + ["NUM_TRAIN_STEPS=6", "ICI_MESH_SHAPE=[1,4,1]"],
                       tmp_path / "spmd")
  assert [h["step"] for h in pmap_result.history] == [1, 2, 3, 4, 5, 6]
  np.testing.assert_allclose(losses(pmap_result), losses(spmd_result), rtol=1e-5)
  assert losses(pmap_result)[-1] < losses(pmap_result)[0]


@pytest.mark.parametrize("fmt", ["msgpack", "tensorstore"])
def test_pmap_resume_is_bitwise_exact(tmp_path, fmt, uninterrupted, three_steps):
  first_job, first, _ = three_steps(fmt)
  shutil.copytree(first_job, tmp_path / "resumed")
  assert first.final_step == 3
  stored = os.listdir(tmp_path / "resumed" / "checkpoints" / "checkpoint_00000003" / "state")
  assert ("state.msgpack" in stored) == (fmt == "msgpack")
  second, resumed = run(PMAP_TINY, SMALL + ["NUM_TRAIN_STEPS=6"], tmp_path / "resumed",
                        checkpoint_format=fmt)
  assert second.start_step == 3 and second.final_step == 6
  assert_trees_equal(resumed, uninterrupted[1])


def test_pmap_checkpoint_initialises_spmd_and_back(tmp_path, three_steps):
  pmap_job, _, pmap_state = three_steps("msgpack")  # read only: nothing trains on in it
  # SPMD run of the same model starting from the pmap run's checkpoint: nothing left to train,
  # so its state is exactly what it restored.
  spmd, spmd_state = run(PMAP_TINY, SMALL + ["NUM_TRAIN_STEPS=3", "ICI_MESH_SHAPE=[1,2,2]"],
                         tmp_path / "spmd",
                         restore_checkpoint_dir=str(pmap_job / "checkpoints"))
  assert spmd.start_step == 3
  assert_trees_equal(spmd_state, pmap_state)
  assert "mdl" in str(spmd.state.params["softmax"]["embedding"].sharding.spec)
  # And back: an SPMD checkpoint (tensorstore) initialises a pmap run.
  spmd2, _ = run(PMAP_TINY, SMALL + ["NUM_TRAIN_STEPS=4", "ICI_MESH_SHAPE=[1,2,2]"],
                 tmp_path / "spmd", restore_checkpoint_dir=str(pmap_job / "checkpoints"))
  assert spmd2.start_step == 3
  back, back_state = run(PMAP_TINY, SMALL + ["NUM_TRAIN_STEPS=4"], tmp_path / "pmap_again",
                         restore_checkpoint_dir=str(tmp_path / "spmd" / "checkpoints"))
  assert back.start_step == 4
  _, spmd_final = run(PMAP_TINY, SMALL + ["NUM_TRAIN_STEPS=4", "ICI_MESH_SHAPE=[1,2,2]"],
                      tmp_path / "spmd")
  assert_trees_equal(back_state, spmd_final)


def test_pmap_batch_that_does_not_divide_is_a_user_error(tmp_path):
  exp = experiment.instantiate(registry.get(PMAP_TINY), ["NUM_TRAIN_STEPS=1"])
  train_input = config.build(exp.datasets()[0])
  train_input.batch_size = 6
  train_input.bind_host(1, 0)
  with pytest.raises(UserError, match=r"per-host batch 6 .* 4 local devices"):
    trainer.train(config.build(exp.task()), train_input, PmapPartitioner(jax.devices()[:4]),
                  str(tmp_path), trainer.TrainOptions(enable_summary_writer=False))
