"""--mode=tune: the fastest step layout that fits this machine's devices, measured.

Which step layout is fastest (a scanned or unrolled layer stack, which remat
policy, the batch in microbatches) depends on the model, the batch and the
device, and no rule predicts it (../shared/GPU_FACTS.md: the scan wins for
FlanT5Base, loses for the 1B LM). So each candidate is compiled for this
machine's devices; its compiled peak per device is compared with the
device's usable memory (--device_memory_gib, else what the accelerator
reports; a CPU has no limit); the ones that fit are timed in turns (rounds
in a shuffled order, then the reverse, so a machine's drift hits them all
alike: time_interleaved), and their median step time kept. The table is printed
and written to job_log_dir/tune/ (tune.json, tune.txt).

Only the knobs neither the user's own classes nor --set chose are varied; a
later `--mode=train` in that job_log_dir takes the winner's values for those
knobs (apply_winner) and run_env.json says which layout ran and why.

`--mode=dry_run --dry_run_layouts` sweeps the same candidates without
timing them (`untimed_table`): each is compiled as the dry run compiles its
step (on the CPU, for the experiment's mesh) and its memory per device
compared with the dry run's target; the table goes to job_log_dir/dry_run/.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from paxlike import log as logging
from paxlike.errors import UserError

# The knobs varied: USE_REPEATED_LAYER, CHECKPOINT_POLICY, and for a layout that does not
# fit whole the experiment's accumulation_knob(): NUM_MICROBATCHES, or a pipelined
# experiment's GRADIENT_ACCUMULATION_STEPS (its NUM_MICROBATCHES being the pipeline's).
ACCUMULATION_KNOBS = ("NUM_MICROBATCHES", "GRADIENT_ACCUMULATION_STEPS")
# The policies tried: from saving nothing (least memory) to saving everything (no remat).
POLICIES = ("SAVE_NOTHING", "SAVE_DOT_WITH_NO_BATCH_DIM", "SAVE_CONTEXT_AND_OUT_PROJ",
            "SAVE_EVERYTHING")
MICROBATCHES = (2, 4)  # tried for a layout that does not fit whole
# Timing: ROUNDS visits per candidate that fits (time_interleaved), each from a fresh
# state: WARMUP_PER_VISIT untimed steps, then timed ones until there are at least
# MIN_TIMED_PER_VISIT of them and they took VISIT_SECONDS (a CPU step of a small model
# varies by a third from one step to the next), at most MAX_TIMED_PER_VISIT.
ROUNDS, WARMUP_PER_VISIT = 4, 1
MIN_TIMED_PER_VISIT, MAX_TIMED_PER_VISIT, VISIT_SECONDS = 2, 50, 0.5
GIB = 1 << 30
TUNE_DIR = "tune"
RESULT = "tune.json"
DRY_RUN_DIR = "dry_run"  # the dry run's table of layouts: layouts.json, layouts.txt
DRY_RUN_TABLE = "layouts"


@dataclasses.dataclass
class Candidate:
  overrides: dict[str, Any]
  peak_bytes: int | None = None
  fits: bool | None = None
  step_seconds: float | None = None
  mfu: float | None = None
  error: str | None = None

  def label(self) -> str:
    o = self.overrides
    parts = []
    if "USE_REPEATED_LAYER" in o:
      parts.append("scanned" if o["USE_REPEATED_LAYER"] else "unrolled")
    if "CHECKPOINT_POLICY" in o:
      parts.append(o["CHECKPOINT_POLICY"])
    for knob in ACCUMULATION_KNOBS:
      if o.get(knob, 1) > 1:
        parts.append(f"{o[knob]} gradient-accumulation slices")
    return ", ".join(parts) or "as configured"


def user_set(exp: Any, name: str) -> bool:
  """Whether --set or a class of the user's own (not paxlike's, not shipped) sets name."""
  if name in exp.__dict__.get("_overrides", {}):
    return True
  for klass in type(exp).__mro__:
    module = klass.__module__ or ""
    if name in vars(klass) and not module.startswith(("paxlike.", "experiments.")):
      return True
  return False


def candidates(exp: Any) -> list[Candidate]:
  """The layouts to try: both stacks x every policy, for the knobs the user left free (and
  the model has: the MLP classifier has neither, and is tried as configured)."""
  def free(name: str) -> bool:
    return hasattr(type(exp), name) and not user_set(exp, name)

  layouts = [True, False] if free("USE_REPEATED_LAYER") else [None]
  policies = list(POLICIES) if free("CHECKPOINT_POLICY") else [None]
  out = []
  for repeated in layouts:
    for policy in policies:
      o = {}
      if repeated is not None:
        o["USE_REPEATED_LAYER"] = repeated
      if policy is not None:
        o["CHECKPOINT_POLICY"] = policy
      out.append(Candidate(o))
  return out


def device_budget(budget_gib: float | None) -> int | None:
  """Usable bytes per device: the flag, else the accelerator's limit, else None (a CPU)."""
  import jax

  if budget_gib is not None:
    return int(budget_gib * GIB)
  stats = getattr(jax.local_devices()[0], "memory_stats", lambda: None)()
  return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def variant(exp_cls: type, overrides: list[str], extra: dict[str, Any]) -> Any:
  """A new instance of the experiment with its --set overrides and extra knobs set."""
  from paxlike import experiment

  exp = experiment.instantiate(exp_cls, list(overrides))
  for name, value in extra.items():
    setattr(exp, name, value)
  return exp


