"""PGLE modes: their flags, JAX config and files; honesty on CPU; `use` without a profile."""

from __future__ import annotations

import logging
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from conftest import TINY, describe, run_cli

from paxlike import pgle, xla_flags
from paxlike.errors import UserError


def _exp():
  return types.SimpleNamespace(XLA_FLAGS_OVERRIDES={"gpu": {pgle.LHS_FLAG: False}},
                               DCN_MESH_SHAPE=None)


def test_off_changes_nothing():
  p = pgle.plan("off", "gpu")
  assert (p.xla_flags, p.env, p.jax_config, p.effective) == ({}, {}, {}, False)


def test_auto_on_gpu_enables_jax_pgle_with_the_experiments_numbers():
  p = pgle.plan("auto", "gpu", profiling_runs=5, aggregation_percentile=85)
  assert p.effective
  assert p.jax_config == {"jax_enable_pgle": True, "jax_pgle_profiling_runs": 5,
                          "jax_pgle_aggregation_percentile": 85}
  assert p.env == {"JAX_ENABLE_PGLE": "true", "JAX_PGLE_PROFILING_RUNS": "5",
                   "JAX_PGLE_AGGREGATION_PERCENTILE": "85"}
  # The latency-hiding scheduler is on even where the experiment turned it off...
  res = xla_flags.resolve(_exp(), "gpu", pgle_plan=p, environ={})
  assert res.flags[pgle.LHS_FLAG] == "true" and res.sources[pgle.LHS_FLAG] == "pgle"
  assert res.env["JAX_ENABLE_PGLE"] == "true"
  # ... but not over the user's own export.
  res = xla_flags.resolve(_exp(), "gpu", pgle_plan=p,
                          environ={"XLA_FLAGS": f"--{pgle.LHS_FLAG}=false"})
  assert res.flags[pgle.LHS_FLAG] == "false" and res.sources[pgle.LHS_FLAG] == "user"


def test_auto_sets_jax_config():
  p = pgle.plan("auto", "gpu", profiling_runs=4, aggregation_percentile=80)
  before = (jax.config.jax_enable_pgle, jax.config.jax_pgle_profiling_runs,
            jax.config.jax_pgle_aggregation_percentile)
  try:
    p.apply_jax_config()
    assert (jax.config.jax_enable_pgle, jax.config.jax_pgle_profiling_runs,
            jax.config.jax_pgle_aggregation_percentile) == (True, 4, 80)
  finally:
    for name, value in zip(("jax_enable_pgle", "jax_pgle_profiling_runs",
                            "jax_pgle_aggregation_percentile"), before, strict=True):
      jax.config.update(name, value)


def test_collect_on_gpu_profiles_into_job_log_dir(tmp_path):
  p = pgle.plan("collect", "gpu", job_log_dir=str(tmp_path))
  assert p.effective
  assert p.profile_path == str(tmp_path / "pgle" / "profile.pb")
  assert p.xla_flags == {pgle.LHS_FLAG: "true", "xla_gpu_enable_command_buffer": ""}
  res = xla_flags.resolve(_exp(), "gpu", pgle_plan=p, environ={})
  assert "--xla_gpu_enable_command_buffer= " in res.env["XLA_FLAGS"] + " "


def test_use_points_xla_at_the_profile(tmp_path):
  profile = tmp_path / "pgle" / "profile.pb"
  profile.parent.mkdir()
  profile.write_bytes(b"\x0a\x01x")
  p = pgle.plan("use", "gpu", job_log_dir=str(tmp_path))
  assert p.xla_flags == {pgle.LHS_FLAG: "true", pgle.PROFILE_FLAG: str(profile)}
  other = tmp_path / "elsewhere.pb"
  other.write_bytes(b"\x0a\x01y")
  p = pgle.plan("use", "gpu", job_log_dir=str(tmp_path), profile_path=str(other))
  assert p.xla_flags[pgle.PROFILE_FLAG] == str(other)


