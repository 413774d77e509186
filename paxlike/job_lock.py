"""One job per job_log_dir: a lock file that names its holder.

`job_log_dir/job.lock` holds JSON {pid, host, start_ticks, started}. A run
creates it with O_EXCL before it writes anything else and removes it when it
ends (however it ends, short of kill -9). A second run finds it and refuses,
naming the holder, unless the holder is gone:

- same host: the pid is not running (or is a zombie, or is a different
  process that reuses the pid: its start time differs) -> stale;
- another host: the holder touches the file every HEARTBEAT_S seconds, so
  a file untouched for STALE_AFTER_S is stale (a preempted job restarted
  on a new machine must not wait for a lock it can never get back).

A stale lock is taken over by renaming it aside (only one of two racing
runs can rename it) and creating a fresh one. In a multi-process job only
process 0 holds the lock; the other processes learn its verdict through a
collective (see main.py), so all of them stop together.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import os
import socket
import threading
import time
from typing import Any

from paxlike import log as logging
from paxlike.errors import UserError

LOCK_NAME = "job.lock"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 300.0


def _start_ticks(pid: int) -> int | None:
  """The process start time in clock ticks since boot (Linux), None where unknown."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[19])  # field 22 of stat; fields[0] is field 3 (state)
  except (OSError, IndexError, ValueError):
    return None


def _is_zombie(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] == "Z"
  except (OSError, IndexError):
    return False


def pid_running(pid: int, start_ticks: int | None = None) -> bool:
  """Whether pid names a live process on this host (the same one, when start_ticks is given)."""
  if pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # exists, owned by someone else
  if _is_zombie(pid):
    return False
  if start_ticks is not None:
    current = _start_ticks(pid)
    if current is not None and current != start_ticks:
      return False  # the pid was reused by a later process
  return True


def describe_holder(info: dict[str, Any]) -> str:
  started = f", started {info['started']}" if info.get("started") else ""
  return f"pid {info.get('pid', '?')} on host {info.get('host', '?')}{started}"


class JobLock:
  """The lock on one job_log_dir; use as a context manager or acquire()/release().

  Args:
    job_log_dir: the directory to lock (must exist).
    heartbeat_s: how often the holder touches the lock file.
    stale_after_s: how long a lock from another host may go untouched before
      it counts as stale.
  """

  def __init__(self, job_log_dir: str, heartbeat_s: float = HEARTBEAT_S,
               stale_after_s: float = STALE_AFTER_S) -> None:
    self.path = os.path.join(job_log_dir, LOCK_NAME)
    self.heartbeat_s = heartbeat_s
    self.stale_after_s = stale_after_s
    self.host = socket.gethostname()
    self.pid = os.getpid()
    self.held = False
    self.took_over: dict[str, Any] | None = None
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def _content(self) -> bytes:
    info = {"pid": self.pid, "host": self.host, "start_ticks": _start_ticks(self.pid),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    return (json.dumps(info) + "\n").encode()

  def _read(self) -> tuple[dict[str, Any] | None, float | None]:
    """(holder info or None when unreadable, file mtime or None when absent)."""
    try:
      mtime = os.stat(self.path).st_mtime
      with open(self.path, "rb") as f:
        raw = f.read()
    except FileNotFoundError:
      return None, None
    try:
      info = json.loads(raw)
      return (info if isinstance(info, dict) else None), mtime
    except ValueError:
      return None, mtime

  def _is_stale(self, info: dict[str, Any] | None, mtime: float) -> bool:
    age = time.time() - mtime
    if info is None:
      # Empty or torn: a writer died between create and write, or is writing right now.
      return age > 5.0
    if info.get("host") == self.host:
      if info.get("pid") == self.pid:
        return True  # an earlier run in this same process (main.run called twice)
      return not pid_running(int(info.get("pid", -1)), info.get("start_ticks"))
    return age > self.stale_after_s

  def acquire(self) -> None:
    """Takes the lock, or raises UserError naming the run that holds it.

    Raises:
      UserError: a live run holds the lock, or the directory cannot be written.
    """
    for _ in range(5):
      try:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
      except FileExistsError:
        info, mtime = self._read()
        if mtime is None:
          continue  # released between our create and our read: try again
        if not self._is_stale(info, mtime):
          holder = describe_holder(info) if info else "a run that is still starting"
          raise UserError(
              f"--job_log_dir {os.path.dirname(self.path)} is in use by {holder} "
              f"(lock file {self.path}); wait for that run to end or stop it, or pick "
              "another --job_log_dir.") from None
        aside = f"{self.path}.stale.{self.pid}"
        try:
          os.rename(self.path, aside)  # of two racing runs only one renames it
        except FileNotFoundError:
          continue
        with contextlib.suppress(OSError):
          os.remove(aside)
        self.took_over = info or {}
        if self.took_over.get("pid") != self.pid:
          logging.warning("took over the stale lock of %s (not running any more)",
                          describe_holder(self.took_over))
        continue
      except OSError as e:
        raise UserError(f"cannot create the lock file {self.path} ({e.strerror}); "
                        "pick a --job_log_dir you can write to.") from None
      try:
        os.write(fd, self._content())
        os.fsync(fd)
      except OSError as e:
        os.close(fd)
        with contextlib.suppress(OSError):
          os.remove(self.path)
        raise UserError(f"cannot write the lock file {self.path} ({e.strerror}); "
                        "pick a --job_log_dir with free space you can write to.") from None
      os.close(fd)
      self.held = True
      self._start_heartbeat()
      return
    raise UserError(f"could not take the lock {self.path}: other runs keep taking it; "
                    "make sure only one job uses this --job_log_dir.")

  def _start_heartbeat(self) -> None:
    if self.heartbeat_s <= 0:
      return
    self._stop.clear()
    self._thread = threading.Thread(target=self._beat, daemon=True, name="job-lock-heartbeat")
    self._thread.start()

  def _beat(self) -> None:
    while not self._stop.wait(self.heartbeat_s):
      with contextlib.suppress(OSError):
        os.utime(self.path)

  def release(self) -> None:
    """Removes the lock file if this process still holds it."""
    if not self.held:
      return
    self.held = False
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=5)
    info, _ = self._read()
    if info and info.get("pid") == self.pid and info.get("host") == self.host:
      with contextlib.suppress(OSError):
        os.remove(self.path)

  def __enter__(self) -> JobLock:
    self.acquire()
    return self

  def __exit__(self, *exc: object) -> None:
    self.release()


