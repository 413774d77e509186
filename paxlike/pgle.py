"""Profile-guided latency estimation (PGLE): the --pgle modes.

XLA's GPU latency-hiding scheduler orders collectives and compute by an
estimate of each instruction's latency; PGLE replaces the estimate with
latencies measured on a real run. Modes:

- off:     nothing.
- auto:    JAX's automatic PGLE: the jitted step runs PGLE_PROFILING_RUNS
           times under the profiler, then JAX recompiles it with the
           profile (aggregated at PGLE_AGGREGATION_PERCENTILE). Works only
           for steps dispatched through jit, never for `.lower().compile()`.
- collect: run a few steps under jax.profiler, convert the trace with
           jax.experimental.profiler.get_profiled_instructions_proto and save
           job_log_dir/pgle/profile.pb.
- use:     compile with --xla_gpu_pgle_profile_file_or_directory_path pointing
           at a profile (default: the one `collect` left in job_log_dir).

Only XLA's GPU compiler consumes these profiles. On CPU and TPU a mode is
recorded as ineffective and said so, never faked.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Callable
from typing import Any

from paxlike import files
from paxlike import log as logging
from paxlike.errors import UserError

MODES = ("off", "auto", "collect", "use")
PROFILE_RELPATH = os.path.join("pgle", "profile.pb")
TRACE_RELPATH = os.path.join("pgle", "trace")
DEFAULT_PROFILING_RUNS = 3
DEFAULT_AGGREGATION_PERCENTILE = 90  # JAX's default
LHS_FLAG = "xla_gpu_enable_latency_hiding_scheduler"
PROFILE_FLAG = "xla_gpu_pgle_profile_file_or_directory_path"


@dataclasses.dataclass
class PglePlan:
  """What a --pgle mode does on a platform."""

  mode: str
  platform: str
  effective: bool  # whether XLA on this platform will use what the mode produces
  note: str  # one line: what happens, or why nothing does
  xla_flags: dict[str, str] = dataclasses.field(default_factory=dict)
  env: dict[str, str] = dataclasses.field(default_factory=dict)
  jax_config: dict[str, Any] = dataclasses.field(default_factory=dict)
  profile_path: str | None = None  # collect: where it goes; use: what is read
  trace_dir: str | None = None  # collect: where the raw profiler trace goes
  profiling_runs: int = DEFAULT_PROFILING_RUNS
  aggregation_percentile: int = DEFAULT_AGGREGATION_PERCENTILE

  def record(self) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(self).items() if v not in (None, {}, "")}

  def apply_jax_config(self) -> None:
    """Sets JAX's config (jax reads its JAX_* variables only at import)."""
    if not self.jax_config:
      return
    import jax

    for name, value in self.jax_config.items():
      jax.config.update(name, value)


def plan(mode: str, platform: str, job_log_dir: str | None = None,
         profile_path: str | None = None, profiling_runs: int | None = None,
         aggregation_percentile: int | None = None) -> PglePlan:
  """The flags, environment, JAX config and files of a mode on a platform.

  Raises:
    UserError: an unknown mode, bad numbers, or `use` without a readable profile.
  """
  if mode not in MODES:
    raise UserError(f"--pgle={mode} is not one of {', '.join(MODES)}.")
  runs = DEFAULT_PROFILING_RUNS if profiling_runs is None else int(profiling_runs)
  pct = DEFAULT_AGGREGATION_PERCENTILE if aggregation_percentile is None else int(
      aggregation_percentile)
  if runs < 1:
    raise UserError(f"PGLE profiling runs must be at least 1, got {runs}.")
  if not 0 <= pct <= 100:
    raise UserError(f"the PGLE aggregation percentile must be in [0, 100], got {pct}.")
  p = PglePlan(mode, platform, effective=False, note="off", profiling_runs=runs,
               aggregation_percentile=pct)
  if mode == "off":
    return p
  gpu = platform == "gpu"
  where = "" if gpu else (f"; PGLE does nothing on {platform}: only XLA's GPU compiler reads "
                          "instruction-latency profiles")
  if mode == "auto":
    if gpu:
      p.effective = True
      p.xla_flags = {LHS_FLAG: "true"}
      p.jax_config = {"jax_enable_pgle": True, "jax_pgle_profiling_runs": runs,
                      "jax_pgle_aggregation_percentile": pct}
      p.env = {"JAX_ENABLE_PGLE": "true", "JAX_PGLE_PROFILING_RUNS": str(runs),
               "JAX_PGLE_AGGREGATION_PERCENTILE": str(pct)}
      p.note = (f"auto: JAX profiles the jitted step {runs} times, then recompiles it with "
                f"the latencies at the {pct}th percentile")
    else:
      p.note = "auto requested, not enabled" + where
    return p
  if not job_log_dir and not profile_path:
    raise UserError(f"--pgle={mode} needs --job_log_dir or --pgle_profile_path.")
  default_profile = os.path.join(job_log_dir, PROFILE_RELPATH) if job_log_dir else None
  if mode == "collect":
    p.profile_path = os.path.abspath(profile_path or default_profile)
    p.trace_dir = os.path.join(os.path.dirname(p.profile_path), "trace")
    if gpu:
      p.effective = True
      # The profiler cannot time kernels inside CUDA graphs (JAX does the same, b/376647494).
      p.xla_flags = {LHS_FLAG: "true", "xla_gpu_enable_command_buffer": ""}
      p.note = f"collect: {runs} steps under the profiler -> {p.profile_path}"
    else:
      p.note = (f"collect: {runs} steps are traced into {p.trace_dir}, but no profile.pb is "
                "written" + where)
    return p
  # use
  path = os.path.abspath(profile_path or default_profile)
  if not os.path.exists(path):
    how = ("run with --pgle=collect on a GPU first" if not profile_path
           else "pass the profile.pb that --pgle=collect wrote")
    raise UserError(f"--pgle=use: no PGLE profile at {path}; {how}.")
  if os.path.isfile(path) and os.path.getsize(path) == 0:
    raise UserError(f"--pgle=use: the PGLE profile {path} is empty; collect it on a GPU "
                    "with --pgle=collect.")
  p.profile_path = path
  if gpu:
    p.effective = True
    p.xla_flags = {LHS_FLAG: "true", PROFILE_FLAG: path}
    p.note = f"use: the latency-hiding scheduler reads {path}"
  else:
    p.note = f"use: {path} found, not passed to XLA" + where
  return p


