"""XLA flags: platform detection without a backend, presets < experiment < user, run_env."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
from conftest import REPO_ROOT, TINY, describe, run_cli

from paxlike import pgle, xla_flags
from paxlike.errors import UserError


def _exp(overrides=None, dcn=None):
  return types.SimpleNamespace(XLA_FLAGS_OVERRIDES=overrides, DCN_MESH_SHAPE=dcn)


def _flag_names(text: str) -> list[str]:
  return [t[2:].split("=", 1)[0] for t in text.split()]


def test_preset_then_experiment_then_user_environment():
  exp = _exp({
      "gpu": {"xla_gpu_enable_triton_gemm": True,  # overrides the preset's false
              "xla_gpu_all_reduce_combine_threshold_bytes": 123,  # the user overrides this
              "xla_gpu_enable_while_loop_double_buffering": None,  # drops a preset flag
              "--xla_gpu_exhaustive_tiling_search": "true"},  # a new flag, leading -- allowed
      "tpu": {"xla_tpu_only": "1"},  # another platform's: not applied
  })
  user = ("--xla_gpu_all_reduce_combine_threshold_bytes=7 "
          "--xla_force_host_platform_device_count=8")
  res = xla_flags.resolve(exp, "gpu", environ={"XLA_FLAGS": user})
  flags = res.env["XLA_FLAGS"]
  names = _flag_names(flags)

  assert len(names) == len(set(names)), f"a flag appears twice: {flags}"
  assert names == sorted(names)
  assert res.flags["xla_gpu_enable_latency_hiding_scheduler"] == "true"
  assert res.sources["xla_gpu_enable_latency_hiding_scheduler"] == "preset"
  assert res.flags["xla_gpu_enable_triton_gemm"] == "true"
  assert res.sources["xla_gpu_enable_triton_gemm"] == "experiment"
  assert "xla_gpu_enable_while_loop_double_buffering" not in res.flags
  assert res.flags["xla_gpu_exhaustive_tiling_search"] == "true"
  assert res.flags["xla_gpu_all_reduce_combine_threshold_bytes"] == "7"  # the user wins
  assert res.sources["xla_gpu_all_reduce_combine_threshold_bytes"] == "user"
  assert "--xla_force_host_platform_device_count=8" in flags
  assert "xla_tpu_only" not in flags
  # Same inputs, same string.
  assert xla_flags.resolve(exp, "gpu", environ={"XLA_FLAGS": user}).env["XLA_FLAGS"] == flags


def test_user_duplicates_keep_their_last_value_and_user_env_vars_win():
  res = xla_flags.resolve(_exp(), "gpu", environ={
      "XLA_FLAGS": "--xla_gpu_enable_triton_gemm=true --xla_gpu_enable_triton_gemm=false",
      "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"})
  assert _flag_names(res.env["XLA_FLAGS"]).count("xla_gpu_enable_triton_gemm") == 1
  assert res.flags["xla_gpu_enable_triton_gemm"] == "false"
  assert res.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"


def test_tpu_flags_go_to_libtpu_and_multislice_adds_dcn_flags():
  single = xla_flags.resolve(_exp(dcn=[1, 1, 1]), "tpu",
                             environ={"XLA_FLAGS": "--xla_dump_to=/tmp/d"})
  multi = xla_flags.resolve(_exp(dcn=[2, 1, 1]), "tpu", environ={})
  assert single.flags_var == "LIBTPU_INIT_ARGS"
  assert "--xla_tpu_enable_latency_hiding_scheduler=true" in single.env["LIBTPU_INIT_ARGS"]
  assert "XLA_FLAGS" not in single.env  # the user's XLA_FLAGS are left alone on TPU
  assert "xla_tpu_spmd_threshold_for_allgather_cse" not in single.flags
  assert multi.flags["xla_tpu_spmd_threshold_for_allgather_cse"] == "10000"
  assert multi.flags["xla_jf_spmd_threshold_for_windowed_einsum_mib"] == "0"


def test_cpu_has_no_preset_and_keeps_the_users_flags():
  res = xla_flags.resolve(_exp(), "cpu", environ={
      "XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
  assert res.env == {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
  assert res.sources == {"xla_force_host_platform_device_count": "user"}


@pytest.mark.parametrize("bad", [["not-a-dict"], {"metal": {}}, {"gpu": ["x"]}])
def test_malformed_experiment_flags_are_user_errors(bad):
  with pytest.raises(UserError, match="XLA_FLAGS_OVERRIDES"):
    xla_flags.resolve(_exp(bad), "gpu", environ={})


def test_a_non_flag_in_exported_xla_flags_is_a_user_error():
  with pytest.raises(UserError, match="not a --flag"):
    xla_flags.resolve(_exp(), "cpu", environ={"XLA_FLAGS": "xla_oops=1"})


@pytest.mark.parametrize("environ, modules, nodes, want", [
    ({"JAX_PLATFORMS": "cuda,cpu"}, set(), [], "gpu"),
    ({"JAX_PLATFORMS": "tpu"}, set(), [], "tpu"),
    ({"JAX_PLATFORMS": "cpu"}, {"libtpu"}, ["/dev/accel0"], "cpu"),
    ({"JAX_PLATFORM_NAME": "gpu"}, set(), [], "gpu"),
    ({}, {"libtpu"}, ["/dev/accel0"], "tpu"),
    ({}, {"libtpu"}, ["/dev/vfio/0"], "tpu"),
    ({}, {"jax_cuda12_plugin"}, ["/dev/nvidia0"], "gpu"),
    ({}, {"jax_cuda13_plugin"}, ["/dev/nvidia3"], "gpu"),
    ({}, {"jax_cuda12_plugin"}, [], "cpu"),  # a plugin without a GPU: JAX falls back to CPU
    ({}, set(), ["/dev/nvidia0"], "cpu"),  # a GPU without a plugin: CPU too
    ({}, set(), [], "cpu"),
])
def test_platform_rule(environ, modules, nodes, want):
  def device_glob(pattern):
    prefix = pattern.split("*")[0].split("[")[0]
    return [n for n in nodes if n.startswith(prefix)]

  platform, why = xla_flags.detect_platform(environ, importable=lambda m: m in modules,
                                            device_glob=device_glob)
  assert platform == want, why
  assert why


def test_configure_sets_flags_before_any_backend_starts(tmp_path):
  """In a fresh process: nothing JAX is even imported by detection and configure,
  and the flags configure() exported are the ones the backend then starts with."""
  script = f"""
