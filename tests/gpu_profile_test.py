"""--profile_steps on a CUDA GPU (marker `gpu`): the summary names ops, not command buffers.

XLA runs a GPU step's fusions inside CUDA graphs; traced, a graph is one
`command_buffer_N` event. A profiled run turns them off (paxlike.xla_flags).
Skipped on the CPU suite; on a machine with a CUDA GPU:

    JAX_PLATFORMS=cuda python -m pytest -m gpu tests/gpu_profile_test.py
"""

from __future__ import annotations

import json

from conftest import REPO_ROOT, TINY, cuda_only, describe, run_cli

from paxlike import xla_flags

pytestmark = cuda_only()


def test_a_profiled_gpu_run_names_ops_and_records_why_cuda_graphs_are_off(tmp_path):
  job = tmp_path / "job"
  proc = run_cli([f"--exp={TINY}", f"--job_log_dir={job}", "--set", "NUM_TRAIN_STEPS=4",
                  "--profile_steps=2", "--enable_checkpoint_saving=false",
                  "--enable_summary_writer=false"], REPO_ROOT)
  assert proc.returncode == 0, describe(proc)
  summary = json.loads((job / "profile" / "summary.json").read_text())
  names = [op["name"] for op in summary["top_ops"]]
  assert names and not [n for n in names if "command_buffer" in n], names
  assert summary["mean"]["gemm_ms"] > 0, summary["mean"]

  env = json.loads((job / "run_env.json").read_text())
  flag = xla_flags.COMMAND_BUFFER_FLAG
  assert {"flag": flag, "value": "", "source": "profile"} in env["xla_flags_resolved"]
  assert any("without CUDA graphs" in n for n in env["xla_flag_notes"])
  assert "without CUDA graphs" in proc.stderr