def _program(exp_cls: type, overrides: list[str], extra: dict[str, Any],
             make_partitioner: Callable[[Any], Any]) -> tuple[Any, Any, Any]:
  """The train program of the experiment with extra knobs set, and its input."""
  import jax

  from paxlike import config, experiment, trainer

  exp = variant(exp_cls, overrides, extra)
  configs = experiment.build_checked(exp)
  task = config.build(configs.task)
  train_cfgs = [c for c in configs.datasets if getattr(c, "is_training", True)]
  if not train_cfgs:
    raise UserError(f"{exp_cls.__name__}.datasets() has no input with is_training=True.")
  train_input = config.build(train_cfgs[0])
  train_input.bind_host(jax.process_count(), jax.process_index())
  partitioner = make_partitioner(exp)
  return trainer.build_train_program(task, train_input, partitioner), train_input, exp


def _compile(c: Candidate, exp_cls: type, overrides: list[str], budget: int | None,
             make_partitioner: Callable[[Any], Any], peak_flops: Callable[[str], float | None],
             num_devices: int, time_it: bool, visits: dict[int, tuple[Callable, float | None]]
             ) -> None:
  """Compiles c's step for its memory per device; where it fits (and time_it), keeps in
  visits[id(c)] a visit function for time_interleaved (the executable just compiled: no
  second compile) and the seconds its step would take at the devices' peak FLOP/s."""
  import jax

  from paxlike import memory

  program, train_input, _ = _program(exp_cls, overrides, c.overrides, make_partitioner)
  batch = program.partitioner.shard_batch(train_input.get_next())
  key = jax.random.key(0)
  abstract_state = program.partitioner.abstract_state(program.abstract)
  compiled = program.step_fn.lower(abstract_state, batch, key).compile()
  c.peak_bytes = memory.step_peak_bytes(compiled)
  c.fits = budget is None or c.peak_bytes <= budget
  if not (c.fits and time_it):
    return

  def visit() -> list[float]:
    # A fresh state each visit, and none kept between visits: at most one candidate's
    # state is on the devices at a time, as in the run the table is for.
    state = program.init_state(0)
    times: list[float] = []
    for i in range(WARMUP_PER_VISIT + MAX_TIMED_PER_VISIT):
      t0 = time.perf_counter()
      state, metrics = compiled(state, batch, key)
      jax.block_until_ready(metrics)
      if i >= WARMUP_PER_VISIT:
        times.append(time.perf_counter() - t0)
        if len(times) >= MIN_TIMED_PER_VISIT and sum(times) >= VISIT_SECONDS:
          break
    return times

  flops = program.task.model.model_flops_per_step(program.global_specs)
  peak = peak_flops(program.task.model.compute_dtype())
  visits[id(c)] = (visit, flops / (num_devices * peak) if peak else None)


