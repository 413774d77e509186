"""benchmarks.mfu_suite: MFU of paxlike and the reference per size, report files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, describe

from benchmarks import mfu_suite


def _record(exp, overrides, steps, warmup, devices, timeout):
  """The fields benchmarks.train_step prints, for a model of 1M params per size step."""
  scale = 1 + len(overrides)
  step_s = 0.1 * scale
  return {"exp": f"experiments.lm.lm_cloud.{exp}", "step_s_median": step_s,
          "ref_step_s_median": step_s / 1.25, "ratio": 1.25, "tokens_per_sec": 1024 / step_s,
          "num_params": 10 ** 6 * scale, "model_flops_per_step": 1e9 * scale,
          "devices": devices or 1, "fprop_dtype": "float32"}


def test_suite_reports_mfu_beside_the_reference(tmp_path):
  calibrated = []

  def calibrator(devices, dtype, timeout):
    calibrated.append((devices, dtype))
    return 2e10

  args = mfu_suite.parse_args(["--sizes=tiny,small", "--steps=3", f"--out={tmp_path}"])
  report = mfu_suite.run_suite(args, runner=_record, calibrator=calibrator)
  paths = mfu_suite.write_report(report, str(tmp_path))

  assert calibrated == [(1, "float32")]  # one calibration per device count and dtype
  tiny, small = report["results"]
  assert tiny["paxlike_mfu"] == pytest.approx(1e9 / 0.1 / 1 / 2e10)
  assert tiny["ref_mfu"] == pytest.approx(1.25 * tiny["paxlike_mfu"])
  assert tiny["ref_tokens_per_sec"] == pytest.approx(1.25 * tiny["tokens_per_sec"])
  assert small["overrides"] == mfu_suite.SIZES["small"][1]
  saved = json.loads(open(paths["json"]).read())
  assert saved["peaks"]["1xfloat32"]["source"].startswith("calibrated")
  md = open(paths["md"]).read()
  assert "| tiny | LmCloudSpmdTiny | 1.00M | 1 | float32 | 10,240 | 12,800 | 1.250 | 50.00% " \
         "| 62.50% |" in md
  with open(paths["png"], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_accelerator_kinds_take_the_peak_from_the_table(tmp_path):
  args = mfu_suite.parse_args(["--device_kind=h100", "--sizes=tiny", "--steps=1"])
  report = mfu_suite.run_suite(args, runner=_record, calibrator=None)
  assert report["peaks"]["1xfloat32"] == {"tflops": 67.0, "source": "table: H100 float32"}


def test_unknown_size_exits_2():
  proc = subprocess.run([sys.executable, "-m", "benchmarks.mfu_suite", "--sizes=huge"],
                        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, describe(proc)
  assert proc.stderr.strip().startswith("error: unknown sizes ['huge']")
