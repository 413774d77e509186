"""--mode=eval / --mode=decode beside a running trainer follow its checkpoints (Pax's evaler).

The CLI test pauses a real trainer (SIGSTOP, from the fault hook) right after its first
checkpoint, starts an eval run beside it, and lets the trainer go on only once the eval
has scored that checkpoint: the eval run must then wait for, and score, the trainer's
last step, and end by itself.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

from fault_tools import FAULT_EXP, FAULT_STEPS, command, describe, env, launch, run

from paxlike import follow, job_lock

EVAL_LINE = re.compile(r"^eval test at step (\d+): loss [\d.]+", re.M)


def _fake_poll(script):
  """poll() answering from script: [(newest step or None, trainer alive), ...]."""
  answers = iter(script)
  return lambda: next(answers)


def test_steps_follow_the_trainer_to_its_last_step_and_skip_to_the_newest():
  waits = []
  poll = _fake_poll([(None, True), (4, True), (4, True), (12, True), (16, True)])
  assert list(follow.steps(poll, 16, sleep=waits.append)) == [4, 12, 16]
  assert len(waits) == 2  # once before step 4 was there, once after it was scored


def test_steps_stop_when_the_trainer_is_gone():
  poll = _fake_poll([(4, True), (8, True), (8, False)])
  assert list(follow.steps(poll, 16, sleep=lambda s: None)) == [4, 8]
  # A trainer that ended before the first look: its newest step, once.
  assert list(follow.steps(_fake_poll([(8, False)]), 16, sleep=lambda s: None)) == [8]


def test_steps_wait_for_the_rerun_of_a_preempted_or_killed_trainer():
  # On a cluster the evaler and the preempted trainer restart together, the evaler often
  # first: it scores step 8, finds no trainer yet, and waits for the rerun's steps.
  poll = _fake_poll([(8, False), (8, False), (8, True), (12, True), (16, True)])
  poll.restart_pending = lambda: 600.0
  assert list(follow.steps(poll, 16, sleep=lambda s: None)) == [8, 12, 16]
  # For at most restart_wait_s: then it stops as before.
  waits = []
  poll = _fake_poll([(8, False)] * 10)
  poll.restart_pending = lambda: 600.0
  assert list(follow.steps(poll, 16, sleep=waits.append, restart_wait_s=6)) == [8]
  assert waits == [2.0] * 3
  # And only for what is left of the wait after the stop: a stop long ago is not waited for.
  for left, expected in ((4.0, [2.0] * 2), (0.0, [])):
    waits = []
    poll = _fake_poll([(8, False)] * 10)
    poll.restart_pending = lambda left=left: left
    assert list(follow.steps(poll, 16, sleep=waits.append)) == [8]
    assert waits == expected


def test_a_rerun_is_waited_for_after_a_recent_preemption_only(tmp_path):
  # Preempted (SIGTERM) 30 s ago: most of the wait is left. A day ago, or stopped by Ctrl-C
  # (SIGINT: a user, not a scheduler), or finished: none, so an eval of an old job ends.
  poll = follow.folder_poll(str(tmp_path / "checkpoints"))
  for stopped, left in (({"signal": "SIGTERM", "time": time.time() - 30}, (560, 571)),
                        ({"signal": "SIGTERM", "time": time.time() - 86400}, (0, 0)),
                        ({"signal": "SIGINT", "time": time.time() - 30}, (0, 0)),
                        # A multi-host run's chief may only know a signal reached a peer.
                        ({"signal": "a signal on another process", "time": time.time() - 30},
                         (560, 571)),
                        (None, (0, 0))):
    (tmp_path / "run_env.json").write_text(json.dumps({"stopped": stopped} if stopped else {}))
    assert left[0] <= poll.restart_pending() <= left[1], stopped
  # A killed trainer's lock: from its last heartbeat.
  lock = tmp_path / job_lock.LOCK_NAME
  lock.write_text(json.dumps({"pid": 999999999, "host": job_lock.JobLock(str(tmp_path)).host}))
  assert 590 <= poll.restart_pending() <= 600
  os.utime(lock, (time.time() - 86400,) * 2)
  assert poll.restart_pending() == 0


def test_live_holder_sees_a_running_trainer_and_not_a_dead_one(tmp_path):
  assert job_lock.live_holder(str(tmp_path)) is None
  with job_lock.JobLock(str(tmp_path), heartbeat_s=0):
    assert job_lock.live_holder(str(tmp_path))["pid"] == os.getpid()
  assert job_lock.live_holder(str(tmp_path)) is None
  (tmp_path / job_lock.LOCK_NAME).write_text(json.dumps(
      {"pid": 999999999, "host": job_lock.JobLock(str(tmp_path)).host}))
  assert job_lock.live_holder(str(tmp_path)) is None  # a killed run's leftover lock
  assert job_lock.left_behind(str(tmp_path))  # which an evaler reads as "a rerun will come"
  (tmp_path / job_lock.LOCK_NAME).unlink()
  assert not job_lock.left_behind(str(tmp_path))


def _state(pid: int) -> str:
  with open(f"/proc/{pid}/stat") as f:
    return f.read().rsplit(")", 1)[1].split()[0]


def _wait_for(predicate, what: str, timeout: float = 240) -> None:
  end = time.monotonic() + timeout
  while not predicate():
    assert time.monotonic() < end, f"timed out waiting for {what}"
    time.sleep(0.2)


def test_eval_beside_a_trainer_scores_each_new_checkpoint_until_the_last(tmp_path):
  # The trainer pauses itself as step 5 starts: checkpoint 4 is committed (saves are
  # synchronous here), it still holds the job, and it goes on only when told.
  # --eval_on_test as a Pax user writes it: the trainer evals at its end (the eval run's
  # lines are told apart: `eval test at`, not the trainer's `eval_test_test at`).
  trainer = launch([FAULT_EXP, "--job_log_dir=job", "--nojax_fully_async_checkpoint",
                    "--set", "EVAL_INTERVAL_STEPS=0", "--eval_on_test"], tmp_path,
                   PAXLIKE_TEST_FAULT="stop:step:5")
  evaler = None
  try:
    _wait_for(lambda: trainer.poll() is not None or _state(trainer.pid) == "T",
              "the trainer to pause after its first checkpoint")
    assert trainer.poll() is None, describe(trainer)
    # Once: a run given a step reads it and ends, trainer or not.
    once = run([FAULT_EXP, "--job_log_dir=job", "--mode=eval", "--restore_checkpoint_step=4"],
               tmp_path)
    assert once.returncode == 0 and EVAL_LINE.findall(once.stdout) == ["4"], describe(once)
    log = tmp_path / "evaler.out"
    with open(log, "w") as out:
      evaler = subprocess.Popen(command([FAULT_EXP, "--job_log_dir=job", "--mode=eval"]),
                                cwd=tmp_path, env=env(), stdout=out, stderr=subprocess.PIPE,
                                text=True)
    _wait_for(lambda: EVAL_LINE.search(log.read_text()) or evaler.poll() is not None,
              "the eval run to score checkpoint 4")
    assert evaler.poll() is None, "the eval run ended while the trainer still held the job"
    assert EVAL_LINE.findall(log.read_text()) == ["4"]
    os.kill(trainer.pid, signal.SIGCONT)
    t_out, t_err = trainer.communicate(timeout=300)
    assert trainer.returncode == 0, f"trainer: exit {trainer.returncode}\n{t_err[-3000:]}"
    assert f"eval_test_test at step {FAULT_STEPS}" in t_out
    _, e_err = evaler.communicate(timeout=120)
  finally:
    for proc in (trainer, evaler):
      if proc is not None and proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.communicate()
  steps = [int(s) for s in EVAL_LINE.findall(log.read_text())]
  assert evaler.returncode == 0, f"evaler: exit {evaler.returncode}\n{e_err[-3000:]}"
  assert steps[0] == 4 and steps[-1] == FAULT_STEPS, steps
  assert steps == sorted(set(steps)), steps
  assert "waiting for the trainer's next checkpoint" in e_err



def test_pax_train_flags_noeval_on_test_and_checkpoint_todelete_subdir(tmp_path):
  args = [FAULT_EXP, "--job_log_dir=job", "--set", "NUM_TRAIN_STEPS=8", "--set",
          "CHECKPOINT_MAX_TO_KEEP=1"]
  proc = run([*args, "--noeval_on_test", "--checkpoint_todelete_subdir=old"], tmp_path)
  assert proc.returncode == 0, describe(proc)
  assert "trained steps 0..8" in proc.stdout
  assert "eval_test_test at step" not in proc.stdout  # FaultTiny evals every 4 steps otherwise
  assert not (tmp_path / "job" / "summaries" / "eval_test_test").exists()
  # The step past CHECKPOINT_MAX_TO_KEEP was moved aside whole, not deleted.
  ckpts = tmp_path / "job" / "checkpoints"
  assert sorted(p.name for p in ckpts.glob("checkpoint_*")) == ["checkpoint_00000008"]
  assert (ckpts / "old" / "checkpoint_00000004" / "state").is_dir()
