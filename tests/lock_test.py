"""One job per job_log_dir: the lock refuses a second run and takes over stale ones.

The CLI side (a second run while one trains) is in preemption_test.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from paxlike import job_lock
from paxlike.errors import UserError


def _write_lock(job, **info):
  (job / job_lock.LOCK_NAME).write_text(json.dumps(info))


def test_second_lock_refuses_and_names_the_holder(tmp_path):
  holder = subprocess.Popen(
      [sys.executable, "-c", "import sys, time; from paxlike import job_lock; "
       f"job_lock.JobLock({str(tmp_path)!r}).acquire(); print('held', flush=True); "
       "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    info = json.loads((tmp_path / job_lock.LOCK_NAME).read_text())
    assert info["pid"] == holder.pid and info["host"] == socket.gethostname()
    with pytest.raises(UserError, match=rf"in use by pid {holder.pid} on host "
                                        rf"{socket.gethostname()}.*another --job_log_dir"):
      job_lock.JobLock(str(tmp_path)).acquire()
  finally:
    holder.kill()
    holder.wait()
  # kill -9 left the lock behind: the next run takes it over, and releases it at the end.
  with job_lock.JobLock(str(tmp_path)) as lock:
    assert lock.took_over["pid"] == holder.pid
  assert not (tmp_path / job_lock.LOCK_NAME).exists()


def _dead_pid() -> int:
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  return proc.pid


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
  dead = _dead_pid()
  _write_lock(tmp_path, pid=dead, host=socket.gethostname(), started="earlier")
  lock = job_lock.JobLock(str(tmp_path))
  lock.acquire()
  assert lock.took_over["pid"] == dead
  assert json.loads((tmp_path / job_lock.LOCK_NAME).read_text())["pid"] == os.getpid()
  assert [p.name for p in tmp_path.iterdir()] == [job_lock.LOCK_NAME]  # nothing left aside
  lock.release()


def test_zombie_and_reused_pids_count_as_dead(tmp_path):
  zombie = subprocess.Popen([sys.executable, "-c", "pass"])
  deadline = time.monotonic() + 30
  while not job_lock._is_zombie(zombie.pid) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not job_lock.pid_running(zombie.pid)  # exited, not yet reaped
  zombie.wait()
  # Our own pid, but a different start time: the pid was reused by a later process.
  assert job_lock.pid_running(os.getpid())
  assert not job_lock.pid_running(os.getpid(), start_ticks=-1)


def test_lock_from_another_host_is_stale_only_without_heartbeat(tmp_path):
  _write_lock(tmp_path, pid=1, host="elsewhere")
  with pytest.raises(UserError, match="pid 1 on host elsewhere"):
    job_lock.JobLock(str(tmp_path), stale_after_s=60).acquire()
  old = time.time() - 120
  os.utime(tmp_path / job_lock.LOCK_NAME, (old, old))
  lock = job_lock.JobLock(str(tmp_path), stale_after_s=60)
  lock.acquire()
  assert lock.took_over["host"] == "elsewhere"
  lock.release()


def test_holder_heartbeat_keeps_the_lock_fresh(tmp_path):
  with job_lock.JobLock(str(tmp_path), heartbeat_s=0.05):
    path = tmp_path / job_lock.LOCK_NAME
    old = time.time() - 1000
    os.utime(path, (old, old))
    time.sleep(0.5)
    assert time.time() - path.stat().st_mtime < 100


def test_release_leaves_another_runs_lock_alone(tmp_path):
  lock = job_lock.JobLock(str(tmp_path))
  lock.acquire()
  _write_lock(tmp_path, pid=os.getpid() + 1, host="other")  # someone replaced it
  lock.release()
  assert (tmp_path / job_lock.LOCK_NAME).exists()


def test_a_second_run_in_the_same_process_reuses_the_lock(tmp_path):
  first = job_lock.JobLock(str(tmp_path))
  first.acquire()  # e.g. main.run() returned without releasing (released at exit)
  second = job_lock.JobLock(str(tmp_path))
  second.acquire()
  assert second.held and second.took_over["pid"] == os.getpid()
  second.release()