def test_use_without_a_profile_is_a_user_error(tmp_path):
  with pytest.raises(UserError, match=r"no PGLE profile at .*pgle/profile\.pb; run with "
                                      r"--pgle=collect"):
    pgle.plan("use", "gpu", job_log_dir=str(tmp_path))
  (tmp_path / "empty.pb").write_bytes(b"")
  with pytest.raises(UserError, match="is empty"):
    pgle.plan("use", "cpu", profile_path=str(tmp_path / "empty.pb"))


@pytest.mark.parametrize("mode", ["auto", "collect", "use"])
@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_pgle_is_never_pretended_off_gpu(tmp_path, mode, platform):
  (tmp_path / "pgle").mkdir()
  (tmp_path / "pgle" / "profile.pb").write_bytes(b"x")
  p = pgle.plan(mode, platform, job_log_dir=str(tmp_path))
  assert not p.effective
  assert (p.xla_flags, p.jax_config, p.env) == ({}, {}, {})
  assert f"PGLE does nothing on {platform}" in p.note


def _counting_step():
  f = jax.jit(lambda x, y: (x @ y, jnp.sum(x)))

  def step(x, y):
    return f(x, y)

  step.jitted = f
  step.lower = f.lower
  return step


def test_collector_traces_the_steps_after_compilation_and_writes_the_profile(tmp_path):
  converted = []

  def converter(run_dir: str) -> bytes:
    converted.append(run_dir)
    return b"profiled-instructions"

  p = pgle.plan("collect", "gpu", job_log_dir=str(tmp_path), profiling_runs=2)
  collector = pgle.Collector(p, converter=converter)
  step = collector.wrap(_counting_step())
  assert step.jitted is not None  # still a jit-dispatched step
  x = jnp.ones((8, 8))
  for _ in range(5):
    step(x, x)
  collector.close()
  assert collector.calls == 5
  assert (tmp_path / "pgle" / "profile.pb").read_bytes() == b"profiled-instructions"
  assert len(converted) == 1
  assert list(Path(converted[0]).glob("*.xplane.pb")), "the trace was not saved"


def test_collector_on_cpu_keeps_the_trace_and_writes_no_profile(tmp_path):
  p = pgle.plan("collect", "cpu", job_log_dir=str(tmp_path), profiling_runs=1)
  collector = pgle.Collector(p)  # the real converter: empty off GPUs
  step = collector.wrap(_counting_step())
  x = jnp.ones((8, 8))
  for _ in range(3):
    step(x, x)
  collector.close()
  assert list((tmp_path / "pgle" / "trace").rglob("*.xplane.pb"))
  assert not (tmp_path / "pgle" / "profile.pb").exists()


def test_auto_warns_loudly_when_the_step_is_ahead_of_time_compiled():
  records = []
  handler = logging.Handler()
  handler.emit = records.append
  logger = logging.getLogger("paxlike")
  logger.addHandler(handler)
  try:
    p = pgle.plan("auto", "gpu")
    pgle.check_dispatch(_counting_step(), p)
    assert not records
    aot = jax.jit(lambda x: x + 1).lower(jnp.ones(2)).compile()
    pgle.check_dispatch(aot, p)
  finally:
    logger.removeHandler(handler)
  assert len(records) == 1 and "PGLE will NOT take effect" in records[0].getMessage()


def test_cli_use_without_a_profile_exits_2(tmp_path):
  proc = run_cli([f"--exp={TINY}", "--job_log_dir=job", "--pgle=use"], cwd=tmp_path)
  assert proc.returncode == 2, describe(proc)
  assert proc.stderr.strip().splitlines()[-1] == (
      f"error: --pgle=use: no PGLE profile at {tmp_path / 'job' / 'pgle' / 'profile.pb'}; "
      "run with --pgle=collect on a GPU first.")
  assert "Traceback" not in proc.stderr