def _probe(job_log_dir: str) -> tuple[dict[str, Any] | None, bool | None]:
  """(the lock's holder info, whether the lock is stale), (None, None) when there is no
  lock file. Reads only."""
  probe = JobLock(job_log_dir, heartbeat_s=0)
  probe.pid = -1  # a probe is no holder: a lock naming this process is not stale for it
  info, mtime = probe._read()
  if mtime is None:
    return None, None
  return info, probe._is_stale(info, mtime)


def live_holder(job_log_dir: str) -> dict[str, Any] | None:
  """The run that holds job_log_dir's lock now ({pid, host, ...}), or None when no live run
  does (no lock file, or a stale one). Reads only: an eval or decode job asks this to know
  whether a trainer may still write checkpoints."""
  info, stale = _probe(job_log_dir)
  return None if stale is None or stale else (info or {})


def left_behind(job_log_dir: str) -> bool:
  """Whether job_log_dir has a lock whose holder is gone: a trainer that was killed (kill
  -9, out of memory, a lost machine) before it could let go. Reads only."""
  return bool(_probe(job_log_dir)[1])


def left_behind_since(job_log_dir: str) -> float | None:
  """When the holder of a lock left behind (left_behind) last touched it (its last
  heartbeat: about when it was killed), as time.time(); None without such a lock."""
  if not left_behind(job_log_dir):
    return None
  try:
    return os.path.getmtime(os.path.join(job_log_dir, LOCK_NAME))
  except OSError:
    return None


def hold(job_log_dir: str) -> JobLock | None:
  """Takes job_log_dir's lock for this job until the process exits; all processes agree.

  Only process 0 holds the lock (it writes the dumps and summaries; all
  processes write checkpoint shards but only as one job). In a multi-process
  job its verdict is broadcast, so every process stops when the directory
  is in use.

  Raises:
    UserError: another live run holds the lock.
  """
  import jax

  lock, error = None, None
  if jax.process_index() == 0:
    try:
      lock = JobLock(job_log_dir)
      lock.acquire()
      atexit.register(lock.release)
    except UserError as e:
      error = e
  if jax.process_count() > 1:
    import numpy as np
    from jax.experimental import multihost_utils

    ok = int(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
    if not ok and error is None:
      raise UserError(f"process 0 could not lock --job_log_dir {job_log_dir}: another run "
                      "uses it (process 0's error names it); pick another --job_log_dir.")
  if error is not None:
    raise error
  return lock
