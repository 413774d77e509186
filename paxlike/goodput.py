"""Goodput: where a run's wall time went, and how much of it trained the model.

The wall time from the process start to the end of training is split into
buckets that add up to it exactly:

  startup       process start -> the training loop (imports, backend, init)
  compilation   the first step's call, less one steady-state step
  productive    steps that moved the model past where any earlier run got
  restart_redo  steps re-done because the job restarted after the step it
                had reached was checkpointed (lost to the restart)
  input_wait    the host blocked waiting for the next batch
  checkpoint    restoring, and the host blocked saving (async saves block
                only for their device-to-host copy) and waiting at the end
  eval          evaluation during training
  other         the rest: summaries, logging, teardown

goodput = productive / wall. No cloud service: the furthest step any run of
this job_log_dir reached is kept in job_log_dir/progress.json, so a
restarted run knows which of its steps are re-done.

Host-side timing under asynchronous dispatch: the host runs ahead of the
device, so a step's time lands where the host next waits for the device
(metrics at summaries, a checkpoint's copy). Buckets are exact for the host;
device idle time hides in input_wait only when the host could not keep up.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

from paxlike import files

BUCKETS = ("startup", "compilation", "productive", "restart_redo", "input_wait",
           "checkpoint", "eval", "other")
PROGRESS_FILE = "progress.json"
_IMPORT_TIME = time.time()


def process_start_time() -> float:
  """When this process started (Linux /proc), else when this module was imported."""
  try:
    with open("/proc/self/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
    start_ticks = int(fields[19])  # field 22 of stat: starttime, in clock ticks since boot
    with open("/proc/stat") as f:
      btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    started = btime + start_ticks / os.sysconf("SC_CLK_TCK")
    # btime has 1 s resolution: never report a start after the import.
    return min(started, _IMPORT_TIME)
  except (OSError, ValueError, IndexError, StopIteration):
    return _IMPORT_TIME


def read_progress(job_log_dir: str) -> dict[str, Any]:
  try:
    with open(os.path.join(job_log_dir, PROGRESS_FILE)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def write_progress(job_log_dir: str, furthest_step: int, step_seconds: float | None) -> None:
  """Atomically records the furthest step this job has reached."""
  files.write_atomic(os.path.join(job_log_dir, PROGRESS_FILE), json.dumps(
      {"furthest_step": int(furthest_step), "step_seconds": step_seconds,
       "updated": time.time()}))


class Recorder:
  """Collects spans and step counts during a run; `report()` splits the wall time.

  Args:
    start: wall-clock start of the run (default: now); main passes the
      process start so imports and backend start-up count.
    clock: time source (tests pass a fake one).
  """

  def __init__(self, start: float | None = None, clock=time.time) -> None:
    self.clock = clock
    self.start = clock() if start is None else start
    self.spans = dict.fromkeys(BUCKETS, 0.0)
    self.loop_start: float | None = None
    self.loop_end: float | None = None
    self.end: float | None = None
    self._pre_loop_spans = 0.0  # spans timed before the loop started (restore)
    self._loop_spans = 0.0  # spans timed between loop start and loop end
    self.first_step_seconds = 0.0
    self.steps = 0  # steps run in this process, the first (compiling) one included
    self.redo_steps = 0
    self.restored_step = 0
    self.previous_furthest = 0
    self._progress_dir: str | None = None
    self._progress_written = float("-inf")

  # ------------------------------------------------------------- recording

  @contextlib.contextmanager
  def span(self, bucket: str) -> Iterator[None]:
    """Times a block into a bucket (input_wait, checkpoint, eval, other)."""
    if bucket not in self.spans:
      raise ValueError(f"unknown goodput bucket {bucket!r}; one of {BUCKETS}")
    t = self.clock()
    try:
      yield
    finally:
      seconds = self.clock() - t
      self.spans[bucket] += seconds
      if self.loop_start is None:
        self._pre_loop_spans += seconds
      elif self.loop_end is None:
        self._loop_spans += seconds

  def restored(self, job_log_dir: str | None, step: int, seconds: float = 0.0) -> None:
    """The run starts at `step` (restored in `seconds` when > 0, else initialised).

    Steps up to the furthest one an earlier run reached are re-done; the
    chief passes job_log_dir, where progress.json keeps that step.
    """
    self.restored_step = step
    if step > 0:
      self.spans["checkpoint"] += seconds
      self._pre_loop_spans += seconds
    if job_log_dir:
      self._progress_dir = job_log_dir
      self.previous_furthest = int(read_progress(job_log_dir).get("furthest_step", 0))

  def loop_started(self) -> None:
    self.loop_start = self.clock()

  def first_step(self, seconds: float) -> float:
    """The first call of the step: compilation plus one step, given as the time since the
    loop started; returns it less the spans timed meanwhile (the first batches' input
    wait, a memory preflight), which their own buckets hold."""
    self.first_step_seconds = max(seconds - self._loop_spans, 0.0)
    return self.first_step_seconds

  def step_done(self, step: int, force_progress: bool = False) -> None:
    """Global step `step` (counting from 1) was dispatched."""
    self.steps += 1
    if step <= self.previous_furthest:
      self.redo_steps += 1
    elif self._progress_dir:
      now = self.clock()
      # progress.json at most once a second, and whenever asked (summaries, checkpoints).
      if force_progress or now - self._progress_written >= 1.0:
        write_progress(self._progress_dir, step, self.step_seconds())
        self._progress_written = now

  def loop_ended(self, final_step: int | None = None) -> None:
    self.loop_end = self.clock()
    if self._progress_dir and final_step is not None and final_step > self.previous_furthest:
      write_progress(self._progress_dir, final_step, self.step_seconds())

  def finish(self) -> None:
    self.end = self.clock()

  # --------------------------------------------------------------- reading

  def _stepping_seconds(self, now: float) -> float:
    """Loop time outside spans and the first call: time spent running steps."""
    if self.loop_start is None:
      return 0.0
    end = self.loop_end if self.loop_end is not None else now
    return max(0.0, end - self.loop_start - self._loop_spans - self.first_step_seconds)

  def step_seconds(self) -> float | None:
    """Mean steady-state seconds per step so far (None before the second step)."""
    steady = self.steps - 1
    if steady <= 0:
      return None
    return self._stepping_seconds(self.clock()) / steady

  def report(self) -> dict[str, Any]:
    """Seconds per bucket (they sum to wall_seconds), goodput and step counts."""
    now = self.end if self.end is not None else self.clock()
    wall = max(now - self.start, 0.0)
    out = dict.fromkeys(BUCKETS, 0.0)
    for b in ("input_wait", "checkpoint", "eval"):
      out[b] = self.spans[b]
    if self.loop_start is not None:
      out["startup"] = max(self.loop_start - self.start - self._pre_loop_spans, 0.0)
      steady_total = self._stepping_seconds(now)
      steady = self.steps - 1
      per_step = steady_total / steady if steady > 0 else 0.0
      # The first call also ran one step: count that as a step, the rest as compilation.
      first_exec = min(per_step, self.first_step_seconds)
      out["compilation"] = self.first_step_seconds - first_exec
      stepping = steady_total + first_exec
      if self.steps:
        out["restart_redo"] = stepping * self.redo_steps / self.steps
        # redo_steps <= steps: a negative difference is float residue (every step re-done
        # gives -4e-16, which the log would show as 'goodput -0.0%'), so it is 0.
        out["productive"] = max(stepping - out["restart_redo"], 0.0)
    else:
      out["startup"] = max(wall - sum(out.values()), 0.0)
    out["other"] = max(wall - sum(out.values()), 0.0)
    return {
        "wall_seconds": wall,
        "seconds": out,
        "fractions": {b: (v / wall if wall > 0 else 0.0) for b, v in out.items()},
        "goodput": out["productive"] / wall if wall > 0 else 0.0,
        "steps_run": self.steps,
        "restored_step": self.restored_step,
        "previous_furthest_step": self.previous_furthest,
        "steps_lost_to_restart": self.redo_steps,
    }

  def summary_line(self) -> str:
    r = self.report()
    parts = ", ".join(f"{b} {r['seconds'][b]:.1f}s" for b in BUCKETS if r["seconds"][b] > 0)
    return (f"goodput {100 * r['goodput']:.1f}% of {r['wall_seconds']:.1f}s wall ({parts}); "
            f"{r['steps_lost_to_restart']} steps re-done after a restart")

  def scalars(self) -> dict[str, float]:
    """goodput and per-bucket seconds, for the train summaries."""
    r = self.report()
    out = {"goodput": r["goodput"]}
    out.update({f"goodput/{b}_seconds": v for b, v in r["seconds"].items()})
    return out

  def write(self, job_log_dir: str) -> dict[str, Any]:
    """goodput.json in job_log_dir; returns the report."""
    r = self.report()
    with open(os.path.join(job_log_dir, "goodput.json"), "w") as f:
      json.dump(r, f, indent=2, sort_keys=True)
      f.write("\n")
    return r