import json, os, sys, types
sys.path.insert(0, {str(REPO_ROOT)!r})
from paxlike import log, xla_flags
log.setup()
exp = types.SimpleNamespace(DCN_MESH_SHAPE=None, PGLE_PROFILING_RUNS=3,
                            PGLE_AGGREGATION_PERCENTILE=90,
                            XLA_FLAGS_OVERRIDES={{"cpu": {{"xla_cpu_enable_fast_math": False}}}})
res = xla_flags.configure(exp, "off", {str(tmp_path)!r})
imported_jax = "jax" in sys.modules
import jax
from jax._src import xla_bridge
backends_before = list(xla_bridge._backends)
devices = jax.device_count()
print(json.dumps(dict(imported_jax=imported_jax, backends_before=backends_before,
                      devices=devices, platform=res.platform, rule=res.platform_rule,
                      xla_flags=os.environ["XLA_FLAGS"], late=res.late)))
"""
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)  # exercise the plugin / device-node rule
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=3"
  proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, describe(proc)
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["imported_jax"] is False
  assert out["backends_before"] == []
  assert out["late"] is False
  assert out["platform"] == "cpu", out["rule"]
  assert out["devices"] == 3  # the user's flag reached the backend
  assert out["xla_flags"] == ("--xla_cpu_enable_fast_math=false "
                              "--xla_force_host_platform_device_count=3")
  assert "xla flags for cpu" in proc.stderr  # the one log line


def test_every_gpu_preset_and_pgle_flag_is_known_to_this_xla(tmp_path):
  """XLA aborts on an unknown flag in XLA_FLAGS; its GPU flags are registered on CPU builds
  too, so a CPU backend start checks the names (a renamed flag would kill GPU runs)."""
  profile = tmp_path / "profile.pb"
  profile.write_bytes(b"x")
  flags = dict(xla_flags.GPU_PRESET)
  for mode in ("auto", "collect", "use"):
    flags.update(pgle.plan(mode, "gpu", job_log_dir=str(tmp_path),
                           profile_path=str(profile) if mode == "use" else None).xla_flags)
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags.format_flags(flags))
  proc = subprocess.run([sys.executable, "-c", "import jax; print(jax.device_count())"],
                        env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, describe(proc)


def test_a_run_records_resolved_flags_and_pgle_in_run_env(tmp_path):
  """The experiment's flag reaches XLA_FLAGS, each flag's source is recorded,
  --pgle=auto on a CPU is recorded as not enabled, said in one line; so is attention."""
  proc = run_cli([f"--exp={TINY}", "--job_log_dir=job", "--set", "NUM_TRAIN_STEPS=2",
                  "--set", "XLA_FLAGS_OVERRIDES={'cpu': {'xla_cpu_enable_fast_math': False}}",
                  "--pgle=auto", "--peak_tflops_per_device=0.01"], cwd=tmp_path,
                 optimized=True)  # the user's XLA_FLAGS: the fake-device count alone
  assert proc.returncode == 0, describe(proc)
  env = json.loads((tmp_path / "job" / "run_env.json").read_text())
  assert env["XLA_FLAGS"] == ("--xla_cpu_enable_fast_math=false "
                              "--xla_force_host_platform_device_count=1")
  sources = {r["flag"]: r["source"] for r in env["xla_flags_resolved"]}
  assert sources == {"xla_cpu_enable_fast_math": "experiment",
                     "xla_force_host_platform_device_count": "user"}
  assert env["platform_detected"] == "cpu" and env["platform_rule"] == "JAX_PLATFORMS=cpu"
  assert env["pgle"]["mode"] == "auto" and env["pgle"]["effective"] is False
  assert env["peak_flops_source"] == "--peak_tflops_per_device"
  lines = [ln for ln in proc.stderr.splitlines() if "PGLE does nothing on cpu" in ln]
  assert len(lines) == 1, proc.stderr
  assert "jax_enable_pgle" not in proc.stderr
  # The attention implementation: chosen as programs are lowered, logged once, recorded.
  assert env["attention"] == {"policy": "auto",
                              "choices": [{"implementation": "xla", "reason": "cpu"}]}
  assert [ln for ln in proc.stderr.splitlines() if "attention:" in ln][0].endswith(
      "attention: xla (cpu)"), proc.stderr
  assert proc.stderr.count("attention: ") == 1, proc.stderr
