"""The training loop in-process: resume is exact, checkpoint cadence and retention."""

from __future__ import annotations

import re
import shutil

import jax
import numpy as np
import pytest
from conftest import TINY, train_in_process

from paxlike import checkpoints
from paxlike.errors import UserError

# Batch = PERCORE_BATCH_SIZE x 8 local (fake) devices = 8 rows of 16 tokens.
SMALL = ["PERCORE_BATCH_SIZE=1", "MAX_SEQ_LEN=16", "SUMMARY_INTERVAL_STEPS=1",
         "LR_COS_WARMUP=2", "LR_COS_DECAY_START=2", "LR_COS_DECAY_END=20"]
K, N = 4, 8


def _leaves(tree):
  return jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]


def _assert_bitwise_equal(a, b):
  la, lb = _leaves(a), _leaves(b)
  assert [p for p, _ in la] == [p for p, _ in lb]
  for (path, x), (_, y) in zip(la, lb, strict=True):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape, jax.tree_util.keystr(path)
    assert np.array_equal(x, y), f"{jax.tree_util.keystr(path)} differs"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """An N-step run interrupted after K steps and resumed, and an uninterrupted one."""
  resumed_dir = tmp_path_factory.mktemp("resumed")
  first, _, _ = train_in_process(TINY, [*SMALL, f"NUM_TRAIN_STEPS={K}",
                                        "CHECKPOINT_EVERY_N_STEPS=3"], resumed_dir)
  second, _, _ = train_in_process(TINY, [*SMALL, f"NUM_TRAIN_STEPS={N}",
                                         "CHECKPOINT_EVERY_N_STEPS=3"], resumed_dir)
  straight_dir = tmp_path_factory.mktemp("straight")
  straight, _, _ = train_in_process(TINY, [*SMALL, f"NUM_TRAIN_STEPS={N}",
                                           "CHECKPOINT_EVERY_N_STEPS=3"], straight_dir)
  return {"first": first, "second": second, "straight": straight,
          "resumed_dir": resumed_dir, "straight_dir": straight_dir}


def test_resumed_run_trains_only_the_remaining_steps(runs):
  assert (runs["first"].start_step, runs["first"].final_step) == (0, K)
  assert (runs["second"].start_step, runs["second"].final_step) == (K, N)
  assert [h["step"] for h in runs["second"].history] == list(range(K + 1, N + 1))
  assert (runs["straight"].start_step, runs["straight"].final_step) == (0, N)


def test_resumed_run_matches_an_uninterrupted_run_bitwise(runs):
  resumed, straight = runs["second"].state, runs["straight"].state
  assert int(resumed.step) == int(straight.step) == N
  _assert_bitwise_equal(resumed.params, straight.params)
  _assert_bitwise_equal(resumed.opt_state, straight.opt_state)
  # The same losses at the same steps: the input stream resumed where it stopped.
  straight_losses = {h["step"]: h["loss"] for h in runs["straight"].history}
  for h in runs["second"].history:
    assert h["loss"] == straight_losses[h["step"]]
  # ... and the remaining steps did change the model.
  emb_k = np.asarray(runs["first"].state.params["softmax"]["embedding"])
  assert not np.array_equal(emb_k, np.asarray(straight.params["softmax"]["embedding"]))


def test_final_checkpoints_hold_the_final_state(runs):
  target = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      runs["straight"].state)
  for key in ("resumed_dir", "straight_dir"):
    ckpt = checkpoints.Checkpointer(checkpoints.checkpoint_dir(str(runs[key])), read_only=True)
    assert ckpt.latest_step() == N
    state, input_state = ckpt.restore(N, target)
    ckpt.close()
    assert input_state == {"step": N}
    _assert_bitwise_equal(state, runs["straight"].state)


def test_checkpoint_cadence_and_retention(runs):
  straight = checkpoints.Checkpointer(checkpoints.checkpoint_dir(str(runs["straight_dir"])),
                                      read_only=True)
  # Every 3 steps, plus the last step.
  assert straight.all_steps() == [3, 6, N]
  straight.close()
  resumed = checkpoints.Checkpointer(checkpoints.checkpoint_dir(str(runs["resumed_dir"])),
                                     read_only=True)
  assert resumed.all_steps() == [3, K, 6, N]
  resumed.close()


def test_max_checkpoints_to_keep(tmp_path):
  train_in_process(TINY, [*SMALL, "NUM_TRAIN_STEPS=4", "CHECKPOINT_EVERY_N_STEPS=1",
                          "CHECKPOINT_MAX_TO_KEEP=2"], tmp_path)
  names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
  assert names == ["checkpoint_00000003", "checkpoint_00000004"]


def test_rerun_at_num_train_steps_trains_nothing(runs, tmp_path):
  job = tmp_path / "job"
  shutil.copytree(runs["straight_dir"], job)
  result, _, _ = train_in_process(TINY, [*SMALL, f"NUM_TRAIN_STEPS={N}"], job)
  assert (result.start_step, result.final_step) == (N, N)
  assert result.history == []
  _assert_bitwise_equal(result.state, runs["straight"].state)


def test_restore_of_a_missing_step_names_the_available_ones(runs, tmp_path):
  source = checkpoints.checkpoint_dir(str(runs["straight_dir"]))
  with pytest.raises(UserError) as e:
    train_in_process(TINY, [*SMALL, "NUM_TRAIN_STEPS=9"], tmp_path,
                     restore_checkpoint_dir=source, restore_checkpoint_step=5)
  msg = str(e.value).replace(source, "DIR")
  assert re.search(r"\b5\b", msg) and "[3, 6, 8]" in msg, msg


def test_warm_start_from_another_jobs_checkpoints(runs, tmp_path):
  result, _, _ = train_in_process(
      TINY, [*SMALL, f"NUM_TRAIN_STEPS={N}"], tmp_path,
      restore_checkpoint_dir=checkpoints.checkpoint_dir(str(runs["resumed_dir"])),
      restore_checkpoint_step=K)
  assert (result.start_step, result.final_step) == (K, N)
  _assert_bitwise_equal(result.state, runs["straight"].state)
