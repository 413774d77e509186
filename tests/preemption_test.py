"""Graceful preemption: SIGTERM / SIGINT -> finish the step, checkpoint it, exit 42."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import threading
import time

import pytest
from fault_tools import (
    FAULT_EXP,
    complete_steps,
    describe,
    error_line,
    launch,
    partial_dirs,
    read_checkpoint,
    reference_job,
    run,
    step_dir,
)

from paxlike import follow, preemption, resume
from paxlike.errors import UserError

LONG = ["--set", "NUM_TRAIN_STEPS=1000000", "--set", "CHECKPOINT_EVERY_N_STEPS=1000000",
        "--set", "EVAL_INTERVAL_STEPS=0", "--set", "SUMMARY_INTERVAL_STEPS=10"]
STOPPED_RE = re.compile(r"stopped by (\w+) after step (\d+), checkpoint saved; exit status 42")


class _Tail:
  """Collects a process's stderr on a thread, so a test can wait for a line."""

  def __init__(self, proc) -> None:
    self.lines: list[str] = []
    self._thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
    self._thread.start()

  def _read(self, stream) -> None:
    for line in stream:
      self.lines.append(line)

  def wait_for(self, pattern: str, timeout: float = 240) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      for line in list(self.lines):
        m = re.search(pattern, line)
        if m:
          return m
      time.sleep(0.05)
    raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(self.lines)[-4000:]}")

  def text(self) -> str:
    self._thread.join(timeout=30)
    return "".join(self.lines)


def test_sigterm_saves_the_current_step_and_exits_42_then_resumes(tmp_path):
  job = tmp_path / "job"
  args = [FAULT_EXP, f"--job_log_dir={job}", *LONG]
  proc = launch(args, tmp_path)
  tail = _Tail(proc)
  tail.wait_for(r"paxlike step 20 ")

  # While it runs, a second run on the same job_log_dir refuses and names the holder.
  second = run(args, tmp_path)
  line = error_line(second)
  assert f"in use by pid {proc.pid} on host {socket.gethostname()}" in line, line

  sent = time.monotonic()
  proc.send_signal(signal.SIGTERM)
  out = proc.stdout.read()
  proc.wait(timeout=120)
  exit_seconds = time.monotonic() - sent
  err = tail.text()
  proc.stdout, proc.stderr = out, err
  assert proc.returncode == preemption.EXIT_PREEMPTED, describe(proc)
  m = STOPPED_RE.search(err)
  assert m and m.group(1) == "SIGTERM", describe(proc)
  stopped = int(m.group(2))
  assert stopped > 20
  assert complete_steps(job) == [stopped] and partial_dirs(job) == []
  assert not (job / "job.lock").exists()
  # The job says it was stopped short, so an evaler beside it waits for the rerun.
  record = follow.last_run_stopped(str(job))
  assert {k: record[k] for k in ("signal", "step")} == {"signal": "SIGTERM", "step": stopped}
  assert 0 <= time.time() - record["time"] < 120  # when: an evaler waits only so long after it
  assert exit_seconds < 60, exit_seconds  # generous: the CI machine is shared
  print(f"\nSIGTERM -> exit 42 in {exit_seconds:.2f}s, stopped after step {stopped}")

  resumed = run([FAULT_EXP, f"--job_log_dir={job}", *LONG[2:],
                 "--set", f"NUM_TRAIN_STEPS={stopped + 2}"], tmp_path)
  assert resumed.returncode == 0, describe(resumed)
  assert f"restored step {stopped} from" in resumed.stderr
  assert f"trained steps {stopped}..{stopped + 2}:" in resumed.stdout
  assert read_checkpoint(job, stopped + 2)["input/step"] == stopped + 2
  assert follow.last_run_stopped(str(job)) is None  # the rerun finished


def _stopped_then_rerun(args: list[str], cwd, job, stop_at: int) -> tuple[int, str]:
  """args run with a SIGTERM after step stop_at, then again: (the step saved, the rerun's
  output)."""
  proc = run(args, cwd, PAXLIKE_TEST_FAULT=f"term:step:{stop_at}")
  assert proc.returncode == preemption.EXIT_PREEMPTED, describe(proc)
  assert "rerun the same command to continue" in proc.stderr
  stopped = int(STOPPED_RE.search(proc.stderr).group(2))
  rerun = run(args, cwd)
  assert rerun.returncode == 0, describe(rerun)
  assert f"restored step {stopped} from {job / 'checkpoints'}" in rerun.stderr, describe(rerun)
  return stopped, rerun.stdout + rerun.stderr


