"""The memory preflight on a CUDA GPU (marker `gpu`): a budget below the step is one line.

Skipped on the CPU suite; on a machine with a CUDA GPU:

    JAX_PLATFORMS=cuda python -m pytest -m gpu tests/gpu_memory_test.py
"""

from __future__ import annotations

import json

from conftest import REPO_ROOT, TINY, cuda_only, describe, run_cli

pytestmark = cuda_only()

SMALL = ["--set", "NUM_TRAIN_STEPS=2", "--set", "MODEL_DIMS=32", "--set", "MAX_SEQ_LEN=16",
         "--set", "PERCORE_BATCH_SIZE=2", "--enable_checkpoint_saving=false",
         "--enable_summary_writer=false"]


def test_a_budget_below_the_compiled_gpu_step_is_refused_in_one_line(tmp_path):
  proc = run_cli([f"--exp={TINY}", f"--job_log_dir={tmp_path / 'tight'}",
                  "--device_memory_gib=0.0001", *SMALL], REPO_ROOT)
  assert proc.returncode == 2, describe(proc)
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "GiB per device" in errors[0], errors
  assert "Traceback" not in proc.stderr and "RESOURCE_EXHAUSTED" not in proc.stderr
  assert "step 1" not in proc.stdout + proc.stderr

  ok = run_cli([f"--exp={TINY}", f"--job_log_dir={tmp_path / 'roomy'}",
                "--device_memory_gib=4", *SMALL], REPO_ROOT)
  assert ok.returncode == 0, describe(ok)
  env = json.loads((tmp_path / "roomy" / "run_env.json").read_text())
  assert env["platform"] == "gpu", env["platform"]
