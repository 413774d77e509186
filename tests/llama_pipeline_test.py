"""A pipelined Llama trains as the same layers run plainly (8 fake CPU devices, float32).

As tests/pipeline_test.py does for the LM: started from the same weights (the
plain model's, restacked into the pipeline's [circular_repeat, stages, ...]
layout), GPipe and circular schedules give the plain model's loss at every
step and its parameters after three Adam steps, on packed rows (two examples
a row, their rotary positions restarting). A Hugging Face checkpoint is placed
straight into the stages, block by block.
"""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest
from conftest import describe, parse_trained_line, run_cli
from pipeline_test import STEPS, assert_trains_as_plain, plain_run

from paxlike import config, experiment, registry

SMALL = ["MAX_SEQ_LEN=16", "VOCAB_SIZE=64"]
BATCH, SEQ = 16, 16


def _task(overrides: list[str]):
  exp = experiment.instantiate(registry.get("LlamaPipelineTiny"), SMALL + overrides)
  return exp, config.build(experiment.task_config(exp))


def _batches(vocab: int) -> list[dict[str, np.ndarray]]:
  """One batch of packed rows per step: two examples a row (segments 1 and 2), positions
  restarting at the second."""
  rng = np.random.default_rng(0)
  half = SEQ // 2
  segment_ids = np.repeat(np.array([[1] * half + [2] * (SEQ - half)], np.int32), BATCH, 0)
  positions = np.repeat(np.array([list(range(half)) + list(range(SEQ - half))], np.int32),
                        BATCH, 0)
  ids = rng.integers(1, vocab, (BATCH, SEQ + 1)).astype(np.int32)
  weights = (rng.random((BATCH, SEQ)) > 0.1).astype(np.float32)
  batch = {"ids": ids[:, :-1], "labels": ids[:, 1:], "weights": weights,
           "segment_ids": segment_ids, "positions": positions}
  return [batch] * STEPS  # the same rows each step: the loss must fall


@pytest.fixture(scope="module")
def reference():
  """The plain (unpipelined, scanned) model's run on one device."""
  _, task = _task([])
  return plain_run(task, _batches(task.model.vocab_size))


@pytest.mark.parametrize("stages,microbatches,repeat,repeated,mesh", [
    (2, 4, 1, False, [2, 1, 2, 1]),  # GPipe: 2 stages x 2 layers unrolled, 2-way data
    (2, 4, 2, True, [2, 1, 1, 2]),  # circular: 2 passes over 2 stages of 1 layer, 2-way model
])
def test_pipelined_llama_trains_as_the_plain_stack(reference, stages, microbatches, repeat,
                                                   repeated, mesh):
  assert_trains_as_plain(_task, reference, stages, microbatches, repeat, repeated, mesh)


@pytest.mark.parametrize("repeated,repeat", [(False, 1), (True, 2)])
def test_a_hugging_face_checkpoint_goes_straight_into_the_stages(reference, tmp_path,
                                                                  repeated, repeat):
  from paxlike.interop import hf
  from paxlike.interop.hf_files import materialize

  params = reference[0]
  _, task = _task([f"USE_REPEATED_LAYER={repeated}", f"CIRCULAR_REPEAT={repeat}"])
  model = task.model
  hf.export_params(params, model.unpipelined(), str(tmp_path / "hf"))
  lazy = hf.lazy_params(str(tmp_path / "hf"), model)
  want = model.restack_params(params)
  got = materialize(lazy)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(a, b)
  # A block (one stage's half of the layers, as a device holding that shard reads it).
  leaf = lazy["layers"]["pipeline"]
  leaf = leaf["repeat"] if repeated else leaf["x_layers_1"]
  q = leaf["self_attn"]["q_proj"]["w"]
  full = q.read()
  for block in ((slice(None), slice(1, 2), slice(0, max(1, q.shape[2] // 2))),
                (slice(0, 1), slice(0, 1), slice(1, 1))):  # the last one empty
    np.testing.assert_array_equal(q.read(block), full[block])


def test_a_pipelined_job_resumes_in_another_layout_as_the_unchanged_run(tmp_path):
  """The CLI: a checkpoint of 2 unrolled stages resumes with each stage scanned (the
  layers restacked, Adam's moments with them) and ends where the uninterrupted run did."""
  sets = ["--set", "NUM_TRAIN_STEPS=6", "--set", "CHECKPOINT_EVERY_N_STEPS=2", "--set",
          "SUMMARY_INTERVAL_STEPS=2"]
  proc = run_cli(["--exp=LlamaPipelineTiny", "--job_log_dir=straight", *sets], tmp_path,
                 devices=2)
  assert proc.returncode == 0, describe(proc)
  straight = parse_trained_line(proc.stdout)
  shutil.copytree(tmp_path / "straight", tmp_path / "scanned")
  shutil.rmtree(tmp_path / "scanned" / "checkpoints" / "checkpoint_00000006")
  proc = run_cli(["--exp=LlamaPipelineTiny", "--job_log_dir=scanned", *sets, "--set",
                  "USE_REPEATED_LAYER=True"], tmp_path, devices=2)
  assert proc.returncode == 0, describe(proc)
  assert "restacked the layers of checkpoint step 4" in proc.stderr, describe(proc)
  resumed = parse_trained_line(proc.stdout)
  assert (resumed["start_step"], resumed["final_step"]) == (4, 6)
  assert resumed["last_loss"] == pytest.approx(straight["last_loss"], rel=1e-5)