def auto_active(p: PglePlan | None) -> bool:
  """Whether JAX's auto PGLE is on (it must see every compilation of the step)."""
  return p is not None and p.mode == "auto" and p.effective


def check_dispatch(step_fn: Any, p: PglePlan) -> None:
  """Auto PGLE recompiles only jit-dispatched steps: warn loudly about anything else."""
  if not auto_active(p):
    return
  if getattr(step_fn, "jitted", None) is None or hasattr(step_fn, "runtime_executable"):
    logging.warning(
        "!!! --pgle=auto is ON but the train step is ahead-of-time compiled "
        "(.lower().compile()); JAX cannot recompile it with the profile, so PGLE will "
        "NOT take effect. Dispatch the step through jax.jit instead. !!!")


def _latest_run_dir(trace_dir: str) -> str | None:
  runs = sorted(glob.glob(os.path.join(trace_dir, "plugins", "profile", "*")),
                key=os.path.getmtime)
  return runs[-1] if runs else None


def default_converter(run_dir: str) -> bytes:
  from jax.experimental import profiler as jax_profiler

  return jax_profiler.get_profiled_instructions_proto(run_dir)


class Collector:
  """--pgle=collect: wraps the step so that calls [start, start + runs) are traced.

  The first call (compilation) is skipped. After the last traced call the
  outputs are waited for, the trace is converted and profile.pb written.
  """

  def __init__(self, p: PglePlan, start_call: int = 1,
               converter: Callable[[str], bytes] = default_converter) -> None:
    self.plan = p
    self.start_call = start_call
    self.converter = converter
    self.calls = 0
    self.tracing = False
    self.done = False
    self.profile_written: str | None = None

  def wrap(self, step_fn: Callable) -> Callable:
    def traced(*args):
      if not self.done and self.calls == self.start_call:
        self._start()
      out = step_fn(*args)
      self.calls += 1
      if self.tracing and self.calls >= self.start_call + self.plan.profiling_runs:
        self._stop(out)
      return out

    for attr in ("jitted", "lower"):
      if hasattr(step_fn, attr):
        setattr(traced, attr, getattr(step_fn, attr))
    return traced

  def _start(self) -> None:
    import jax

    os.makedirs(self.plan.trace_dir, exist_ok=True)
    jax.profiler.start_trace(self.plan.trace_dir)
    self.tracing = True

  def _stop(self, outputs: Any) -> None:
    import jax

    jax.block_until_ready(outputs)
    jax.profiler.stop_trace()
    self.tracing, self.done = False, True
    run_dir = _latest_run_dir(self.plan.trace_dir)
    data = self.converter(run_dir) if run_dir else b""
    traced = self.calls - self.start_call
    if not data:
      logging.info("pgle collect: traced %d steps into %s; the trace holds no GPU kernel "
                   "latencies (%s), so no profile.pb was written", traced,
                   self.plan.trace_dir, self.plan.platform)
      return
    os.makedirs(os.path.dirname(self.plan.profile_path), exist_ok=True)
    files.write_atomic(self.plan.profile_path, data)
    self.profile_written = self.plan.profile_path
    logging.info("pgle collect: %d steps profiled -> %s (%d bytes); rerun with --pgle=use",
                 traced, self.plan.profile_path, len(data))

  def close(self) -> None:
    """Ends a trace the run finished too early to complete."""
    if self.tracing:
      logging.warning("pgle collect: the run ended after %d of %d profiled steps",
                      self.calls - self.start_call, self.plan.profiling_runs)
      self._stop(None)
    elif not self.done:
      logging.warning("pgle collect: the run ended before the first profiled step; "
                      "no profile written (raise NUM_TRAIN_STEPS)")


def prepare_step(step_fn: Callable, p: PglePlan | None) -> tuple[Callable, Collector | None]:
  """The step the trainer should call under a plan, and the collector to close (collect)."""
  if p is None:
    return step_fn, None
  check_dispatch(step_fn, p)
  if p.mode != "collect":
    return step_fn, None
  collector = Collector(p)
  return collector.wrap(step_fn), collector
