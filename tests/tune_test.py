"""--mode=tune: compiled memory and measured time per layout; the winner trains next."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest
from conftest import REPO_ROOT, TINY, describe, run_cli

from paxlike import experiment, registry, tune
from paxlike.errors import UserError

SMALL = ["MODEL_DIMS=32", "MAX_SEQ_LEN=16", "PERCORE_BATCH_SIZE=2", "USE_REPEATED_LAYER=True"]


def _sets(values):
  return [a for v in values for a in ("--set", v)]


def _exp(overrides):
  return experiment.instantiate(registry.get(TINY), overrides)


def test_tune_picks_the_fastest_layout_that_fits_and_the_next_train_takes_it(tmp_path):
  job = tmp_path / "job"
  proc = run_cli([f"--exp={TINY}", f"--job_log_dir={job}", "--mode=tune", *_sets(SMALL)],
                 REPO_ROOT, timeout=600)
  assert proc.returncode == 0, describe(proc)
  record = json.loads((job / "tune" / "tune.json").read_text())
  rows = record["candidates"]
  assert len(rows) >= 4 and all(r["peak_bytes"] > 0 and r["step_seconds"] > 0 for r in rows)
  # USE_REPEATED_LAYER came from --set: it is kept; the policies are what varies.
  assert all(set(r["overrides"]) == {"CHECKPOINT_POLICY"} for r in rows)
  fastest = min(rows, key=lambda r: r["step_seconds"])
  assert record["winner"]["overrides"] == fastest["overrides"]
  assert "(chosen)" in (job / "tune" / "tune.txt").read_text()

  train = run_cli([f"--exp={TINY}", f"--job_log_dir={job}",
                   *_sets([*SMALL, "NUM_TRAIN_STEPS=2"])], REPO_ROOT)
  assert train.returncode == 0, describe(train)
  layout = json.loads((job / "run_env.json").read_text())["layout"]
  assert layout["applied"] == fastest["overrides"] and "tune" in layout["why"]

  # A budget between the smallest and the largest layout rules out the larger ones.
  peaks = sorted(r["peak_bytes"] for r in rows)
  assert peaks[0] < peaks[-1], peaks
  budget_gib = (peaks[0] + peaks[-1]) / 2 / tune.GIB
  tight = tmp_path / "tight"
  proc = run_cli([f"--exp={TINY}", f"--job_log_dir={tight}", "--mode=tune",
                  f"--device_memory_gib={budget_gib!r}",
                  # NUM_MICROBATCHES set: no microbatched retries of the layouts over budget
                  *_sets([*SMALL, "NUM_MICROBATCHES=1"])], REPO_ROOT, timeout=600)
  assert proc.returncode == 0, describe(proc)
  record = json.loads((tight / "tune" / "tune.json").read_text())
  too_big = [c for c in record["candidates"] if c["fits"] is False]
  assert too_big, record["candidates"]
  best = record["winner"]
  assert best is not None and best["fits"] and best not in too_big
  assert best["step_seconds"] == min(c["step_seconds"] for c in record["candidates"]
                                     if c["fits"] and c["step_seconds"])
  # A knob the user sets is kept when the winner is applied.
  mine = _exp([*SMALL, "CHECKPOINT_POLICY=SAVE_NOTHING"])
  layout = tune.apply_winner(mine, str(tight))
  assert layout["kept_as_set"] == {"CHECKPOINT_POLICY": "SAVE_NOTHING"}
  assert mine.CHECKPOINT_POLICY == "SAVE_NOTHING"
  # Another experiment's table is not applied; nor is a damaged one: one line each.
  other = experiment.instantiate(registry.get("LmCloudSpmdPipelineTiny"), [])
  with pytest.raises(UserError, match=r"tune.json was measured for .*LmCloudSpmdTiny, not "
                                      r".*LmCloudSpmdPipelineTiny; train this experiment"):
    tune.apply_winner(other, str(tight))
  (tight / "tune" / "tune.json").write_text("{not json")
  with pytest.raises(UserError, match=r"tune.json cannot be read as --mode=tune's table"):
    tune.apply_winner(_exp(SMALL), str(tight))


@pytest.mark.parametrize("flag", ["--device_memory_gib=0"])
def test_a_bad_budget_is_one_line(tmp_path, flag):
  proc = run_cli([f"--exp={TINY}", f"--job_log_dir={tmp_path / 'j'}", "--mode=tune", flag],
                 REPO_ROOT)
  assert proc.returncode == 2 and "must be positive" in proc.stderr, describe(proc)
  assert not (tmp_path / "j").exists()


def test_dry_run_layouts_tables_each_layouts_memory_and_fit_without_timings(tmp_path):
  job = tmp_path / "job"
  # CHECKPOINT_POLICY from --set: two candidates, scanned (the configured one, compiled
  # once) and unrolled.
  sets = [*SMALL[:-1], "CHECKPOINT_POLICY=SAVE_NOTHING"]
  proc = run_cli([f"--exp={TINY}", f"--job_log_dir={job}", "--mode=dry_run",
                  "--dry_run_layouts", "--target=tpu_v5e", *_sets(sets)], REPO_ROOT)
  assert proc.returncode == 0, describe(proc)
  text = (job / "dry_run" / "layouts.txt").read_text()
  lines = text.splitlines()
  assert lines[0] == "| layout | GiB / device | fits |", text
  assert [line.split(" | ")[0] for line in lines[2:4]] == ["| scanned", "| unrolled"], text
  assert all(line.endswith(" | yes |") for line in lines[2:4]), text
  assert "step s" not in text and "MFU" not in text and "(chosen)" not in text
  assert text in proc.stdout and "16 GiB usable per device" in text
  record = json.loads((job / "dry_run" / "layouts.json").read_text())
  rows = record["candidates"]
  assert [r["overrides"] for r in rows] == [{"USE_REPEATED_LAYER": True},
                                            {"USE_REPEATED_LAYER": False}]
  assert all(r["peak_bytes"] > 0 and r["fits"] is True and r["step_seconds"] is None
             for r in rows), rows
  # The configured (scanned) layout's row is the dry run's own compiled peak.
  report = json.loads((job / "dry_run.json").read_text())
  assert rows[0]["peak_bytes"] == report["compiled_memory_per_device"]["peak"]
  assert record["timed"] is False and record["winner"] is None
  assert "--dry_run_layouts" not in proc.stdout  # the hint is for runs without the flag


def test_timing_in_turns_cancels_a_machine_that_slows_down_while_tuning():
  """A simulated machine that gets 1.5% slower every step (clocks, a neighbour's load):
  timing the layouts one after the other hands the drift to whichever runs first;
  time_interleaved's turns give every layout the same share, and the cheapest wins."""
  costs = {"A": 1.00, "B": 1.04, "C": 1.08, "D": 1.12}  # true seconds per step at t = 0
  cands = [tune.Candidate({"CHECKPOINT_POLICY": name}) for name in costs]
  clock = {"steps": 0}

  def step(c):
    clock["steps"] += 1
    return costs[c.overrides["CHECKPOINT_POLICY"]] * (1 + 0.015 * clock["steps"])

  def visit(c, warmup=1, timed=2):
    return [step(c) for _ in range(warmup + timed)][warmup:]

  # One after the other, the priciest first (2 warm-up and 5 timed steps each): the
  # drift alone decides, and the last to run, the cheapest, looks slowest.
  one_by_one = {name: statistics.median(visit(c, 2, 5)) for name, c in
                zip(reversed(costs), reversed(cands), strict=True)}
  assert min(one_by_one, key=one_by_one.get) == "D"

  clock["steps"] = 0
  tune.time_interleaved(cands, visit)
  assert tune.winner([dataclasses.replace(c, fits=True) for c in cands]).overrides == {
      "CHECKPOINT_POLICY": "A"}
  # The measured order is the true order.
  assert [c.overrides["CHECKPOINT_POLICY"] for c in sorted(cands, key=lambda c: c.step_seconds)
          ] == list(costs)


@pytest.mark.parametrize("name,knob", [(TINY, "NUM_MICROBATCHES"),
                                       ("LmCloudSpmdPipelineTiny", "GRADIENT_ACCUMULATION_STEPS")])
def test_a_layout_that_does_not_fit_is_retried_with_the_batch_in_slices(name, knob):
  """The retry splits the batch for gradient accumulation: NUM_MICROBATCHES, but on a
  pipelined experiment (whose NUM_MICROBATCHES is the pipeline's) GRADIENT_ACCUMULATION_STEPS."""
  exp = experiment.instantiate(registry.get(name), ["CHECKPOINT_POLICY=SAVE_NOTHING"])

  def measure(c):  # fits only in 4 slices
    c.fits = c.overrides.get(knob, 1) >= 4

  cands = tune.sweep(exp, measure)
  retries = [c.overrides for c in cands[2:]]
  assert [r[knob] for r in retries] == [2, 4, 2, 4], retries
  assert all(set(r) == {"USE_REPEATED_LAYER", knob} for r in retries), retries
  assert cands[-1].label().endswith("4 gradient-accumulation slices")
