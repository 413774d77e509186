"""Pax's evaler and decoder jobs: --mode=eval and --mode=decode beside a training run.

An eval or decode run started while a training run holds the job_log_dir
(its `job.lock`) does not stop at the newest checkpoint. It evaluates (or
decodes) that one, then waits for the next one the trainer commits, and
the next, until it has done the experiment's last step (NUM_TRAIN_STEPS),
or the trainer has ended (finished, preempted or failed) and left no newer
checkpoint. Like Pax's evaler it always takes the newest step: a trainer
that commits checkpoints faster than an eval reads them has the ones in
between skipped.

A run on a job that no trainer holds, or with --restore_checkpoint_step, or
in --mode=decode_once, reads one checkpoint and ends, as it always did. One
exception: when the job's last trainer stopped short of its last step in a
way a scheduler answers with a rerun (preempted: a signal other than SIGINT,
which recorded `stopped` in run_env.json; or killed: it left its lock behind), the run waits
for the rerun to take the job, until RESTART_WAIT_S after the stop, and goes
on following it. On a cluster, trainer and evaler restart together after a
preemption, and the evaler is often first. A stop longer ago than that (a job
preempted yesterday and never rerun), or a Ctrl-C (SIGINT), is not waited for.

In a multi-process run every process looks at the folder (orbax's reads
are collective) and all follow process 0's answer (one broadcast per look).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from paxlike import log

POLL_S = 2.0  # seconds between looks at the checkpoints folder while the trainer runs
RESTART_WAIT_S = 600.0  # how long after its stop a preempted or killed trainer's rerun may come


def steps(poll: Callable[[], tuple[int | None, bool]], final_step: int, *,
          poll_s: float = POLL_S, sleep: Callable[[float], None] = time.sleep,
          restart_wait_s: float = RESTART_WAIT_S) -> Iterator[int]:
  """The steps to evaluate, in order: each poll's newest step not done yet, until
  final_step is done or the trainer is gone.

  Args:
    poll: () -> (the newest committed step or None, whether a trainer holds the
      job). It must read the lock before it lists the folder: a trainer commits
      its last checkpoint before it lets go of the lock, so a poll that finds
      no trainer lists every step the trainer will ever write.
    final_step: the experiment's last training step; once it is yielded, done.
    poll_s: seconds to wait between polls that find nothing new.
    sleep: time.sleep (tests pass a fake clock).
    restart_wait_s: the longest wait for a trainer to take the job again when no
      trainer holds it but poll's `restart_pending()` (where it has one: the seconds
      left until RESTART_WAIT_S after the last trainer's stop, 0 for none) says the
      last one was preempted or killed short of final_step.
  """
  done: int | None = None
  waited, restart_left = False, None
  pending = getattr(poll, "restart_pending", lambda: 0.0)
  while True:
    newest, trainer = poll()
    if trainer:
      restart_left = None
    if newest is not None and (done is None or newest > done):
      if waited:
        log.info("checkpoint %d committed; evaluating it", newest)
      yield newest
      done, waited = newest, False
      if newest >= final_step:
        return
      if trainer:
        continue
    if not trainer and done is not None and done < final_step and restart_left is None:
      left = min(float(pending()), restart_wait_s)
      if left > 0:
        log.info("no trainer holds this job now, and its last one stopped at step %d, short "
                 "of step %d (preempted or killed); waiting up to %.0f s for its rerun to "
                 "take the job", done, final_step, left)
        restart_left = left
    if not trainer and restart_left is not None and restart_left > 0:
      sleep(poll_s)
      restart_left -= poll_s
      continue
    if not trainer:  # and so no newer step will come
      if done is not None and done < final_step:
        log.info("no trainer holds this job and step %d is its newest checkpoint (it trains "
                 "to step %d); stopping here", done, final_step)
      return
    if not waited:
      log.info("waiting for the trainer's next checkpoint (newest: %s; polling every %.0f s)",
               "none yet" if done is None else done, poll_s)
      waited = True
    sleep(poll_s)


def job_of(checkpoints_dir: str) -> str:
  """The job_log_dir whose trainer writes checkpoints_dir (its parent, for `checkpoints/`)."""
  checkpoints_dir = os.path.normpath(checkpoints_dir)
  if os.path.basename(checkpoints_dir) == "checkpoints":
    return os.path.dirname(checkpoints_dir)
  return checkpoints_dir


def folder_poll(directory: str) -> Callable[[], tuple[int | None, bool]]:
  """poll() for steps(): the lock of the job that writes directory (a checkpoints/ folder),
  then its committed steps; in a multi-process run, process 0's answer for all."""
  import jax
  import numpy as np

  from paxlike import checkpoints as ckpt_lib
  from paxlike import job_lock

  job_log_dir = job_of(directory)
  checkpointer: ckpt_lib.Checkpointer | None = None  # made once the trainer has made the folder

  def agreed(values: list[int]) -> list[int]:
    if jax.process_count() == 1:
      return values
    from jax.experimental import multihost_utils

    return [int(v) for v in multihost_utils.broadcast_one_to_all(np.array(values, np.int32))]

  def poll() -> tuple[int | None, bool]:
    nonlocal checkpointer
    trainer = job_lock.live_holder(job_log_dir) is not None  # the lock first: see steps()
    # Every process makes and reads the manager (orbax syncs them), so all must agree on
    # when the folder is there.
    if checkpointer is None and agreed([os.path.isdir(directory)])[0]:
      checkpointer = ckpt_lib.Checkpointer(directory, read_only=True)
    newest = None
    if checkpointer is not None:
      checkpointer.reload()
      newest = checkpointer.latest_step()
    step, alive = agreed([-1 if newest is None else newest, int(trainer)])
    return (None if step < 0 else step), bool(alive)

  def restart_pending() -> float:
    """The seconds a rerun may still come in: RESTART_WAIT_S after the job's last trainer
    stopped in a way a scheduler reruns, preempted (its run_env.json says `stopped` by a
    signal other than SIGINT) or killed (its lock left behind, as of its last heartbeat);
    0 for none."""
    stops = [job_lock.left_behind_since(job_log_dir)]
    stopped = last_run_stopped(job_log_dir)
    # Any stop but a Ctrl-C (a multi-host run's may read "a signal on another process").
    if stopped and stopped.get("signal") != "SIGINT":
      stops.append(stopped.get("time"))
    latest = max((t for t in stops if isinstance(t, int | float)), default=None)
    left = 0 if latest is None else int(max(latest + RESTART_WAIT_S - time.time(), 0))
    return float(agreed([left])[0])

  poll.restart_pending = restart_pending  # type: ignore[attr-defined]  # read by steps()
  return poll


def last_run_stopped(job_log_dir: str) -> dict[str, Any] | None:
  """What the job's last training run recorded when a signal stopped it ({signal, step}),
  or None (it is running, finished, failed, or the job has no record)."""
  from paxlike import xla_flags

  stopped = (xla_flags.training_run_env(job_log_dir) or {}).get("stopped")
  return stopped if isinstance(stopped, dict) else None
