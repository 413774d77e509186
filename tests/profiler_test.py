"""--profile_steps: a jax.profiler trace of a few steps and its readable summary."""

from __future__ import annotations

import glob
import json

import pytest

from paxlike import profiler
from tests.conftest import describe, run_cli

TINY = "LmCloudSpmdTiny"
SHORT = ["--set", "NUM_TRAIN_STEPS=4", "--enable_checkpoint_saving=false",
         "--enable_summary_writer=false"]


def test_profile_steps_writes_trace_and_summary(tmp_path):
  job = tmp_path / "job"
  proc = run_cli([f"--exp={TINY}", f"--job_log_dir={job}", *SHORT, "--profile_steps=2"],
                 tmp_path)
  assert proc.returncode == 0, describe(proc)
  traces = glob.glob(str(job / "profile" / "plugins" / "profile" / "*" / "*.trace.json.gz"))
  assert traces, describe(proc)
  summary = json.loads((job / "profile" / "summary.json").read_text())
  assert [s["step"] for s in summary["steps"]] == [3, 4]  # default start: after warm-up
  for s in summary["steps"]:
    parts = [s[f"{k}_ms"] for k in profiler.STEP_KEYS]
    assert all(p >= 0 for p in parts), s
    assert s["gemm_ms"] > 0, s
    # Ops may overlap on several threads, so the parts cover the wall time at least.
    assert sum(parts) >= 0.999 * s["wall_ms"], s
    assert s["host_gap_ms"] < s["wall_ms"], s
  assert summary["top_ops"] and summary["top_ops"][0]["ms_per_step"] > 0
  assert "profile: 2 steps, mean" in proc.stderr
  # The top op's name is defined in the compiled step written beside the trace.
  hlo = (job / "profile" / profiler.HLO_FILE).read_text()
  assert f"{summary['top_ops'][0]['name']} = " in hlo, summary["top_ops"][0]


@pytest.mark.parametrize("flag", ["--profile_steps=-1", "--profile_start_step=0"])
def test_bad_profile_flags_exit_2(tmp_path, flag):
  proc = run_cli([f"--exp={TINY}", f"--job_log_dir={tmp_path / 'job'}", "--profile_steps=2",
                  flag], tmp_path)
  assert proc.returncode == 2, describe(proc)
  line = proc.stderr.strip().splitlines()[-1]
  assert line.startswith("error: --profile_"), line
  assert "Traceback" not in proc.stderr


def _x(name, ts, dur, pid=1, tid=1, **args):
  return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def _meta(kind, pid, name, tid=None):
  e = {"ph": "M", "name": kind, "pid": pid, "args": {"name": name}}
  if tid is not None:
    e["tid"] = tid
  return e


def test_summary_of_a_cpu_trace_by_hand():
  """Two steps of 100 us; a while loop's body ops count, the loop itself does not."""
  events = [
      _meta("process_name", 1, "/host:CPU"),
      _x("train", 0, 90, tid=9, step_num=1), _x("train", 100, 50, tid=9, step_num=2),
      _x("while.3", 10, 50, hlo_op="while.3"),
      _x("dot.1", 10, 20, hlo_op="dot.1"),
      _x("fusion.2", 30, 10, hlo_op="fusion.2"),
      _x("ynn_fusion.4", 45, 10, hlo_op="ynn_fusion.4"),  # holds a dot (HLO text)
      _x("all-reduce.5", 110, 30, hlo_op="all-reduce.5"),
      _x("fusion.6", 120, 10, tid=2, hlo_op="fusion.6"),  # overlaps on another thread
  ]
  summary = profiler.summarize({"traceEvents": events}, dot_fusions={"ynn_fusion.4"})
  first, second = summary["steps"]
  assert first == {"step": 1, "wall_ms": 0.1, "gemm_ms": 0.03, "attention_ms": 0.0,
                   "other_ops_ms": 0.01, "collectives_ms": 0.0, "host_gap_ms": 0.06}
  # The last step ends with its marker: 50 us, 30 of them busy.
  assert second == {"step": 2, "wall_ms": 0.05, "gemm_ms": 0.0, "attention_ms": 0.0,
                    "other_ops_ms": 0.01, "collectives_ms": 0.03, "host_gap_ms": 0.02}
  assert [k["name"] for k in summary["top_ops"]][:2] == ["all-reduce.5", "dot.1"]
  assert "while.3" not in [k["name"] for k in summary["top_ops"]]


def test_summary_of_a_gpu_trace_counts_streams_once():
  """Kernels on the stream lines count; the derived 'XLA Ops' line repeats them."""
  events = [
      _meta("process_name", 1, "/host:CPU"), _meta("process_name", 2, "/device:GPU:0"),
      _meta("thread_name", 2, "Stream #13(Compute)", tid=13),
      _meta("thread_name", 2, "XLA Ops", tid=50),
      _x("train", 0, 100, pid=1, tid=9, step_num=7),
      _x("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", 0, 40, pid=2, tid=13, hlo_op="dot.1"),
      _x("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", 40, 20, pid=2, tid=13,
         hlo_op="custom-call.2"),
      _x("loop_add_fusion", 60, 10, pid=2, tid=13, hlo_op="loop_add_fusion"),
      _x("dot.1", 0, 40, pid=2, tid=50),
  ]
  (step,) = profiler.summarize({"traceEvents": events})["steps"]
  assert step == {"step": 7, "wall_ms": 0.1, "gemm_ms": 0.04, "attention_ms": 0.02,
                  "other_ops_ms": 0.01, "collectives_ms": 0.0, "host_gap_ms": 0.03}