def test_a_command_with_restore_flags_continues_its_job_when_rerun(tmp_path_factory, tmp_path):
  """The SIGTERM line says "rerun the same command": a job started from another job's step
  (--restore_checkpoint_dir/step), or rolled back to one of its own (--restore_checkpoint_step),
  continues from its own newest step when its command is rerun."""
  ref = reference_job(tmp_path_factory)  # steps 8, 12, 16
  job = tmp_path / "job"
  quick = ["--noeval_on_test", f"--job_log_dir={job}"]
  warm = [FAULT_EXP, *quick, f"--restore_checkpoint_dir={ref / 'checkpoints'}",
          "--restore_checkpoint_step=8", "--set", "NUM_TRAIN_STEPS=14"]
  stopped, out = _stopped_then_rerun(warm, tmp_path, job, 10)
  assert ("--restore_checkpoint_dir and --restore_checkpoint_step are not used: the job "
          f"continues from its own step {stopped}") in out
  assert f"trained steps {stopped}..14:" in out

  for step in complete_steps(job)[1:]:  # a rollback to its first step
    step_dir(job, step).rename(tmp_path / f"moved_{step}")
  first = complete_steps(job)[0]
  back = [FAULT_EXP, *quick, f"--restore_checkpoint_step={first}", "--set",
          "NUM_TRAIN_STEPS=16"]
  stopped, out = _stopped_then_rerun(back, tmp_path, job, first + 1)
  assert stopped > first
  assert (f"--restore_checkpoint_step={first} is not used: the job continues from its own "
          f"step {stopped}, written since this command rolled it back") in out
  assert f"trained steps {stopped}..16:" in out
  record = json.loads((job / "run_env.json").read_text())["restore"]
  assert record["restore_checkpoint_step"] == first and record["restore_checkpoint_dir"] is None


def test_a_rollback_continues_only_over_the_steps_it_wrote(tmp_path):
  """A rerun of a rollback continues from the newest step only when every later step was
  written since the rollback began; one from before it (moved back), or another rollback,
  is refused as any rollback below later checkpoints."""
  job = tmp_path / "job"
  for step in (10, 11, 12, 14):
    step_dir(job, step).mkdir(parents=True)
    (step_dir(job, step) / "_CHECKPOINT_METADATA").write_text("{}")
  since = time.time() - 60
  # Written before the rollback: its files say so, though the folder's own time is now (as a
  # FUSE mount of a bucket may report a folder: the time it was looked up).
  os.utime(step_dir(job, 14) / "_CHECKPOINT_METADATA", (since - 60, since - 60))
  (job / "run_env.json").write_text(json.dumps({"restore": {
      "restore_checkpoint_dir": None, "restore_checkpoint_step": 10, "since": since}}))
  with pytest.raises(UserError, match=r"--restore_checkpoint_step=10 trains on from there, "
                                      r"but \S+ already has step 14 after it"):
    resume.train_restore(str(job), None, 10)
  shutil.rmtree(step_dir(job, 14))
  with pytest.raises(UserError, match=r"already has step 12 after it"):  # another rollback
    resume.train_restore(str(job), None, 11)
  for own in (None, str(job / "checkpoints"), str(job)):  # the job's own folder: the same
    again = resume.train_restore(str(job), own, 10)
    assert again.step is None and again.record["since"] == since, again
    assert "the job continues from its own step 12" in again.note


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_agree_on_the_step_to_save(tmp_path):
  """SIGTERM to process 1 only: both processes stop after the same step and save it once."""
  job = tmp_path / "job"
  port = _free_port()
  procs, tails = [], []
  for pid in (0, 1):
    procs.append(launch([FAULT_EXP, f"--job_log_dir={job}", *LONG,
                         "--set", "DCN_MESH_SHAPE=[2,1,1]", "--set", "PERCORE_BATCH_SIZE=4",
                         f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                         f"--process_id={pid}", "--distributed_timeout_s=120"], tmp_path))
    tails.append(_Tail(procs[-1]))
  for tail in tails:
    tail.wait_for(r"paxlike \[process \d/2\] step 20 ")
  procs[1].send_signal(signal.SIGTERM)
  stopped = []
  for proc, tail in zip(procs, tails, strict=True):
    out = proc.stdout.read()
    proc.wait(timeout=180)
    proc.stdout, proc.stderr = out, tail.text()
    assert proc.returncode == preemption.EXIT_PREEMPTED, describe(proc)
    stopped.append(int(STOPPED_RE.search(proc.stderr).group(2)))
  assert stopped[0] == stopped[1] > 20, stopped
  assert complete_steps(job) == [stopped[0]] and partial_dirs(job) == []
  assert read_checkpoint(job, stopped[0])["input/step"] == stopped[0]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_watcher_turns_a_signal_into_a_stop_request(sig):
  before = signal.getsignal(sig)
  with preemption.StopWatcher() as watcher:
    assert not watcher.reached(1)
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # the handler runs between bytecodes of the main thread
    assert watcher.reached(2) and watcher.signal_name == signal.Signals(sig).name
    if sig == signal.SIGINT:  # Ctrl-C twice stops at once
      with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), sig)
        time.sleep(0.05)
  assert signal.getsignal(sig) == before
