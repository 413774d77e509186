"""A job an earlier paxlike wrote resumes in this one.

tests/old_jobs/ holds, for small versions of the README's LM and of the Llama family,
the checkpoint at step 3 of a run that went on to step 4, and that run's loss at step 4
(old_jobs.json, with the paxlike commit and the JAX, optax and orbax releases that wrote
them). Resuming one here must reach the same loss. What would break every user's
existing jobs fails here: a renamed parameter or layer, another shape of the optimizer's
state (a new optax release: CI installs the newest), a change of orbax's format, or of
what the input pipeline records. When such a change is meant, say so in the notes of the
release, and remake the jobs with `python tests/checkpoint_compat_test.py`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, TRAINED_RE, describe, run_cli

OLD = Path(__file__).resolve().parent / "old_jobs"
STEP = 3  # the step the old jobs' checkpoints hold; each test trains one more
# The knobs of each old job: small enough that its checkpoint is a few hundred KB.
JOBS = {
    "ArithmeticAdditionTiny": ["MODEL_DIMS=16", "NUM_HEADS=2", "PERCORE_BATCH_SIZE=8"],
    "LlamaArithmeticTiny": ["MODEL_DIMS=16", "NUM_HEADS=2", "NUM_KV_HEADS=1",
                            "HIDDEN_DIMS=32", "NUM_LAYERS=2", "PERCORE_BATCH_SIZE=8"],
}
# The loss is printed to 4 decimals; JAX releases sum float32 in other orders.
TOLERANCE = 2e-3


def _args(exp: str, job: Path, steps: int) -> list[str]:
  sets = [*JOBS[exp], f"NUM_TRAIN_STEPS={steps}", f"CHECKPOINT_EVERY_N_STEPS={STEP}",
          "EVAL_INTERVAL_STEPS=1000", "SUMMARY_INTERVAL_STEPS=1"]
  return [f"--exp={exp}", f"--job_log_dir={job}", *(a for s in sets for a in ("--set", s))]


def _final_loss(proc: subprocess.CompletedProcess) -> float:
  m = TRAINED_RE.search(proc.stdout)
  assert m, describe(proc)
  return float(m.group(5))


@pytest.mark.parametrize("exp", sorted(JOBS))
def test_a_job_an_earlier_paxlike_wrote_resumes_where_it_stopped(exp, tmp_path):
  made = json.loads((OLD / "old_jobs.json").read_text())
  job = tmp_path / "job"
  shutil.copytree(OLD / exp, job)
  proc = run_cli(_args(exp, job, STEP + 1), tmp_path)
  assert proc.returncode == 0, describe(proc)
  said = proc.stdout + proc.stderr
  assert f"restored step {STEP} from" in said, said[-3000:]
  assert f"trained steps {STEP}..{STEP + 1}" in proc.stdout, describe(proc)
  # The same loss as the run that wrote the checkpoint went on to: the parameters, the
  # optimizer's state and the input's position all came back.
  assert _final_loss(proc) == pytest.approx(made["jobs"][exp]["loss"], abs=TOLERANCE), made


def remake() -> None:
  """Writes tests/old_jobs/ with this checkout (run by hand when a change is meant)."""
  import importlib.metadata as md
  import tempfile

  shutil.rmtree(OLD, ignore_errors=True)
  OLD.mkdir()
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                          capture_output=True, text=True).stdout.strip()
  record = {"made_by": f"paxlike {commit}, " + ", ".join(
      f"{p} {md.version(p)}" for p in ("jax", "flax", "optax", "orbax-checkpoint")),
            "step": STEP, "jobs": {}}
  for exp in sorted(JOBS):
    with tempfile.TemporaryDirectory() as tmp:
      job = Path(tmp) / "job"
      proc = run_cli(_args(exp, job, STEP + 1), Path(tmp))
      assert proc.returncode == 0, describe(proc)
      ckpt = Path("checkpoints") / f"checkpoint_{STEP:08d}"
      shutil.copytree(job / ckpt, OLD / exp / ckpt)
      record["jobs"][exp] = {"args": " ".join(_args(exp, Path("JOB"), STEP + 1)),
                             "loss": _final_loss(proc)}
  (OLD / "old_jobs.json").write_text(json.dumps(record, indent=1) + "\n")
  print(f"wrote {OLD}: {record}")


if __name__ == "__main__":
  sys.exit(remake())
