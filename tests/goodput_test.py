"""Goodput: the wall-time split, progress.json, steps lost to a restart, MFU in summaries."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import TINY, train_in_process

from paxlike import goodput


class FakeClock:
  def __init__(self, t: float = 1000.0) -> None:
    self.t = t

  def __call__(self) -> float:
    return self.t

  def advance(self, seconds: float) -> None:
    self.t += seconds


def _simulate(rec: goodput.Recorder, clock: FakeClock, first: int, last: int,
              step_s: float = 1.0, first_wait: float = 0.25) -> None:
  """A loop over steps first..last: 0.25 s input wait each (first_wait before the first),
  a 2 s checkpoint at the end."""
  rec.loop_started()
  t0 = clock()
  for step in range(first, last + 1):
    with rec.span("input_wait"):
      clock.advance(first_wait if step == first else 0.25)
    if step == first:
      clock.advance(5.0 + step_s)  # compilation + the step itself
      # As the trainer times it: from the loop's start, the first batch's wait included.
      assert rec.first_step(clock() - t0) == pytest.approx(5.0 + step_s)
    else:
      clock.advance(step_s)
    rec.step_done(step)
  with rec.span("checkpoint"):
    clock.advance(2.0)
  rec.loop_ended(last)


def test_buckets_split_the_wall_time_exactly(tmp_path):
  clock = FakeClock()
  rec = goodput.Recorder(start=clock() - 10.0, clock=clock)  # 10 s of startup already
  with rec.span("checkpoint"):
    clock.advance(3.0)  # restoring
  rec.restored(str(tmp_path), step=0, seconds=0.0)  # nothing restored: init counts as startup
  _simulate(rec, clock, 1, 10)
  with rec.span("eval"):
    clock.advance(4.0)
  clock.advance(0.5)  # teardown
  rec.finish()
  r = rec.report()
  s = r["seconds"]
  assert r["wall_seconds"] == pytest.approx(10 + 3 + 10 * 0.25 + 5 + 10 + 2 + 4 + 0.5)
  assert sum(s.values()) == pytest.approx(r["wall_seconds"])
  assert s["startup"] == pytest.approx(10.0)
  assert s["checkpoint"] == pytest.approx(3.0 + 2.0)
  assert s["compilation"] == pytest.approx(5.0)
  assert s["productive"] == pytest.approx(10.0)
  assert s["input_wait"] == pytest.approx(2.5)
  assert s["eval"] == pytest.approx(4.0)
  assert s["other"] == pytest.approx(0.5)
  assert s["restart_redo"] == 0
  assert r["goodput"] == pytest.approx(10.0 / r["wall_seconds"])
  assert json.loads((tmp_path / "progress.json").read_text())["furthest_step"] == 10


def test_a_slow_first_batch_is_input_wait_not_compilation_or_lost_steps():
  """A SeqIO input filling its shuffle buffer makes the first batch wait 30 s: that is
  input_wait; compilation and the productive steps keep their own seconds."""
  clock = FakeClock()
  rec = goodput.Recorder(start=clock(), clock=clock)
  rec.restored(None, step=0)
  _simulate(rec, clock, 1, 10, first_wait=30.0)
  rec.finish()
  s = rec.report()["seconds"]
  assert (s["input_wait"], s["compilation"], s["productive"]) == pytest.approx(
      (30.0 + 9 * 0.25, 5.0, 10.0))
  assert sum(s.values()) == pytest.approx(rec.report()["wall_seconds"])


def test_steps_before_the_furthest_step_reached_count_as_lost_to_the_restart(tmp_path):
  goodput.write_progress(str(tmp_path), furthest_step=30, step_seconds=1.0)
  clock = FakeClock()
  rec = goodput.Recorder(start=clock(), clock=clock)
  rec.restored(str(tmp_path), step=20, seconds=1.5)  # checkpoint 20; the job had reached 30
  _simulate(rec, clock, 21, 40)
  rec.finish()
  r = rec.report()
  assert r["steps_lost_to_restart"] == 10 and r["steps_run"] == 20
  assert r["seconds"]["restart_redo"] == pytest.approx(10.0)
  assert r["seconds"]["productive"] == pytest.approx(10.0)
  assert r["seconds"]["checkpoint"] == pytest.approx(1.5 + 2.0)
  assert json.loads((tmp_path / "progress.json").read_text())["furthest_step"] == 40
  assert "10 steps re-done after a restart" in rec.summary_line()


def test_a_run_that_only_redoes_steps_shows_zero_goodput_not_minus_zero(tmp_path):
  # Every step of this run is one an earlier run reached: nothing productive. 1.8 s steps
  # make restart_redo = stepping x 3 / 3 round above stepping; the residue is not shown.
  goodput.write_progress(str(tmp_path), furthest_step=30, step_seconds=1.0)
  clock = FakeClock(0.0)
  rec = goodput.Recorder(start=clock(), clock=clock)
  rec.restored(str(tmp_path), step=20)
  _simulate(rec, clock, 21, 23, step_s=1.8, first_wait=0.0)
  rec.finish()
  assert rec.summary_line().startswith("goodput 0.0% of ")
  assert rec.summary_line().endswith("; 3 steps re-done after a restart")
  rec.write(str(tmp_path))
  written = json.loads((tmp_path / "goodput.json").read_text())
  assert written["seconds"]["productive"] == 0.0 and written["goodput"] == 0.0
  assert written["seconds"]["restart_redo"] == pytest.approx(3 * 1.8)
  assert sum(written["seconds"].values()) == pytest.approx(written["wall_seconds"])


def test_progress_is_not_rewritten_while_redoing_steps(tmp_path):
  goodput.write_progress(str(tmp_path), furthest_step=30, step_seconds=1.0)
  clock = FakeClock()
  rec = goodput.Recorder(start=clock(), clock=clock)
  rec.restored(str(tmp_path), step=20)
  _simulate(rec, clock, 21, 25)  # crashed again before reaching 30
  assert json.loads((tmp_path / "progress.json").read_text())["furthest_step"] == 30


def test_unknown_bucket_is_an_error():
  with pytest.raises(ValueError, match="unknown goodput bucket"):
    with goodput.Recorder().span("lunch"):
      pass


SETS = ["NUM_TRAIN_STEPS=12", "SUMMARY_INTERVAL_STEPS=4", "CHECKPOINT_EVERY_N_STEPS=8",
        "ICI_MESH_SHAPE=[1,2,1]", "MAX_SEQ_LEN=16", "PERCORE_BATCH_SIZE=4"]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
  job = tmp_path_factory.mktemp("goodput") / "job"
  result, _, _ = train_in_process(TINY, SETS, job, num_devices=2, peak_flops_per_device=1e10)
  return result, job


def test_train_summaries_carry_mfu_hfu_and_goodput(first_run):
  result, job = first_run
  timed = [h for h in result.history if "steps_per_sec" in h]
  assert timed
  for h in timed:
    assert h["mfu"] > 0 and h["hfu"] > h["mfu"]  # remat: hardware does more than the model
    assert h["tflops_per_device"] == pytest.approx(h["mfu"] * 1e10 / 1e12)
    assert 0 < h["goodput"] < 1
  report = json.loads((job / "goodput.json").read_text())
  assert report["steps_run"] == 12 and report["steps_lost_to_restart"] == 0
  assert sum(report["seconds"].values()) == pytest.approx(report["wall_seconds"], rel=1e-6)
  assert report["seconds"]["compilation"] > 0 and report["seconds"]["productive"] > 0


def test_restart_after_a_lost_checkpoint_counts_redone_steps(first_run, tmp_path):
  """The job reached step 12 but only checkpoint 8 survives: the rerun re-does 9..12."""
  _, job = first_run
  copy = tmp_path / "job"
  shutil.copytree(job, copy)
  shutil.rmtree(copy / "checkpoints" / "checkpoint_00000012")
  result, _, _ = train_in_process(TINY, [*SETS, "NUM_TRAIN_STEPS=14"], copy, num_devices=2)
  assert (result.start_step, result.final_step) == (8, 14)
  report = json.loads((copy / "goodput.json").read_text())
  assert report["restored_step"] == 8 and report["previous_furthest_step"] == 12
  assert report["steps_lost_to_restart"] == 4
  assert report["seconds"]["restart_redo"] > 0
  assert json.loads((copy / "progress.json").read_text())["furthest_step"] == 14
