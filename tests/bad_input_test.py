"""Every bad input: exit status 2, one `error:` line naming the problem, no traceback, and
the bytes of everything already in job_log_dir unchanged.

Each case reruns against a copy of a finished job (fault_tools.reference_job:
dumps, summaries, three checkpoints) and hashes every file before and after.
The cases run as subprocesses, a few at a time. The read-only and full-disk
cases mount a private file system with `unshare -rm` (an unprivileged user +
mount namespace); where the kernel does not allow that they are skipped.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from fault_tools import (
    FAULT_EXP,
    FAULT_STEPS,
    command,
    env,
    error_line,
    reference_job,
    step_dir,
    tree_digest,
)

from paxlike import job_lock


@dataclasses.dataclass
class Case:
  id: str
  args: list[str]
  patterns: list[str]  # regexes the error line must match; {job} is the job_log_dir
  devices: int = 1
  setup: Callable[[Path, Path], None] | None = None  # (job, case dir) before hashing
  fresh: bool = False  # job_log_dir does not exist yet (nothing to keep)
  sandbox: str | None = None  # "read_only", "full", "nearly_full": run under unshare -rm
  requires: str | None = None  # a module the case needs (skipped without it)


def _live_lock(job: Path, _: Path) -> None:
  (job / job_lock.LOCK_NAME).write_text(json.dumps(
      {"pid": os.getpid(), "host": socket.gethostname(),
       "start_ticks": job_lock._start_ticks(os.getpid()), "started": "now"}) + "\n")


def _damaged_metadata(job: Path, _: Path) -> None:
  meta = step_dir(job, FAULT_STEPS) / "state" / "_METADATA"
  meta.write_bytes(meta.read_bytes()[:20])


def _bad_utf8(_: Path, case_dir: Path) -> None:
  (case_dir / "data").mkdir()
  (case_dir / "data" / "bad.txt").write_bytes(b"\xff\xfe not text \xfa\n")


def _job_is_a_file(job: Path, _: Path) -> None:
  shutil.rmtree(job)
  job.write_text("a file where the job_log_dir should be\n")


CASES = [
    Case("unknown_experiment", ["--exp=fault_experiments.FaultTinny"],
         [r"FaultTinny", r"FaultTiny\b"]),
    Case("unknown_set_key", [FAULT_EXP, "--set", "MODEL_DIM=32"], [r"MODEL_DIM\b", "MODEL_DIMS"]),
    Case("ill_typed_set", [FAULT_EXP, "--set", "NUM_LAYERS=two"], ["NUM_LAYERS", r"\bint\b"]),
    Case("mesh_device_mismatch", [FAULT_EXP, "--set", "ICI_MESH_SHAPE=[1,2,1]"],
         [r"needs 2 devices", r"\b1 is available"]),
    Case("dcn_process_mismatch", [FAULT_EXP, "--set", "DCN_MESH_SHAPE=[2,1,1]"],
         [r"DCN_MESH_SHAPE=\[2, 1, 1\]", r"has 1\b"], devices=2),
    Case("data_files_missing", ["--exp=fault_experiments.TextTiny",
                                "--set", "DATA_FILES=/nonexistent/dir/*.txt"],
         ["no data file matches", "/nonexistent/dir"], requires="paxlike.inputs.text"),
    Case("data_file_unreadable", ["--exp=fault_experiments.TextTiny",
                                  "--set", "DATA_FILES={case}/data/*.txt"],
         ["cannot read data file", r"bad\.txt"], setup=_bad_utf8,
         requires="paxlike.inputs.text"),
    Case("job_log_dir_is_a_file", [FAULT_EXP], ["exists and is not a directory"],
         setup=_job_is_a_file),
    Case("job_log_dir_read_only", [FAULT_EXP], ["not writable", "Read-only file system"],
         sandbox="read_only"),
    Case("job_log_dir_full", [FAULT_EXP], ["not writable", "No space left on device"],
         sandbox="full"),
    Case("job_log_dir_too_small_for_a_checkpoint", [FAULT_EXP],
         [r"MiB free", r"one checkpoint of this model needs about"], sandbox="nearly_full"),
    Case("missing_pgle_profile", [FAULT_EXP, "--pgle=use",
                                  "--pgle_profile_path=/nonexistent/profile.pb"],
         ["PGLE profile", "/nonexistent/profile.pb"], requires="paxlike.pgle"),
    # Found before anything runs, not in the eval after the last training step.
    Case("eval_batch_indivisible", [FAULT_EXP, "--set", "ICI_MESH_SHAPE=[1,3,1]"],
         [r"the eval input 'test': the global batch 8 does not divide over replica x data = "
          r"3 mesh shards"], devices=3),
    Case("restore_step_missing", [FAULT_EXP, "--restore_checkpoint_step=7"],
         [r"step 7\b", r"available: \[8, 12, 16\]"]),
    Case("restore_step_before_later_checkpoints", [FAULT_EXP, "--restore_checkpoint_step=8"],
         [r"--restore_checkpoint_step=8 trains on", r"already has step 12 after it"]),
    Case("init_from_missing", [FAULT_EXP, "--init_from=hf:/nonexistent/flan-t5-smal"],
         [r"--init_from 'hf:/nonexistent/flan-t5-smal': /nonexistent/flan-t5-smal does not "
          r"exist"], fresh=True),
    Case("jax_platform_absent", [FAULT_EXP, "--jax_platforms=rocm"],
         [r"JAX starts no backend for platforms 'rocm' on this machine"], fresh=True),
    Case("restore_dir_missing", [FAULT_EXP, "--restore_checkpoint_dir=/nonexistent/ckpts"],
         ["--restore_checkpoint_dir", "/nonexistent/ckpts", "does not exist"], fresh=True),
    Case("changed_model", [FAULT_EXP, "--set", "MODEL_DIMS=32"],
         [rf"checkpoint step {FAULT_STEPS}\b", r"params/\S+ has shape \(64,\) float32 in the "
          r"checkpoint but shape \(32,\) float32 in this run", "new --job_log_dir"]),
    Case("changed_optimizer", [FAULT_EXP, "--set", "OPTIMIZER=sgd"],
         [r"does not fit this run's model: opt_state", r"had another OPTIMIZER"]),
    Case("damaged_checkpoint_metadata", [FAULT_EXP],
         [rf"checkpoint step {FAULT_STEPS}\b", "damaged", "--restore_fallback"],
         setup=_damaged_metadata),
    Case("job_log_dir_in_use", [FAULT_EXP],
         [rf"in use by pid {os.getpid()} on host {re.escape(socket.gethostname())}"],
         setup=_live_lock),
]


def _unshare_works() -> bool:
  try:
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True,
                          timeout=30).returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    return False


def _sandboxed(case: Case, cmd: list[str], job: Path, case_dir: Path, ref: Path) -> list[str]:
  """The command under `unshare -rm`, on a read-only or (nearly) full private mount."""
  run = " ".join(shlex.quote(c) for c in cmd)
  if case.sandbox == "read_only":
    q = shlex.quote(str(job))
    return ["unshare", "-rm", "sh", "-c",
            f"mount --bind {q} {q} && mount -o remount,bind,ro {q} && exec {run}"]
  mnt = shlex.quote(str(case_dir / "mnt"))
  digest = "find job -type f -exec sha256sum {} + | sort"
  fill = ("dd if=/dev/zero of=fill bs=64k 2>/dev/null; true" if case.sandbox == "full" else
          "avail=$(df --output=avail -k . | tail -1); "
          "dd if=/dev/zero of=fill bs=1k count=$((avail - 256)) 2>/dev/null")
  out = shlex.quote(str(case_dir))
  return ["unshare", "-rm", "sh", "-c",
          f"mount -t tmpfs -o size=16m tmpfs {mnt} && cd {mnt} && "
          f"cp -a {shlex.quote(str(ref))} job && {fill} && {digest} > {out}/before && "
          f"{{ {run.replace(str(job), str(case_dir / 'mnt' / 'job'))}; rc=$?; }}; "
          f"{digest} > {out}/after; exit $rc"]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
  ref = reference_job(tmp_path_factory)
  can_unshare = _unshare_works()
  jobs = {}
  for case in CASES:
    if case.requires:
      try:
        __import__(case.requires)
      except ImportError:
        jobs[case.id] = f"needs {case.requires}"
        continue
    if case.sandbox and not can_unshare:
      jobs[case.id] = "unshare -rm (user + mount namespaces) is not available here"
      continue
    case_dir = tmp_path_factory.mktemp(case.id)
    job = case_dir / "job"
    if not case.fresh:
      shutil.copytree(ref, job)
    if case.setup:
      case.setup(job, case_dir)
    if case.sandbox and case.sandbox != "read_only":
      (case_dir / "mnt").mkdir()
    args = [a.replace("{case}", str(case_dir)) for a in case.args]
    cmd = command([*args, f"--job_log_dir={job}"])
    if case.sandbox:
      cmd = _sandboxed(case, cmd, job, case_dir, ref)
    before = tree_digest(job) if job.is_dir() else (job.read_bytes() if job.exists() else None)
    jobs[case.id] = (case, cmd, job, case_dir, before)

  def go(item):
    case, cmd, job, case_dir, before = item
    proc = subprocess.run(cmd, cwd=case_dir, env=env(case.devices), capture_output=True,
                          text=True, timeout=300)
    if case.sandbox in ("full", "nearly_full"):
      before, after = ((case_dir / n).read_text() for n in ("before", "after"))
      assert before.strip(), "the sandbox did not hash the job"
    else:
      after = tree_digest(job) if job.is_dir() else (job.read_bytes() if job.exists() else None)
    return case.id, (proc, job, before, after)

  runnable = [v for v in jobs.values() if isinstance(v, tuple)]
  with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
    jobs.update(dict(pool.map(go, runnable)))
  return jobs


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_exits_2_and_leaves_job_log_dir_untouched(outcomes, case):
  outcome = outcomes[case.id]
  if isinstance(outcome, str):
    pytest.skip(outcome)
  proc, job, before, after = outcome
  line = error_line(proc)
  print(f"{case.id}: {line}")
  for pattern in case.patterns:
    assert re.search(pattern, line), f"{pattern!r} not in: {line}"
  if case.fresh:  # a refused run creates nothing, not even an empty job_log_dir
    assert not job.exists(), list(job.iterdir())
  else:
    assert after == before, f"{case.id}: job_log_dir changed"