def time_interleaved(cands: list[Candidate], visit: Callable[[Candidate], list[float]],
                     rounds: int = ROUNDS, seed: int = 0) -> None:
  """Sets each candidate's step_seconds, timing them all in turns.

  Round r visits every candidate in a shuffled order, round r + 1 in the reverse order
  (A B C, C B A, A B C, ...); visit(c) runs some of c's steps and returns their times.
  A candidate's time is the median over its visits of each visit's median.
  A machine that speeds up or slows down while tuning (clocks, a neighbour's load) then
  moves every candidate alike: over an even number of rounds each candidate's middle
  visits sit, on average, at the same point of the run, so a drift that is linear in time
  cancels from the medians, where timing the candidates one after the other would hand
  the drift to whichever ran first.
  """
  order = list(cands)
  random.Random(seed).shuffle(order)  # no candidate always runs first (warm caches)
  per_visit: dict[int, list[float]] = {id(c): [] for c in cands}
  for r in range(rounds):
    for c in (order if r % 2 == 0 else order[::-1]):
      per_visit[id(c)].append(statistics.median(visit(c)))
  for c in cands:
    c.step_seconds = statistics.median(per_visit[id(c)])


def tune(exp: Any, overrides: list[str], job_log_dir: str, budget_gib: float | None,
         make_partitioner: Callable[[Any], Any], time_it: bool = True) -> list[Candidate]:
  """Compiles every candidate; times the ones that fit, in turns; writes job_log_dir/tune/."""
  import jax

  from paxlike import flops

  exp_cls = type(exp)
  budget = device_budget(budget_gib)
  # The device peak per compute dtype, resolved (on a CPU: calibrated) once, when first needed.
  peak = functools.cache(lambda dtype: flops.resolve_peak(jax.local_devices(), dtype, None)[0])
  visits: dict[int, tuple[Callable, float | None]] = {}
  cands = sweep(exp, functools.partial(
      _compile, exp_cls=exp_cls, overrides=overrides, budget=budget,
      make_partitioner=make_partitioner, peak_flops=peak, num_devices=jax.device_count(),
      time_it=time_it, visits=visits))
  timed = [c for c in cands if id(c) in visits]
  time_interleaved(timed, lambda c: visits[id(c)][0]())
  for c in timed:
    at_peak = visits[id(c)][1]
    c.mfu = at_peak / c.step_seconds if at_peak is not None else None
  _write(os.path.join(job_log_dir, TUNE_DIR), TUNE_DIR, cands, budget, time_it, _name(exp))
  return cands


def untimed_table(exp: Any, overrides: list[str], job_log_dir: str, budget: int,
                  peak_bytes: Callable[[Any], int],
                  configured_peak: int | None = None) -> list[Candidate]:
  """The dry run's table: every candidate's memory per device and whether it fits; no timing.

  Args:
    exp: the experiment (its candidates are the knobs its user left free).
    overrides: the run's --set values; each candidate is a new instance with them.
    job_log_dir: the table goes to job_log_dir/dry_run/layouts.{json,txt}.
    budget: usable bytes per device (the dry run's target).
    peak_bytes: compiles an experiment's train step and returns its peak bytes per device.
    configured_peak: the peak of exp's own layout, compiled already: the candidate
      with exp's own values is not compiled again.
  """
  def measure(c: Candidate) -> None:
    same = all(getattr(exp, k) == v for k, v in c.overrides.items())
    if same and configured_peak is not None:
      c.peak_bytes = configured_peak
    else:
      c.peak_bytes = peak_bytes(variant(type(exp), overrides, c.overrides))
    c.fits = c.peak_bytes <= budget

  cands = sweep(exp, measure)
  _write(os.path.join(job_log_dir, DRY_RUN_DIR), DRY_RUN_TABLE, cands, budget, False,
         _name(exp))
  return cands


def sweep(exp: Any, measure: Callable[[Candidate], None]) -> list[Candidate]:
  """Measures every candidate, in a shuffled order; one that does not fit is retried with
  the batch in gradient-accumulation slices (unless the user set the experiment's
  accumulation_knob()). Returns the candidates, retries last.
  """
  cands = candidates(exp)
  knob = exp.accumulation_knob()
  order = list(range(len(cands)))
  random.Random(0).shuffle(order)  # no candidate always runs first (warm caches, clocks)
  extra: list[Candidate] = []
  for i in order:
    c = cands[i]
    _try(c, measure)
    if c.fits is False and not user_set(exp, knob):
      for k in MICROBATCHES:
        m = Candidate({**c.overrides, knob: k})
        _try(m, measure)
        extra.append(m)
        if m.fits:
          break
  return cands + extra


