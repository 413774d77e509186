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
in --mode=decode_once, reads one checkpoint and ends, as it always did.

In a multi-process run process 0 looks at the folder and the lock, and
every process follows its answer (one broadcast per look).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

from paxlike import log

POLL_S = 2.0  # seconds between looks at the checkpoints folder while the trainer runs


def steps(poll: Callable[[], tuple[int | None, bool]], final_step: int, *,
          poll_s: float = POLL_S, sleep: Callable[[float], None] = time.sleep
          ) -> Iterator[int]:
  """The steps to evaluate, newest first seen, until final_step or the trainer is gone.

  Args:
    poll: () -> (the newest committed step or None, whether a trainer holds the
      job). It must read the lock before it lists the folder: a trainer commits
      its last checkpoint before it lets go of the lock, so a poll that finds
      no trainer lists every step the trainer will ever write.
    final_step: the experiment's last training step; once it is yielded, done.
    poll_s: seconds to wait between polls that find nothing new.
    sleep: time.sleep (tests pass a fake clock).
  """
  done: int | None = None
  waited = False
  while True:
    newest, trainer = poll()
    if newest is not None and (done is None or newest > done):
      if waited:
        log.info("checkpoint %d committed; evaluating it", newest)
      yield newest
      done, waited = newest, False
      if newest >= final_step:
        return
      if trainer:
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
  found: list[ckpt_lib.Checkpointer] = []  # made once the trainer has made the folder

  def look() -> tuple[int | None, bool]:
    trainer = job_lock.live_holder(job_log_dir) is not None  # the lock first: see steps()
    if not found and os.path.isdir(directory):
      found.append(ckpt_lib.Checkpointer(directory, read_only=True))
    if not found:
      return None, trainer
    found[0].reload()
    return found[0].latest_step(), trainer

  def poll() -> tuple[int | None, bool]:
    if jax.process_count() == 1:
      return look()
    from jax.experimental import multihost_utils

    newest, trainer = look() if jax.process_index() == 0 else (None, False)
    got = multihost_utils.broadcast_one_to_all(
        np.array([-1 if newest is None else newest, int(trainer)], np.int32))
    return (None if got[0] < 0 else int(got[0])), bool(got[1])

  return poll
