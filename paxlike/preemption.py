"""Graceful preemption: SIGTERM / SIGINT -> finish the step, checkpoint it, exit 42.

A scheduler that preempts a job sends SIGTERM and, after a grace period,
SIGKILL. The trainer asks `StopWatcher.reached(step)` after every step; once
it says yes, the trainer saves a checkpoint of that step, waits for the
write, and main.py exits with EXIT_PREEMPTED, so a supervisor can tell "stopped
cleanly, rerun the same command to continue" from success (0), a crash (1)
and bad input (2).

All processes of a job must save the same step. Single-process runs use a
Python signal handler and stop after the step in flight. Multi-process runs
use JAX's preemption sync point: jax.distributed starts a notifier that
catches SIGTERM on any process and tells the others through the coordination
service, and `reached_preemption_sync_point(step)` returns True on every
process at the same step (one past the largest step any process had reached).
It is a local check until a notice arrives, so there is no per-step
collective. SIGINT (Ctrl-C) is forwarded to the notifier as SIGTERM. Where
the preemption service is disabled, processes agree with an all-gather of
their local flag every `fallback_every` steps.

A second signal of the same kind ends the process at once (Ctrl-C twice).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from paxlike import log as logging

EXIT_PREEMPTED = 42
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _sync_manager() -> Any | None:
  """JAX's preemption sync manager when this is a multi-process job that has one."""
  try:
    from jax._src import distributed
  except ImportError:  # pragma: no cover
    return None
  state = distributed.global_state
  if state.client is None:
    return None
  return state.preemption_sync_manager


def _multi_process() -> bool:
  import jax

  return jax.process_count() > 1


class StopWatcher:
  """Tells the training loop when every process should stop and checkpoint.

  Use as a context manager around the loop: handlers are installed on entry
  (from the main thread only; elsewhere nothing is installed) and the
  previous ones restored on exit.

  Args:
    fallback_every: multi-process runs without JAX's preemption service
      agree on the flag with an all-gather every this many steps.
  """

  def __init__(self, fallback_every: int = 1) -> None:
    self.fallback_every = max(1, fallback_every)
    self.signal_name: str | None = None
    self.requested_at: float | None = None  # time.monotonic() of the first signal
    self._flag = threading.Event()
    self._previous: dict[int, Any] = {}
    self._manager = None
    self._multi = False

  @property
  def requested(self) -> bool:
    """Whether this process got a stop signal."""
    return self._flag.is_set()

  def request(self, name: str = "request") -> None:
    """Asks for a stop as a signal would (tests, or a caller with its own reasons)."""
    if not self._flag.is_set():
      self.signal_name = name
      self.requested_at = time.monotonic()
      self._flag.set()
      logging.warning("%s received: finishing the steps already dispatched to the devices "
                      "(the host runs ahead of the logged step), then saving a checkpoint "
                      "(send it again to stop at once)", name)

  def _handle(self, signum: int, frame: Any) -> None:
    del frame
    name = signal.Signals(signum).name
    if self._flag.is_set() and signum == signal.SIGINT:
      signal.signal(signum, signal.default_int_handler)
      raise KeyboardInterrupt
    if self._flag.is_set():
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
      return
    self.request(name)
    if self._manager is not None and signum != signal.SIGTERM:
      # JAX's notifier listens for SIGTERM only: hand it the request so all processes agree.
      os.kill(os.getpid(), signal.SIGTERM)

  def install(self) -> StopWatcher:
    """Installs the signal handlers (main thread only; elsewhere this only sets up)."""
    self._multi = _multi_process()
    self._manager = _sync_manager() if self._multi else None
    if threading.current_thread() is not threading.main_thread():
      return self
    for sig in SIGNALS:
      if sig == signal.SIGTERM and self._manager is not None:
        continue  # JAX's notifier owns SIGTERM; a Python handler would replace it
      self._previous[sig] = signal.getsignal(sig)
      signal.signal(sig, self._handle)
    return self

  def uninstall(self) -> None:
    """Puts the previous handlers back."""
    for sig, handler in self._previous.items():
      signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    self._previous.clear()

  def __enter__(self) -> StopWatcher:
    return self.install()

  def __exit__(self, *exc: object) -> None:
    self.uninstall()

  def reached(self, step: int) -> bool:
    """Whether all processes stop after `step`. Call once after every step, on every process."""
    if not self._multi:
      return self._flag.is_set()
    if self._manager is not None:
      from jax.experimental import multihost_utils

      if multihost_utils.reached_preemption_sync_point(step):
        if self.signal_name is None:
          self.signal_name = "SIGTERM"
          self.requested_at = time.monotonic()
        return True
      return False
    if step % self.fallback_every:
      return False
    import numpy as np
    from jax.experimental import multihost_utils

    flags = multihost_utils.process_allgather(np.int32(self._flag.is_set()))
    if int(np.max(flags)) and self.signal_name is None:
      self.signal_name = "a signal on another process"
      self.requested_at = time.monotonic()
    return bool(np.max(flags))
