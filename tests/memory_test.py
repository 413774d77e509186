"""--device_memory_gib: a step that cannot fit is refused before step 1, in one line."""

from __future__ import annotations

import pytest
from conftest import REPO_ROOT, TINY, describe, run_cli

from paxlike import memory
from paxlike.errors import UserError

SMALL = ["--set", "NUM_TRAIN_STEPS=4", "--set", "CHECKPOINT_EVERY_N_STEPS=2",
         "--set", "MODEL_DIMS=32", "--set", "MAX_SEQ_LEN=16", "--set", "PERCORE_BATCH_SIZE=2"]


def test_a_budget_below_the_step_is_refused_before_step_1_and_keeps_the_job(tmp_path):
  # A new job refused so leaves no folder (not even an empty checkpoints/).
  new = tmp_path / "new"
  proc = run_cli([f"--exp={TINY}", f"--job_log_dir={new}", "--device_memory_gib=0.0001",
                  *SMALL], REPO_ROOT)
  assert proc.returncode == 2 and "GiB per device" in proc.stderr, describe(proc)
  assert not new.exists(), sorted(new.rglob("*"))
  job = tmp_path / "job"
  first = run_cli([f"--exp={TINY}", f"--job_log_dir={job}", *SMALL], REPO_ROOT)
  assert first.returncode == 0, describe(first)
  kept = sorted(p.name for p in (job / "checkpoints").iterdir())
  files = {p: p.read_bytes() for p in job.rglob("*")
           if p.is_file() and "checkpoints" not in p.parts and p.name != "job.lock"}
  folders = {p for p in job.rglob("*") if p.is_dir()}
  more = [*SMALL, "--set", "NUM_TRAIN_STEPS=6"]
  proc = run_cli([f"--exp={TINY}", f"--job_log_dir={job}", "--device_memory_gib=0.0001", *more],
                 REPO_ROOT)
  assert proc.returncode == 2, describe(proc)
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "GiB per device" in errors[0] and "0.00 GiB" in errors[0], errors
  assert "checkpoint of step 4 is kept" in errors[0] and "Traceback" not in proc.stderr
  # The remedies less the one in place (the template's CHECKPOINT_POLICY is SAVE_NOTHING).
  assert "NUM_MICROBATCHES=2" in errors[0] and "'SAVE_NOTHING'" not in errors[0], errors
  assert "step 5" not in proc.stdout + proc.stderr  # refused before the first new step
  assert sorted(p.name for p in (job / "checkpoints").iterdir()) == kept
  # Its records (another NUM_TRAIN_STEPS) and summary files are put back: the job is as it was.
  assert {p: p.read_bytes() for p in job.rglob("*") if p.is_file() and "checkpoints" not in
          p.parts and p.name != "job.lock"} == files
  assert {p for p in job.rglob("*") if p.is_dir()} == folders
  # A budget that holds the step trains on from the kept checkpoint.
  ok = run_cli([f"--exp={TINY}", f"--job_log_dir={job}", "--device_memory_gib=8", *more],
               REPO_ROOT)
  assert ok.returncode == 0, describe(ok)
  assert "checkpoint_00000006" in {p.name for p in (job / "checkpoints").iterdir()}


def test_an_out_of_memory_error_becomes_one_sentence_naming_the_kept_checkpoint():
  with pytest.raises(UserError, match="ran out of device memory.*checkpoint of step 8 is kept"):
    with memory.out_of_memory_is_one_line(lambda: 8):
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 12 GiB.")
  with pytest.raises(ValueError):  # other errors pass through unchanged
    with memory.out_of_memory_is_one_line(lambda: 8):
      raise ValueError("something else")


def test_a_refused_trainer_puts_back_its_own_files_and_leaves_an_evalers(tmp_path):
  """What a trainer refused before step 1 undoes is its own: an evaler restarted beside it
  (after a preemption both restart) keeps what it wrote meanwhile."""
  from paxlike.main import _JobFiles

  job = tmp_path / "job"
  (job / "summaries" / "train").mkdir(parents=True)
  (job / "run_env.json").write_text('{"old": 1}\n')
  before = _JobFiles(str(job))
  # The trainer rewrites its record and makes its folders; an evaler writes its own.
  (job / "run_env.json").write_text('{"new": 1}\n')
  (job / "model_params.txt").write_text("new\n")
  (job / "checkpoints").mkdir()
  (job / "summaries" / "train" / "events.out.tfevents.1").write_bytes(b"x")
  (job / "eval_run_env.json").write_text("{}\n")
  (job / "summaries" / "eval_test").mkdir()
  (job / "dry_run.json").write_text("{}\n")  # a dry run's report
  (job / "run_env.json.tmp-host-7").write_text("{")  # another process's write in flight
  before.put_back()
  assert (job / "dry_run.json").exists() and (job / "run_env.json.tmp-host-7").exists()
  assert (job / "run_env.json").read_text() == '{"old": 1}\n'
  assert not (job / "model_params.txt").exists() and not (job / "checkpoints").exists()
  assert list((job / "summaries" / "train").iterdir()) == []  # it was there before
  assert (job / "eval_run_env.json").exists() and (job / "summaries" / "eval_test").is_dir()