def _try(c: Candidate, measure: Callable[[Candidate], None]) -> None:
  try:
    measure(c)
  except UserError as e:  # a layout this experiment cannot take (microbatches that do not divide)
    c.error = str(e)


def winner(cands: list[Candidate]) -> Candidate | None:
  timed = [c for c in cands if c.fits and c.step_seconds is not None]
  return min(timed, key=lambda c: c.step_seconds) if timed else None


def table(cands: list[Candidate], budget: int | None, timed: bool = True) -> str:
  """The markdown table: layout, GiB / device, fits (and step s, MFU when timed)."""
  best = winner(cands)
  columns = ["layout", "GiB / device", "fits"] + (["step s", "MFU"] if timed else [])
  rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  for c in cands:
    gib = f"{c.peak_bytes / GIB:.4g}" if c.peak_bytes is not None else "-"
    fits = "-" if c.fits is None else ("yes" if c.fits else "no")
    if c.error:
      fits = f"refused: {c.error}"
    step = f"{c.step_seconds:.4f}" if c.step_seconds is not None else "-"
    mfu = f"{100 * c.mfu:.2f}%" if c.mfu is not None else "-"
    mark = " (chosen)" if c is best else ""
    cells = [f"{c.label()}{mark}", gib, fits] + ([step, mfu] if timed else [])
    rows.append("| " + " | ".join(cells) + " |")
  limit = f"{budget / GIB:.4g} GiB usable per device" if budget else "no memory limit known"
  return "\n".join(rows) + f"\n\n{limit}\n"


def _name(exp: Any) -> str:
  """The experiment a table was measured for: its module and class."""
  return f"{type(exp).__module__}.{type(exp).__qualname__}"


def _write(out: str, name: str, cands: list[Candidate], budget: int | None,
           timed: bool, experiment: str) -> None:
  """out/<name>.json (every candidate, the winner) and out/<name>.txt (the table, printed)."""
  os.makedirs(out, exist_ok=True)
  best = winner(cands)
  record = {"experiment": experiment, "budget_bytes": budget, "timed": timed,
            "candidates": [dataclasses.asdict(c) for c in cands],
            "winner": dataclasses.asdict(best) if best else None}
  with open(os.path.join(out, f"{name}.json"), "w") as f:
    json.dump(record, f, indent=1)
  text = table(cands, budget, timed)
  with open(os.path.join(out, f"{name}.txt"), "w") as f:
    f.write(text)
  print(text, end="")
  if best:
    logging.info("tune: fastest layout that fits: %s (%.4f s a step); --mode=train in %s "
                 "takes it", best.label(), best.step_seconds, os.path.dirname(out))


def apply_winner(exp: Any, job_log_dir: str) -> dict[str, Any] | None:
  """Sets the tune winner's knobs the user did not set; returns what ran and why (or None)."""
  path = os.path.join(job_log_dir, TUNE_DIR, RESULT)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      record = json.load(f)
    best = record.get("winner")
  except (OSError, ValueError, AttributeError):
    raise UserError(f"{path} cannot be read as --mode=tune's table; run --mode=tune again, or "
                    "remove it to train without it.") from None
  if record.get("experiment", _name(exp)) != _name(exp):
    raise UserError(f"{path} was measured for {record['experiment']}, not {_name(exp)}; train "
                    "this experiment in its own --job_log_dir (or tune it there first).")
  if not best:
    return None
  applied, kept = {}, {}
  for name, value in best["overrides"].items():
    if user_set(exp, name):
      kept[name] = getattr(exp, name)
    else:
      setattr(exp, name, value)
      applied[name] = value
  why = (f"the fastest layout that fits in {os.path.join(TUNE_DIR, RESULT)} "
         f"({best['step_seconds']:.4f} s a step)")
  return {"applied": applied, "kept_as_set": kept, "why": why}
