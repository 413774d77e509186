"""A jax.profiler trace of a few training steps, and a summary anyone can read.

`--profile_steps=N` (or the experiment's PROFILER_NUM_STEPS) captures steps
start .. start + N - 1 into job_log_dir/profile/ with jax.profiler: the
plugins/profile/<run>/ folder TensorBoard's profile plugin reads, whose
*.trace.json.gz also opens in Perfetto (ui.perfetto.dev). Each profiled
step runs inside a StepTraceAnnotation and is waited for, so the trace's
step markers hold the device's work. The compiled step's HLO is written
beside it (profile/step.hlo.txt): the summary's fusion names are defined there.

Then the trace's Chrome-format JSON (written on every backend; no
TensorFlow needed) is parsed into profile/summary.json and a few log lines:
per step, the milliseconds spent in GEMMs, attention, other fused ops,
collectives and host gaps (the step's wall time minus the time some device
op ran), and the kernels that took the most time.

Which events are device work: on a GPU/TPU, the events of the /device:*
processes (the "Stream #..." lines on a GPU, where the derived "XLA Ops"
lines would count them twice); on a CPU, the XLA runtime's thunk events
(they carry an `hlo_op` argument). Names are classified by substrings, see
CATEGORIES; on a CPU, fusions whose HLO holds a dot count as GEMMs when
the compiled step's HLO text is given.

On a GPU, XLA runs fusions inside CUDA graphs (command buffers), and a trace
shows a graph as one `command_buffer_N` event, not the ops inside it; so a
run with profile steps turns command buffers off (paxlike.xla_flags
.profile_flags, recorded in run_env.json). Where the user's own XLA flags
keep them on, the summary says so.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
import re
from collections.abc import Callable, Iterable
from typing import Any

from paxlike import log as logging
from paxlike.errors import UserError

SUMMARY_FILE = "summary.json"
HLO_FILE = "step.hlo.txt"  # the compiled step's HLO: what each fusion in the summary holds
# Order matters: the first category whose pattern matches an op's names wins.
CATEGORIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("collectives", re.compile(r"all[-_]?reduce|all[-_]?gather|reduce[-_]?scatter"
                               r"|all[-_]?to[-_]?all|collective[-_]?permute|nccl"
                               r"|\bsend\b|\brecv\b", re.I)),
    ("attention", re.compile(r"fmha|flash|attention|attn|sdpa", re.I)),
    ("gemm", re.compile(r"gemm|matmul|dot|cublas|nvjet|cutlass|xmma|convolution|conv\b", re.I)),
)
OTHER = "other_ops"
STEP_KEYS = ("gemm", "attention", OTHER, "collectives", "host_gap")


@dataclasses.dataclass(frozen=True)
class ProfilePlan:
  """Which training steps to trace (1-based step numbers, as in the logs)."""

  start_step: int
  num_steps: int
  start_given: bool = True  # False: the default start, which fit() moves to the run's steps
  source: str = dataclasses.field(default="--profile_steps", compare=False)  # or the knob

  @property
  def last_step(self) -> int:
    return self.start_step + self.num_steps - 1

  def fit(self, first: int, last: int) -> ProfilePlan | None:
    """The plan for a run of steps first..last (a resumed run starts past step 1).

    The default start is the run's third step, earlier when the run is too short for
    all the steps asked; a start the user gave that traces none of the run's steps is
    refused when a flag gave it (an experiment's PROFILER_* knobs get a warning).

    Raises:
      UserError: --profile_steps / --profile_start_step trace no step of this run.
    """
    if not self.start_given:
      start = min(first + 2, max(first, last - self.num_steps + 1))
      return dataclasses.replace(self, start_step=start, start_given=True,
                                 num_steps=min(self.num_steps, last - start + 1))
    if self.start_step <= last and self.last_step >= first:  # the steps the run has
      return dataclasses.replace(self, num_steps=min(self.last_step, last) - self.start_step + 1)
    what = (f"{self.source}={self.num_steps} from step {self.start_step} traces steps "
            f"{self.start_step}..{self.last_step}, and this run trains steps {first}..{last}")
    if self.source.startswith("--"):
      raise UserError(f"{what}; pass --profile_start_step between {first} and {last} (or drop "
                      "it: the trace then starts at the run's third step).")
    logging.warning("profile: %s; no trace is written.", what)
    return None


def make_plan(flag_steps: int | None, flag_start: int | None, exp: Any = None
              ) -> ProfilePlan | None:
  """The plan from the flags, else the experiment's PROFILER_NUM_STEPS / PROFILER_CAPTURE_STEP.

  The default start is step 3: step 1 compiles, step 2 still warms caches up.

  Raises:
    UserError: a negative step count or a start step below 1.
  """
  steps = flag_steps if flag_steps is not None else getattr(exp, "PROFILER_NUM_STEPS", None)
  start = flag_start if flag_start is not None else (
      getattr(exp, "PROFILER_CAPTURE_STEP", None) or None)
  source = "--profile_steps" if flag_steps is not None else "PROFILER_NUM_STEPS"
  if steps is not None and (not isinstance(steps, int) or steps < 0):
    raise UserError(f"{source} must be a non-negative number of steps, got {steps!r}.")
  if start is not None and (not isinstance(start, int) or start < 1):
    what = "--profile_start_step" if flag_start is not None else "PROFILER_CAPTURE_STEP"
    raise UserError(f"{what} must be a step number of at least 1, got {start!r}.")
  if not steps:
    if flag_start is not None:
      raise UserError(f"--profile_start_step={flag_start} starts a trace that nothing asks "
                      "for; add --profile_steps=N (or set PROFILER_NUM_STEPS).")
    return None
  return ProfilePlan(start_step=start or 3, num_steps=steps, start_given=start is not None,
                     source=source)


class StepProfiler:
  """Starts the trace before the plan's first step, stops and summarises after its last."""

  def __init__(self, plan: ProfilePlan | None, job_log_dir: str, enabled: bool = True) -> None:
    self.plan = plan if enabled else None
    self.out_dir = os.path.join(job_log_dir, "profile")
    self._active = False
    self._annotation: Any = None
    self.summary: dict[str, Any] | None = None
    self.hlo_text: str | None = None  # the compiled step's HLO, to spot dots inside fusions

  def wants(self, step: int) -> bool:
    """Whether training step `step` (about to run) is traced."""
    p = self.plan
    return p is not None and p.start_step <= step <= p.last_step

  def before_step(self, step: int, hlo_text: Callable[[], str] | None = None) -> None:
    """Call before dispatching training step `step`.

    hlo_text: gives the compiled step's HLO text, asked once before tracing
    starts; it tells which fusions hold a dot (their names alone may not).
    """
    import jax

    if not self.wants(step):
      return
    if not self._active:
      if hlo_text is not None:
        try:
          self.hlo_text = hlo_text()
        except Exception as e:  # noqa: BLE001  (the summary only loses the fused-dot names)
          logging.info("profile: no HLO text of the step (%s); fusions count by name only", e)
      os.makedirs(self.out_dir, exist_ok=True)
      if self.hlo_text:
        with open(os.path.join(self.out_dir, HLO_FILE), "w") as f:
          f.write(self.hlo_text)
      try:
        jax.profiler.start_trace(self.out_dir)
      except RuntimeError as e:  # another trace (--pgle=collect) holds the profiler
        logging.warning("profile: not captured, the profiler is busy (%s)", e)
        self.plan = None
        return
      self._active = True
      logging.info("profile: tracing steps %d..%d into %s", step, self.plan.last_step,
                   self.out_dir)
    self._annotation = jax.profiler.StepTraceAnnotation("train", step_num=step)
    self._annotation.__enter__()

  def after_step(self, step: int, outputs: Any, last_step: bool = False) -> None:
    """Call after dispatching step `step` with its outputs; waits for them while tracing."""
    import jax

    if not self._active or self._annotation is None:
      return
    jax.block_until_ready(outputs)
    self._annotation.__exit__(None, None, None)
    self._annotation = None
    if step >= self.plan.last_step or last_step:
      self.finish()

  def finish(self) -> None:
    """Stops a running trace and writes the summary (also when training ends early)."""
    import jax

    if not self._active:
      return
    if self._annotation is not None:
      self._annotation.__exit__(None, None, None)
      self._annotation = None
    jax.profiler.stop_trace()
    self._active = False
    trace = latest_trace(self.out_dir)
    if trace is None:
      logging.warning("profile: the trace in %s holds no .trace.json.gz to summarise",
                      self.out_dir)
      return
    self.summary = summarize(load_trace(trace), fused_dots(self.hlo_text))
    self.summary["trace"] = os.path.relpath(trace, self.out_dir)
    with open(os.path.join(self.out_dir, SUMMARY_FILE), "w") as f:
      json.dump(self.summary, f, indent=2)
    for line in format_summary(self.summary):
      logging.info("profile: %s", line)
    if graphs := command_buffers(self.summary):
      logging.warning("profile: %d of the top ops are CUDA graphs (%s), not ops: run with "
                      "--xla_gpu_enable_command_buffer= (empty) in XLA_FLAGS to see inside "
                      "them", len(graphs), ", ".join(graphs[:3]))


def latest_trace(profile_dir: str) -> str | None:
  """The newest plugins/profile/<run>/*.trace.json.gz under profile_dir."""
  found = glob.glob(os.path.join(profile_dir, "plugins", "profile", "*", "*.trace.json.gz"))
  return max(found, key=os.path.getmtime) if found else None


def load_trace(path: str) -> dict[str, Any]:
  with gzip.open(path, "rt") as f:
    return json.load(f)


def fused_dots(hlo_text: str | None) -> set[str]:
  """Names of the fusions / calls in an HLO module's text whose computation holds a dot."""
  if not hlo_text:
    return set()
  with_dot: set[str] = set()
  computation, holds_dot = None, False
  computations: dict[str, bool] = {}
  for line in hlo_text.splitlines():
    head = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
    if head and not line.startswith(" "):
      computation, holds_dot = head.group(1), False
      continue
    if computation and re.search(r"\s(dot|convolution)\(", line):
      holds_dot = True
    if computation and line.startswith("}"):
      computations[computation] = holds_dot
      computation = None
  for m in re.finditer(r"%?([\w.\-]+) = [^\n]*?\b(?:fusion|call)\([^\n]*?"
                       r"(?:calls|to_apply)=%?([\w.\-]+)", hlo_text):
    if computations.get(m.group(2)):
      with_dot.add(m.group(1))
  return with_dot


def op_name(hlo_op: str) -> str:
  """The HLO op an event belongs to: a copy XLA made of a loop body's op counts as the op.

  XLA's GPU while-loop double buffering (--xla_gpu_enable_while_loop_double_buffering,
  a preset flag) unrolls a scanned stack's body twice, naming the second copy's ops
  `<op>.double_buffer_clone`; both halves are one op of the user's program.
  """
  return hlo_op.removesuffix(".double_buffer_clone")


def classify(names: Iterable[str], dot_fusions: set[str] = frozenset()) -> str:
  """The category of a device op from its kernel / HLO op names."""
  names = [n for n in names if n]
  for category, pattern in CATEGORIES:
    if any(pattern.search(n) for n in names):
      return category
  if any(n in dot_fusions for n in names):
    return "gemm"
  return OTHER


def _device_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """The complete ('X') events that are device work, see the module docstring."""
  process, thread = {}, {}
  for e in events:
    if e.get("ph") != "M":
      continue
    name = (e.get("args") or {}).get("name", "")
    if e.get("name") == "process_name":
      process[e.get("pid")] = name
    elif e.get("name") == "thread_name":
      thread[(e.get("pid"), e.get("tid"))] = name
  complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
  device_pids = {p for p, n in process.items() if n.startswith("/device:")}
  if device_pids:
    streams = {k for k, n in thread.items() if k[0] in device_pids and n.startswith("Stream")}
    ops_lines = {k for k, n in thread.items() if k[0] in device_pids and n == "XLA Ops"}
    keep = streams or ops_lines
    if keep:
      return [e for e in complete if (e.get("pid"), e.get("tid")) in keep]
    return [e for e in complete if e.get("pid") in device_pids]
  # CPU: the XLA runtime's thunks, one event per executed HLO op.
  return _leaves([e for e in complete if "hlo_op" in (e.get("args") or {})
                  and not e["name"].startswith("end:")])


def _leaves(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """The events that hold no other event of their thread (a while loop holds its body's ops)."""
  by_thread: dict[Any, list[dict[str, Any]]] = {}
  for e in events:
    by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
  leaves = []
  for thread_events in by_thread.values():
    thread_events.sort(key=lambda e: (e["ts"], -e["dur"]))
    open_events: list[dict[str, Any]] = []
    parents = set()
    for e in thread_events:
      while open_events and open_events[-1]["ts"] + open_events[-1]["dur"] <= e["ts"]:
        open_events.pop()
      if open_events:
        parents.add(id(open_events[-1]))
      open_events.append(e)
    leaves.extend(e for e in thread_events if id(e) not in parents)
  return leaves


def _busy(intervals: list[tuple[float, float]]) -> float:
  """Total length of the union of [start, end) intervals."""
  total, cur_start, cur_end = 0.0, None, None
  for start, end in sorted(intervals):
    if cur_end is None or start > cur_end:
      if cur_end is not None:
        total += cur_end - cur_start
      cur_start, cur_end = start, end
    else:
      cur_end = max(cur_end, end)
  if cur_end is not None:
    total += cur_end - cur_start
  return total


def summarize(trace: dict[str, Any], dot_fusions: set[str] = frozenset(), top: int = 10
              ) -> dict[str, Any]:
  """Per-step milliseconds by category and the top ops, from a Chrome-format trace.

  Steps are the StepTraceAnnotation markers ("train" events with a step_num);
  a step's window runs from its marker's start to the next step's (the last
  step's ends with its marker), so host work between steps is in its gap.
  Ops overlapping in time (several streams, CPU threads) are each counted in
  their category; the host gap is the window minus the union of op times.
  """
  events = trace.get("traceEvents", [])
  markers = sorted((e for e in events if e.get("ph") == "X" and "step_num" in
                    (e.get("args") or {})), key=lambda e: e["ts"])
  ops = _device_events(events)
  windows = []
  for i, m in enumerate(markers):
    end = markers[i + 1]["ts"] if i + 1 < len(markers) else m["ts"] + m["dur"]
    windows.append((int(m["args"]["step_num"]), m["ts"], end))
  steps, kernels = [], {}
  for step, start, end in windows:
    times = dict.fromkeys(STEP_KEYS, 0.0)
    spans = []
    for e in ops:
      s, f = max(e["ts"], start), min(e["ts"] + e["dur"], end)
      if f <= s:
        continue
      args = e.get("args") or {}
      names = (e["name"], args.get("hlo_op", ""), args.get("long_name", ""))
      category = classify(names, dot_fusions)
      times[category] += f - s
      spans.append((s, f))
      key = op_name(args.get("hlo_op") or e["name"])
      k = kernels.setdefault(key, {"name": key, "by_category": {}, "count": 0})
      k["by_category"][category] = k["by_category"].get(category, 0.0) + (f - s)
      k["count"] += 1
    wall = end - start
    times["host_gap"] = max(wall - _busy(spans), 0.0)
    steps.append({"step": step, "wall_ms": round(wall / 1e3, 4),
                  **{f"{k}_ms": round(v / 1e3, 4) for k, v in times.items()}})
  n = max(len(steps), 1)
  mean = {k: round(sum(s[k] for s in steps) / n, 4) for k in (steps[0] if steps else {})
          if k != "step"}
  ranked = sorted(kernels.values(), key=lambda k: -sum(k["by_category"].values()))[:top]
  for k in ranked:
    # An op's kernels can differ (a cuBLAS call's memset, then its GEMM): the most time decides.
    by_category = k.pop("by_category")
    k["category"] = max(by_category, key=by_category.get)
    k["ms_per_step"] = round(sum(by_category.values()) / 1e3 / n, 4)
  return {"steps": steps, "mean": mean, "top_ops": ranked, "num_device_events": len(ops)}


def command_buffers(summary: dict[str, Any]) -> list[str]:
  """The summary's top ops that are whole CUDA graphs (command_buffer_N), not ops."""
  return [k["name"] for k in summary.get("top_ops", []) if "command_buffer" in k["name"]]


def format_summary(summary: dict[str, Any]) -> list[str]:
  """A few readable lines: the mean step's split and the top ops."""
  mean = summary.get("mean") or {}
  if not summary.get("steps"):
    return ["no step markers in the trace"]
  wall = mean.get("wall_ms", 0.0) or 1e-9
  parts = ", ".join(f"{k.replace('_', ' ')} {mean[k + '_ms']:.2f} ms "
                    f"({100 * mean[k + '_ms'] / wall:.0f}%)" for k in STEP_KEYS)
  lines = [f"{len(summary['steps'])} steps, mean {wall:.2f} ms: {parts}"]
  for k in summary.get("top_ops", [])[:5]:
    lines.append(f"  {k['ms_per_step']:8.3f} ms/step  {k['category']:<11} {k['name']}")
  return lines
