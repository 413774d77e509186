"""Helpers for the fault tests: CLI runs (with the suite's shared compilation cache),
checkpoint reads, directory hashes, and one uninterrupted reference run per test session.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import REPO_ROOT, subprocess_env

TESTS_DIR = Path(__file__).resolve().parent
_SESSION: dict[str, object] = {}


def env(devices: int = 1, **extra: str) -> dict[str, str]:
  """The environment of a CLI run: fake devices, the shared compile cache, tests/ importable."""
  out = subprocess_env(devices)
  out["JAX_PLATFORMS"] = "cpu"
  paths = [str(TESTS_DIR), str(REPO_ROOT)]
  if out.get("PYTHONPATH"):
    paths.append(out["PYTHONPATH"])
  out["PYTHONPATH"] = os.pathsep.join(paths)
  out.pop("PAXLIKE_TEST_FAULT", None)
  out.update(extra)
  return out


def command(args: list[str]) -> list[str]:
  return [sys.executable, "-m", "paxlike.main", *args]


def launch(args: list[str], cwd: Path, devices: int = 1, **extra_env: str) -> subprocess.Popen:
  return subprocess.Popen(command(args), cwd=cwd, env=env(devices, **extra_env),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(args: list[str], cwd: Path, devices: int = 1, timeout: float = 300,
        **extra_env: str) -> subprocess.CompletedProcess:
  return subprocess.run(command(args), cwd=cwd, env=env(devices, **extra_env),
                        capture_output=True, text=True, timeout=timeout)


def describe(proc) -> str:
  return (f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n"
          f"--- stderr\n{(proc.stderr or '')[-5000:]}")


def error_line(proc) -> str:
  """The single `error: ...` line of a run that must have failed with exit 2, no traceback."""
  assert proc.returncode == 2, describe(proc)
  assert "Traceback" not in proc.stderr, describe(proc)
  lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
  assert len(lines) == 1, describe(proc)
  return lines[0]


def step_dir(job: Path, step: int) -> Path:
  return job / "checkpoints" / f"checkpoint_{step:08d}"


def complete_steps(job: Path) -> list[int]:
  ckpts = job / "checkpoints"
  if not ckpts.is_dir():
    return []
  return sorted(int(p.name.split("_")[1]) for p in ckpts.iterdir()
                if p.name.startswith("checkpoint_") and p.name.split("_")[1].isdigit())


def partial_dirs(job: Path) -> list[str]:
  ckpts = job / "checkpoints"
  return sorted(p.name for p in ckpts.iterdir() if "orbax-checkpoint-tmp" in p.name) if (
      ckpts.is_dir()) else []


def read_checkpoint(job: Path, step: int) -> dict[str, np.ndarray]:
  """Every array of a checkpoint's state, by path, plus the input position as 'input/...'."""
  import jax
  import orbax.checkpoint as ocp

  path = step_dir(job, step)
  meta = ocp.StandardCheckpointHandler().metadata(path / "state").tree
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
  with ocp.PyTreeCheckpointer() as ckptr:
    tree = ckptr.restore(path / "state", args=ocp.args.PyTreeRestore(restore_args=restore_args))
  out = {jax.tree_util.keystr(p): np.asarray(v)
         for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}
  for k, v in json.loads((path / "input" / "metadata").read_text()).items():
    out[f"input/{k}"] = np.asarray(v)
  return out


def assert_checkpoints_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
  assert sorted(a) == sorted(b)
  for k in a:
    assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
    assert a[k].tobytes() == b[k].tobytes(), f"{k} differs"


def tree_digest(root: Path) -> dict[str, str]:
  """sha256 of every file under root, by relative path (directories by name only)."""
  out = {}
  for dirpath, dirnames, filenames in os.walk(root):
    for d in dirnames:
      out[os.path.relpath(os.path.join(dirpath, d), root) + "/"] = "dir"
    for f in filenames:
      p = os.path.join(dirpath, f)
      out[os.path.relpath(p, root)] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
  return out


FAULT_EXP = "--exp=fault_experiments.FaultTiny"
FAULT_STEPS = 16


def reference_job(tmp_path_factory) -> Path:
  """One uninterrupted FaultTiny run for the whole session (the fault tests compare with it)."""
  if "reference" not in _SESSION:
    cwd = tmp_path_factory.mktemp("reference")
    proc = run([FAULT_EXP, "--job_log_dir=job"], cwd)
    assert proc.returncode == 0, describe(proc)
    _SESSION["reference"] = cwd / "job"
  return _SESSION["reference"]
