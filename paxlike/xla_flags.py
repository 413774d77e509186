"""XLA flags per platform, merged with the experiment's and the user's; run_env.json.

XLA reads XLA_FLAGS (and libtpu LIBTPU_INIT_ARGS) once, when the backend
starts, so `configure()` must run before anything asks JAX for devices. It
works out the platform without starting a backend (see `detect_platform`),
then merges, one value per flag, in rising precedence:

    platform preset  <  experiment XLA_FLAGS_OVERRIDES  <  --pgle mode  <  user's environment

and a profiled run (--profile_steps) on a GPU turns command buffers off
where neither the experiment nor the user set them (see `profile_flags`).
Flags the user already exported win: paxlike never overrides a flag the
user wrote. The merged flags are written back sorted by name, so the same
inputs always give the same string.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import os
import platform
import socket
import sys
from collections.abc import Mapping
from typing import Any

from paxlike import log as logging
from paxlike import pgle
from paxlike.errors import UserError

# GPU: overlap collectives with compute (latency-hiding scheduler, async and
# pipelined collectives on their own high-priority stream), and combine small
# collectives into large ones. Thresholds are the middle of what MaxText,
# AXLearn and JAX-Toolbox recipes use: all-reduce 1 GiB (gradients),
# all-gather 512 MiB and reduce-scatter 128 MiB (FSDP weights, per layer).
# Command buffers (CUDA graphs) keep XLA's default: --pgle=collect and
# --profile_steps turn them off (JAX's auto-PGLE does the same for its
# profiling compile), because the profiler cannot time the kernels inside a
# graph: a trace names `command_buffer_N`, not the ops it ran.
GPU_PRESET: dict[str, str] = {
    "xla_gpu_enable_latency_hiding_scheduler": "true",
    "xla_gpu_enable_highest_priority_async_stream": "true",
    "xla_gpu_enable_pipelined_all_gather": "true",
    "xla_gpu_enable_pipelined_reduce_scatter": "true",
    "xla_gpu_enable_pipelined_all_reduce": "true",
    "xla_gpu_enable_while_loop_double_buffering": "true",
    "xla_gpu_all_reduce_combine_threshold_bytes": str(1 << 30),
    "xla_gpu_all_gather_combine_threshold_bytes": str(1 << 29),
    "xla_gpu_reduce_scatter_combine_threshold_bytes": str(1 << 27),
    # cuBLAS for matmuls: Triton GEMM autotuning costs compile time for little gain here.
    "xla_gpu_enable_triton_gemm": "false",
    # No dot merger: XLA merges dots that share an operand (q, k and v) into one GEMM, then
    # copies its output apart and concatenates the gradients. On an H200 (jaxlib 0.11) the
    # step without it took 0.977x the time for FlanT5Base and 0.980x for the 1B LM, each
    # timed alternating in one process (benchmarks.compiler_options).
    "xla_gpu_dot_merger_threshold_mb": "0",
}
# Room for the latency-hiding scheduler's extra buffers is left by using 85%
# (JAX's default preallocation is 75%) of the GPU's memory.
GPU_ENV: dict[str, str] = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.85"}

# TPU (libtpu reads LIBTPU_INIT_ARGS): latency-hiding scheduler, async
# collectives fused with compute.
TPU_PRESET: dict[str, str] = {
    "xla_tpu_enable_latency_hiding_scheduler": "true",
    "xla_enable_async_all_gather": "true",
    "xla_enable_async_collective_permute": "true",
    "xla_tpu_enable_async_collective_fusion": "true",
    "xla_tpu_enable_async_collective_fusion_fuse_all_gather": "true",
    "xla_tpu_enable_async_collective_fusion_multiple_steps": "true",
    "xla_tpu_overlap_compute_collective_tc": "true",
}
# Pax's README flags for a mesh whose DCN axis spans slices (multislice).
TPU_MULTISLICE: dict[str, str] = {
    "xla_jf_spmd_threshold_for_windowed_einsum_mib": "0",
    "xla_tpu_spmd_threshold_for_allgather_cse": "10000",
    "xla_enable_async_all_gather": "true",
    "xla_tpu_enable_latency_hiding_scheduler": "true",
}

# The CPU backend has no collective scheduling to tune for these programs:
# no preset, only what the experiment and the user add.
CPU_PRESET: dict[str, str] = {}

# A profiled GPU run: XLA's empty list of command buffer kinds, no CUDA graphs.
COMMAND_BUFFER_FLAG = "xla_gpu_enable_command_buffer"
PROFILE_GPU_FLAGS: dict[str, str] = {COMMAND_BUFFER_FLAG: ""}
PROFILE_NOTE = ("--profile_steps: this run traces steps, so it runs without CUDA graphs "
                f"(--{COMMAND_BUFFER_FLAG}=) and the profile names the ops inside them; its "
                "step times may differ slightly from a run without profiling")

# Which environment variable carries the compiler's flags on each platform.
FLAGS_VAR = {"cpu": "XLA_FLAGS", "gpu": "XLA_FLAGS", "tpu": "LIBTPU_INIT_ARGS"}

_GPU_PLUGINS = ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_plugins.xla_cuda13",
                "jax_plugins.xla_cuda12", "jax_rocm7_plugin", "jax_rocm60_plugin")
_PLATFORM_ALIASES = {"cuda": "gpu", "rocm": "gpu", "gpu": "gpu", "tpu": "tpu", "cpu": "cpu"}


# ------------------------------------------------------------------ platform


def _importable(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is not None
  except (ImportError, ValueError):
    return False


def detect_platform(environ: Mapping[str, str] | None = None,
                    importable=_importable, device_glob=glob.glob) -> tuple[str, str]:
  """The platform JAX will pick, found without starting (or importing) JAX.

  The rule, first match wins:
    1. JAX_PLATFORMS (or the older JAX_PLATFORM_NAME) is set: its first entry
       (cuda/rocm/gpu -> gpu, tpu, cpu), since JAX takes the first that works.
    2. libtpu is importable and a TPU device node exists (/dev/accel*, or
       /dev/vfio/<n> on v5e/v6e): tpu.
    3. A jaxlib GPU plugin (jax_cuda12/13_plugin, jax_rocm*_plugin) is
       importable and a GPU device node exists (/dev/nvidia<n>, /dev/kfd): gpu.
    4. Otherwise cpu: with a plugin but no device (or a device but no plugin),
       JAX falls back to the CPU too.

  Returns:
    (platform, the reason in words).
  """
  environ = os.environ if environ is None else environ
  for var in ("JAX_PLATFORMS", "JAX_PLATFORM_NAME"):
    value = environ.get(var, "").strip()
    if value:
      first = value.split(",")[0].strip().lower()
      return _PLATFORM_ALIASES.get(first, first), f"{var}={value}"
  tpu_nodes = device_glob("/dev/accel*") + device_glob("/dev/vfio/[0-9]*")
  if importable("libtpu") and tpu_nodes:
    return "tpu", f"libtpu is installed and {tpu_nodes[0]} exists"
  gpu_nodes = device_glob("/dev/nvidia[0-9]*") + device_glob("/dev/kfd")
  plugins = [p for p in _GPU_PLUGINS if importable(p)]
  if plugins and gpu_nodes:
    return "gpu", f"{plugins[0]} is installed and {gpu_nodes[0]} exists"
  if plugins:
    return "cpu", f"{plugins[0]} is installed but no GPU device node exists"
  return "cpu", "no TPU or GPU plugin with a device node"


def backend_started() -> bool:
  """Whether this process already started a JAX backend (then flags come too late)."""
  bridge = sys.modules.get("jax._src.xla_bridge")
  return bool(getattr(bridge, "_backends", None))


# --------------------------------------------------------------------- flags


def parse_flags(text: str) -> dict[str, str | None]:
  """'--a=1 --b --a=2' -> {'a': '2', 'b': None}: the last value of a flag wins.

  Raises:
    UserError: a token that is not a --flag.
  """
  out: dict[str, str | None] = {}
  for token in text.split():
    if not token.startswith("--") or len(token) <= 2:
      raise UserError(f"{token!r} in the exported XLA flags is not a --flag; "
                      "write each one as --name=value.")
    name, eq, value = token[2:].partition("=")
    out[name] = value if eq else None
  return out


def format_flags(flags: Mapping[str, str | None]) -> str:
  """One value per flag, sorted by name: the same flags always give the same string."""
  return " ".join(f"--{k}" if v is None else f"--{k}={v}" for k, v in sorted(flags.items()))


def _flag_value(value: Any) -> str | None:
  if isinstance(value, bool):
    return "true" if value else "false"
  return str(value)


def experiment_flags(exp: Any, platform_name: str) -> dict[str, str | None]:
  """The experiment's XLA_FLAGS_OVERRIDES for this platform ('all' applies everywhere).

  A value of None removes a preset flag. Raises UserError on a malformed attribute.
  """
  table = getattr(exp, "XLA_FLAGS_OVERRIDES", None) or {}
  if not isinstance(table, Mapping):
    raise UserError("XLA_FLAGS_OVERRIDES must be a dict of platform -> {flag: value}, "
                    f"e.g. {{'gpu': {{'xla_gpu_enable_triton_gemm': True}}}}; got {table!r}.")
  unknown = sorted(set(table) - {"all", *FLAGS_VAR})
  if unknown:
    raise UserError(f"XLA_FLAGS_OVERRIDES has platform keys {unknown}; use 'cpu', 'gpu', "
                    "'tpu' or 'all'.")
  out: dict[str, str | None] = {}
  for key in ("all", platform_name):
    entries = table.get(key) or {}
    if not isinstance(entries, Mapping):
      raise UserError(f"XLA_FLAGS_OVERRIDES[{key!r}] must be a dict of flag -> value.")
    for name, value in entries.items():
      out[str(name).lstrip("-")] = None if value is None else _flag_value(value)
  return out


def preset(platform_name: str, multislice: bool) -> tuple[dict[str, str], dict[str, str]]:
  """(flags, other environment variables) paxlike starts from on a platform."""
  if platform_name == "gpu":
    return dict(GPU_PRESET), dict(GPU_ENV)
  if platform_name == "tpu":
    flags = dict(TPU_PRESET)
    if multislice:
      flags.update(TPU_MULTISLICE)
    return flags, {}
  return dict(CPU_PRESET), {}


def profile_flags(platform_name: str, profiling: bool) -> dict[str, str]:
  """The flags a run that traces steps (--profile_steps) adds on platform_name.

  On a GPU ('gpu', 'cuda', 'rocm'): command buffers off. XLA runs fusions
  inside CUDA graphs, and a trace of a graph shows one `command_buffer_N`
  event instead of the kernels in it. Elsewhere: none.
  """
  if profiling and _PLATFORM_ALIASES.get(platform_name, platform_name) == "gpu":
    return dict(PROFILE_GPU_FLAGS)
  return {}


@dataclasses.dataclass
class Resolution:
  """What configure() decided; `record()` is what run_env.json keeps."""

  platform: str
  platform_rule: str
  flags_var: str
  flags: dict[str, str | None]
  sources: dict[str, str]  # flag -> preset | experiment | pgle | user
  env: dict[str, str]  # every variable configure() set, with its final value
  pgle: pgle.PglePlan
  late: bool = False  # the backend had started already: the flags came too late
  notes: list[str] = dataclasses.field(default_factory=list)  # why a flag is what it is

  def record(self) -> dict[str, Any]:
    return {
        "platform_detected": self.platform,
        "platform_rule": self.platform_rule,
        "xla_flags_var": self.flags_var,
        "xla_flags_resolved": [{"flag": k, "value": v, "source": self.sources[k]}
                               for k, v in sorted(self.flags.items())],
        "env_set": dict(sorted(self.env.items())),
        "pgle": self.pgle.record(),
        "flags_set_after_backend_start": self.late,
        "xla_flag_notes": list(self.notes),
    }

  def summary(self) -> str:
    counts: dict[str, int] = {}
    for s in self.sources.values():
      counts[s] = counts.get(s, 0) + 1
    by = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"
    return (f"xla flags for {self.platform} ({self.platform_rule}): "
            f"{self.flags_var}='{self.env.get(self.flags_var, '')}' [{by}]; "
            f"pgle={self.pgle.mode}: {self.pgle.note}")


def resolve(exp: Any, platform_name: str, platform_rule: str = "given",
            pgle_plan: pgle.PglePlan | None = None,
            environ: Mapping[str, str] | None = None, profiling: bool = False) -> Resolution:
  """Merges preset < experiment < PGLE < user environment; touches nothing.

  profiling: the run traces steps (--profile_steps); on a GPU its command
  buffers are turned off unless the experiment or the user set that flag.
  """
  environ = os.environ if environ is None else environ
  flags_var = FLAGS_VAR.get(platform_name, "XLA_FLAGS")
  dcn = getattr(exp, "DCN_MESH_SHAPE", None) or []
  multislice = _product(dcn) > 1
  base, extra_env = preset(platform_name, multislice)
  plan = pgle_plan or pgle.plan("off", platform_name)
  flags: dict[str, str | None] = {}
  sources: dict[str, str] = {}

  def apply(layer: Mapping[str, str | None], source: str, removable: bool = False) -> None:
    for name, value in layer.items():
      if value is None and removable:
        flags.pop(name, None)
        sources.pop(name, None)
      else:
        flags[name] = value
        sources[name] = source

  apply(base, "preset")
  exp_flags = experiment_flags(exp, platform_name)
  apply(exp_flags, "experiment", removable=True)
  profiled = profile_flags(platform_name, profiling)
  apply({k: v for k, v in profiled.items() if k not in exp_flags}, "profile")
  apply(plan.xla_flags, "pgle")
  apply(parse_flags(environ.get(flags_var, "")), "user")
  notes = []
  for name in profiled:
    if sources.get(name) in ("profile", "pgle"):
      notes.append(PROFILE_NOTE)
    else:  # the experiment's or the user's own value is kept
      value = f"--{name}" if flags.get(name) is None else f"--{name}={flags[name]}"
      notes.append(f"--profile_steps: kept {value} (set by the {sources.get(name, 'user')}); "
                   "if it leaves CUDA graphs on, the profile names command_buffer_N, not ops")

  env = {flags_var: format_flags(flags)}
  for var, value in {**extra_env, **plan.env}.items():
    env[var] = environ.get(var, value)  # a variable the user exported wins
  return Resolution(platform_name, platform_rule, flags_var, flags, sources, env, plan,
                    notes=notes)


def _product(shape: Any) -> int:
  n = 1
  for d in shape or []:
    n *= int(d)
  return n


def configure(exp: Any, pgle_mode: str = "off", job_log_dir: str | None = None,
              pgle_profile_path: str | None = None, pgle_profiling_runs: int | None = None,
              pgle_aggregation_percentile: int | None = None,
              profiling: bool = False) -> Resolution:
  """Detects the platform, merges flags, sets the environment and JAX's PGLE config.

  Call before anything starts a JAX backend (jax.devices(), distributed
  initialisation, the first jit). Logs one line with everything resolved,
  and one per note (a profiled GPU run's command buffers).

  Raises:
    UserError: a bad --pgle setting, a missing profile for --pgle=use, or
      malformed XLA_FLAGS_OVERRIDES / exported flags.
  """
  platform_name, rule = detect_platform()
  plan = pgle.plan(
      pgle_mode, platform_name, job_log_dir=job_log_dir, profile_path=pgle_profile_path,
      profiling_runs=(pgle_profiling_runs if pgle_profiling_runs is not None
                      else getattr(exp, "PGLE_PROFILING_RUNS", None)),
      aggregation_percentile=(pgle_aggregation_percentile
                              if pgle_aggregation_percentile is not None
                              else getattr(exp, "PGLE_AGGREGATION_PERCENTILE", None)))
  res = resolve(exp, platform_name, rule, plan, profiling=profiling)
  res.late = backend_started()
  if res.late:
    logging.warning("XLA flags were set after a JAX backend started in this process; "
                    "they take effect only in a new process")
  os.environ.update(res.env)
  plan.apply_jax_config()
  logging.info("%s", res.summary())
  for note in res.notes:
    logging.info("%s", note)
  return res


# ------------------------------------------------------------------- run_env


def run_env(extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """Platform, devices, versions and flags; starts the JAX backend."""
  import jax

  devices = jax.devices()
  env = {
      "platform": devices[0].platform,
      "device_kind": devices[0].device_kind,
      "device_count": jax.device_count(),
      "local_device_count": jax.local_device_count(),
      "process_index": jax.process_index(),
      "process_count": jax.process_count(),
      "host": socket.gethostname(),
      "python": sys.version.split()[0],
      "machine": platform.machine(),
      "jax_version": jax.__version__,
      "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
      "LIBTPU_INIT_ARGS": os.environ.get("LIBTPU_INIT_ARGS", ""),
  }
  env.update(extra or {})
  return env


TRAINING_RUN_ENV = "run_env.json"  # a training run's record; other modes' are <mode>_run_env.json
_RUN_ENV = [TRAINING_RUN_ENV]  # this process's record: <mode>_run_env.json outside training


def training_run_env(job_log_dir: str) -> dict[str, Any] | None:
  """The record of the job's last training run (its run_env.json): None when there is no
  readable one, {} when it holds no JSON object."""
  try:
    with open(os.path.join(job_log_dir, TRAINING_RUN_ENV)) as f:
      env = json.load(f)
  except (OSError, ValueError):
    return None
  return env if isinstance(env, dict) else {}


def set_run_env_name(name: str) -> None:
  """The file write_run_env and update_run_env write (main: per mode)."""
  _RUN_ENV[0] = name


def write_run_env(job_log_dir: str, env: dict[str, Any]) -> None:
  """Writes the run's record whole (files.write_atomic): a run killed while it writes, at
  the end of a preemption's grace period, leaves the previous record, not a torn one."""
  from paxlike import files

  files.write_atomic(os.path.join(job_log_dir, _RUN_ENV[0]),
                     json.dumps(env, indent=2, sort_keys=True, default=str) + "\n")


def update_run_env(job_log_dir: str, extra: dict[str, Any]) -> None:
  """Adds keys to an existing run_env.json (what is known only after it was written)."""
  path = os.path.join(job_log_dir, _RUN_ENV[0])
  try:
    with open(path) as f:
      env = json.load(f)
  except (OSError, ValueError):
    env = {}
  env.update(extra)
  write_run_env(job_log_dir, env)