def test_a_gpu_op_is_named_once_and_by_its_longest_kernels():
  """A cuBLAS call's memset does not make its GEMM 'other'; a loop's clone is the same op."""
  events = [
      _meta("process_name", 1, "/host:CPU"), _meta("process_name", 2, "/device:GPU:0"),
      _meta("thread_name", 2, "Stream #13(Compute)", tid=13),
      _x("train", 0, 100, pid=1, tid=9, step_num=1),
      _x("Memset 3", 0, 2, pid=2, tid=13, hlo_op="custom-call.77"),
      _x("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT", 2, 30, pid=2, tid=13,
         hlo_op="custom-call.77"),
      _x("cudnn_generated_fort_native_sdpa_sm90_flash_bprop", 40, 20, pid=2, tid=13,
         hlo_op="dot_product_attention_bwd.43"),
      _x("cudnn_generated_fort_native_sdpa_sm90_flash_bprop", 60, 20, pid=2, tid=13,
         hlo_op="dot_product_attention_bwd.43.double_buffer_clone"),
  ]
  top = profiler.summarize({"traceEvents": events})["top_ops"]
  assert [(k["name"], k["category"], k["count"]) for k in top] == [
      ("dot_product_attention_bwd.43", "attention", 2), ("custom-call.77", "gemm", 2)]
  assert top[0]["ms_per_step"] == 0.04


def test_fused_dots_from_hlo_text():
  hlo = """HloModule jit_f

%fused_computation (p0: f32[2,2], p1: f32[2,2]) -> f32[2,2] {
  %p0 = f32[2,2]{1,0} parameter(0)
  %p1 = f32[2,2]{1,0} parameter(1)
  ROOT %d = f32[2,2]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_add (p0: f32[2,2]) -> f32[2,2] {
  %p0 = f32[2,2]{1,0} parameter(0)
  ROOT %a = f32[2,2]{1,0} add(%p0, %p0)
}

ENTRY %main.2 (x: f32[2,2]) -> f32[2,2] {
  %x = f32[2,2]{1,0} parameter(0)
  %ynn_fusion = f32[2,2]{1,0} fusion(%x, %x), kind=kCustom, calls=%fused_computation
  ROOT %fusion.1 = f32[2,2]{1,0} fusion(%ynn_fusion), kind=kLoop, calls=%fused_add
}
"""
  assert profiler.fused_dots(hlo) == {"ynn_fusion"}


def test_plan_flags_win_over_the_experiments_pax_names():
  class Exp:
    PROFILER_NUM_STEPS = 4
    PROFILER_CAPTURE_STEP = 10

  assert profiler.make_plan(None, None, Exp()) == profiler.ProfilePlan(10, 4)
  assert profiler.make_plan(2, None, Exp()) == profiler.ProfilePlan(10, 2)
  assert profiler.make_plan(2, 5, Exp()) == profiler.ProfilePlan(5, 2)
  assert profiler.make_plan(0, None, Exp()) is None  # the flag turns it off
  assert profiler.make_plan(None, None, object()) is None  # off by default
  with pytest.raises(profiler.UserError, match=r"^--profile_start_step=5 starts a trace that "
                                               r"nothing asks for; add --profile_steps"):
    profiler.make_plan(None, 5, object())
  Exp.PROFILER_CAPTURE_STEP = 0  # Pax's default: paxlike's start, after warm-up
  assert profiler.make_plan(None, None, Exp()) == profiler.ProfilePlan(3, 4, start_given=False)
  with pytest.raises(profiler.UserError, match="PROFILER_NUM_STEPS"):
    Exp.PROFILER_NUM_STEPS = -2
    profiler.make_plan(None, None, Exp())


def test_plan_fits_the_runs_own_steps():
  default = profiler.make_plan(2, None, object())
  assert default.fit(1, 100) == profiler.ProfilePlan(3, 2)  # after compile and warm-up
  assert default.fit(41, 100) == profiler.ProfilePlan(43, 2)  # a resumed run's third step
  assert default.fit(1, 1) == profiler.ProfilePlan(1, 1)  # a run too short for warm-up
  assert profiler.make_plan(5, None, object()).fit(3, 4) == profiler.ProfilePlan(3, 2)
  assert default.fit(1, 3) == profiler.ProfilePlan(2, 2)
  given = profiler.make_plan(2, 5, object())
  assert given.fit(1, 100) == given and given.fit(6, 100) == given  # steps 5..6 overlap
  with pytest.raises(profiler.UserError, match=r"^--profile_steps=2 from step 5 traces steps "
                                               r"5\.\.6, and this run trains steps 41\.\.100; "
                                               r"pass --profile_start_step between 41 and 100"):
    given.fit(41, 100)

  class Exp:
    PROFILER_NUM_STEPS = 2
    PROFILER_CAPTURE_STEP = 10

  assert profiler.make_plan(None, None, Exp()).fit(1, 4) is None  # the knob's: a warning


def test_profile_steps_past_a_short_run_is_refused_before_training(tmp_path):
  job = tmp_path / "job"
  proc = run_cli([f"--exp={TINY}", f"--job_log_dir={job}", "--set", "NUM_TRAIN_STEPS=2",
                  "--profile_steps=2", "--profile_start_step=5"], tmp_path)
  assert proc.returncode == 2, describe(proc)
  assert "this run trains steps 1..2" in proc.stderr and "Traceback" not in proc.stderr
  assert not (job / "profile").exists()
  assert not list(job.glob("checkpoints/checkpoint_*")), describe(proc)  # refused before step 1
