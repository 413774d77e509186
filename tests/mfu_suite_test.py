"""benchmarks.mfu_suite: MFU of paxlike and the reference per size, report files."""

from __future__ import annotations

import json
import os
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


def test_the_suite_writes_only_where_out_names(tmp_path):
  """No default output directory: the repository is never written into unasked."""
  proc = subprocess.run([sys.executable, "-m", "benchmarks.mfu_suite", "--sizes=tiny"],
                        cwd=tmp_path, capture_output=True, text=True, timeout=120,
                        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
  assert proc.returncode == 2, describe(proc)
  assert proc.stderr.strip().startswith("error: --out is required"), proc.stderr
  assert not list(tmp_path.iterdir())


def test_h100_runs_the_one_gpu_sizes(monkeypatch):
  """--device_kind=h100 plans the 1B LM (batch 8 x 1024, bf16), FlanT5Base and FlanT5Large,
  each on one device without dropout; nothing is compiled."""
  import numpy as np

  from paxlike import experiment, registry

  # Where an experiment has an attention logit cap, the GPU sizes turn it off.
  monkeypatch.setattr(registry.get("FlanT5Large"), "ATTEN_LOGIT_CAP", 50.0, raising=False)
  entries = mfu_suite.plan(mfu_suite.parse_args(["--device_kind=h100"]))
  assert [e["exp"] for e in entries] == ["C4Spmd1BAdam4Replicas", "FlanT5Base", "FlanT5Large"]
  assert [e["devices"] for e in entries] == [1, 1, 1]
  exps = [experiment.instantiate(registry.get(e["exp"]), e["overrides"]) for e in entries]
  lm, base, large = exps
  assert (lm.PERCORE_BATCH_SIZE, lm.MAX_SEQ_LEN, lm.NUM_LAYERS, lm.MODEL_DIMS) == (8, 1024, 13,
                                                                                  2560)
  assert all(np.dtype(e.FPROP_DTYPE).name == "bfloat16" for e in exps)
  assert all(list(e.ICI_MESH_SHAPE) == [1, 1, 1] for e in exps)
  assert base.PERCORE_BATCH_SIZE == 32 and base.DROPOUT_PROB == 0.0 == large.DROPOUT_PROB
  assert large.ATTEN_LOGIT_CAP == -1.0
  assert not any(o.startswith("ATTEN_LOGIT_CAP") for o in entries[1]["overrides"])
  # Each size runs beside its hand-written reference: T5X's Adafactor included (the suite
  # stopped at FlanT5Base on an H200 when the references knew only adamw).
  from benchmarks import train_step
  from paxlike import config

  for e in exps:
    module, cfg = train_step.reference_for(config.build(e.task()))
    assert cfg.optimizer == e.OPTIMIZER, module.__name__


def test_list_prints_the_plan_and_runs_nothing():
  proc = subprocess.run([sys.executable, "-m", "benchmarks.mfu_suite", "--device_kind=h100",
                         "--sizes=flan_t5_base_1gpu", "--list"],
                        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, describe(proc)
  assert proc.stdout.strip() == ("flan_t5_base_1gpu: FlanT5Base on 1 device(s), --set "
                                 "ICI_MESH_SHAPE=[1,1,1] PERCORE_BATCH_SIZE=32 DROPOUT_PROB=0.0")


def test_the_docs_mfu_table_is_the_committed_reports():
  """docs/mfu.md shows benchmarks/results/mfu/report.json as the suite renders it."""
  import json

  from conftest import REPO_ROOT

  from benchmarks import mfu_suite

  report = json.loads((REPO_ROOT / "benchmarks/results/mfu/report.json").read_text())
  rows = mfu_suite.table_rows(report)
  docs = (REPO_ROOT / "docs/mfu.md").read_text()
  assert "\n".join(rows) in docs, "re-render docs/mfu.md's table from the suite's report"
