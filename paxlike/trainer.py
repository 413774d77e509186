"""The training loop: cadence of steps, summaries and checkpoints.

The trainer does not know which model it trains nor how it is partitioned:
it drives a partitioner (spmd or pmap) through one interface.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import queue
import threading
import time
from typing import Any

import jax
import numpy as np

from paxlike import checkpoints as ckpt_lib
from paxlike import faults, flops, goodput, initial, nonfinite, pgle, preemption, resume, summaries
from paxlike import log as logging
from paxlike import profiler as prof_lib
from paxlike import train_state as ts
from paxlike.inputs.base_input import BaseInput, input_specs
from paxlike.steps import batch_shards, check_microbatches, make_train_step
from paxlike.task import Task


@dataclasses.dataclass
class TrainOptions:
  """Run-time switches that come from flags, not from the experiment."""

  enable_checkpoint_saving: bool = True
  async_checkpoint: bool = True
  enable_summary_writer: bool = True
  restore_checkpoint_dir: str | None = None
  restore_checkpoint_step: int | None = None
  checkpoint_format: str = "tensorstore"  # "msgpack": pmap's unreplicated default
  model_flops_per_step: float | None = None
  peak_flops_per_device: float | None = None
  measure_hardware_flops: bool = True  # HFU from the compiled step's cost analysis
  hardware_flops_per_step: float | None = None  # set by train() when measured
  goodput: goodput.Recorder | None = None  # None: a recorder started by train()
  pgle: pgle.PglePlan | None = None  # collect: the step runs under the profiler
  evaluator: Any = None  # paxlike.evaluator.Evaluator: eval (and decode) at intervals and end
  decode_during_train: bool = False  # also decode at every eval interval, not only at the end
  restore_fallback: bool = False  # a damaged checkpoint: move it aside, restore the step before
  init_from: initial.InitFrom | None = None  # with no checkpoint: start from these weights
  skip_nonfinite_steps: bool = False  # NaN/Inf loss or gradient: skip the update, don't stop
  profile: prof_lib.ProfilePlan | None = None  # trace these steps into job_log_dir/profile


@dataclasses.dataclass
class TrainResult:
  """What a run did, for callers and tests."""

  start_step: int
  final_step: int
  history: list[dict[str, float]]  # one entry per summary: step and scalars
  compile_seconds: float = 0.0
  state: Any = None
  goodput: dict[str, Any] | None = None  # goodput.Recorder.report()
  eval_metrics: dict[str, dict[str, float]] | None = None  # the final eval / decode
  stopped_by: str | None = None  # the signal that stopped the run early (preemption.py)


class Prefetcher:
  """Reads host batches on a thread, one step ahead of the device.

  Each item carries the input position after that batch, so a checkpoint of
  step s records exactly where the stream stands after s batches.
  """

  def __init__(self, inp: BaseInput, depth: int = 2) -> None:
    self._inp = inp
    self._q: queue.Queue = queue.Queue(maxsize=depth)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True, name="prefetch")
    self._thread.start()

  def _run(self) -> None:
    while not self._stop.is_set():
      try:
        item = (self._inp.get_next(), self._inp.get_state())
      except BaseException as e:  # noqa: BLE001  (re-raised in the consumer)
        item = e
      while not self._stop.is_set():
        try:
          self._q.put(item, timeout=0.1)
          break
        except queue.Full:
          continue
      if isinstance(item, BaseException):
        return

  def next(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    item = self._q.get()
    if isinstance(item, BaseException):
      raise item
    return item

  def close(self) -> None:
    self._stop.set()
    self._thread.join(timeout=5)


def global_input_specs(inp: BaseInput) -> dict[str, jax.ShapeDtypeStruct]:
  """The features of the global batch (per-host rows x infeed hosts)."""
  return {k: jax.ShapeDtypeStruct((v.shape[0] * inp.hosts[0], *v.shape[1:]), v.dtype)
          for k, v in input_specs(inp).items()}


@dataclasses.dataclass
class TrainProgram:
  """What a run sets up before its first step: optimizer, state layout, compiled step.

  train() and benchmarks/train_step.py both build it, so a benchmark times
  exactly the step a run executes.
  """

  task: Task
  partitioner: Any
  tx: Any  # optax.GradientTransformation
  schedule: Any  # optax.Schedule
  sample_batch: dict[str, jax.Array]  # one row of zeros: what init traces the model with
  global_specs: dict[str, jax.ShapeDtypeStruct]  # the global batch's features
  global_batch: int
  tokens_per_step: int
  abstract: ts.TrainState  # ShapeDtypeStructs of the state
  logical: ts.TrainState  # logical PartitionSpecs of the state
  step_fn: Any  # partitioner.compile(train_step): (state, batch, key) -> (state, metrics)

  def init_state(self, seed: int) -> ts.TrainState:
    """A freshly initialised state, created in the partitioner's layout."""
    return self.partitioner.init_state(
        ts.init_fn(self.task.model, self.tx, self.sample_batch), seed)


def build_train_program(task: Task, train_input: BaseInput, partitioner: Any,
                        skip_nonfinite: bool = False) -> TrainProgram:
  """Builds the optimizer and state specs (set on partitioner) and compiles the train step.

  Raises:
    UserError: the global batch does not divide over the partitioner's batch shards.
  """
  tx = task.learner.transform()
  schedule = task.learner.lr_schedule()
  model = task.model
  global_specs = global_input_specs(train_input)
  sample_batch = model.init_batch(global_specs)
  global_batch = next(iter(global_specs.values())).shape[0]
  partitioner.check_global_batch(global_batch)
  num_microbatches = task.train.num_microbatches
  check_microbatches(global_batch, num_microbatches, batch_shards(partitioner))
  abstract, logical = ts.logical_specs(model, tx, sample_batch)
  partitioner.set_state_specs(logical)
  step_fn = partitioner.compile(make_train_step(task.model, tx, schedule, partitioner.reduce,
                                                skip_nonfinite=skip_nonfinite,
                                                num_microbatches=num_microbatches))
  return TrainProgram(
      task=task, partitioner=partitioner, tx=tx, schedule=schedule, sample_batch=sample_batch,
      global_specs=global_specs, global_batch=global_batch,
      tokens_per_step=model.tokens_per_step(global_specs),
      abstract=abstract, logical=logical, step_fn=step_fn)


def write_model_analysis(path: str, abstract_params: Any, mesh_specs: Any) -> int:
  """model_analysis.txt: path, shape, dtype, partition spec per parameter; the total."""
  rows = []
  flat_specs = dict(jax.tree_util.tree_flatten_with_path(
      mesh_specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))[0])
  total = 0
  for path_keys, leaf in jax.tree_util.tree_flatten_with_path(abstract_params)[0]:
    name = "/".join(str(getattr(k, "key", k)) for k in path_keys)
    spec = flat_specs.get(path_keys)
    size = int(np.prod(leaf.shape))
    total += size
    rows.append(f"{name}  shape={tuple(leaf.shape)}  dtype={leaf.dtype}  spec={spec}  "
                f"count={size:,}")
  rows.append(f"total parameters: {total:,}")
  with open(path, "w") as f:
    f.write("\n".join(rows) + "\n")
  return total


def train(task: Task, train_input: BaseInput, partitioner: Any, job_log_dir: str,
          options: TrainOptions | None = None) -> TrainResult:
  """Trains task.model on train_input until task.train.num_train_steps.

  Resumes from the latest complete checkpoint in job_log_dir/checkpoints (or
  from options.restore_checkpoint_dir when job_log_dir has none).
  """
  options = options or TrainOptions()
  settings = task.train
  is_chief = jax.process_index() == 0
  gp = options.goodput or goodput.Recorder()
  program = build_train_program(task, train_input, partitioner,
                                skip_nonfinite=options.skip_nonfinite_steps)
  tokens_per_step = program.tokens_per_step
  abstract, logical = program.abstract, program.logical
  if options.model_flops_per_step is None:
    options.model_flops_per_step = task.model.model_flops_per_step(program.global_specs)
  if is_chief:
    num_params = write_model_analysis(os.path.join(job_log_dir, "model_analysis.txt"),
                                      abstract.params, partitioner.mesh_specs(logical.params))
    logging.info("model has %s parameters", f"{num_params:,}")

  ckpt = ckpt_lib.Checkpointer(
      ckpt_lib.checkpoint_dir(job_log_dir), max_to_keep=settings.max_checkpoints_to_keep,
      async_save=options.async_checkpoint, state_format=options.checkpoint_format)
  t_restore = time.perf_counter()
  state, start_step = resume.start(program, train_input, ckpt, options, settings.seed,
                                       job_log_dir if is_chief else None)
  gp.restored(job_log_dir if is_chief else None, start_step, time.perf_counter() - t_restore)
  result = TrainResult(start_step=start_step, final_step=start_step, history=[])
  if start_step >= settings.num_train_steps:
    logging.info("checkpoint at step %d already reaches NUM_TRAIN_STEPS=%d; nothing to train",
                 start_step, settings.num_train_steps)
    ckpt.close()
    result.state = state
    return result

  step_fn, pgle_collector = pgle.prepare_step(program.step_fn, options.pgle)
  num_devices = _num_devices(partitioner)
  key = jax.random.key(settings.seed)
  writer = summaries.SummaryWriter(job_log_dir, "train",
                                   enabled=is_chief and options.enable_summary_writer)
  prefetch = Prefetcher(train_input)
  last_saved = start_step
  guard = nonfinite.FiniteGuard(nonfinite.param_names(abstract.params), partitioner.unshard,
                                skip=options.skip_nonfinite_steps)
  watcher = preemption.StopWatcher().install()
  step_profiler = prof_lib.StepProfiler(options.profile, job_log_dir, enabled=is_chief)
  try:
    step = start_step
    t_start = time.perf_counter()
    gp.loop_started()
    with gp.span("input_wait"):
      host_batch, input_state = prefetch.next()
    batch = partitioner.shard_batch(host_batch)
    t_mark, step_mark = None, step
    while step < settings.num_train_steps:
      if step_profiler.wants(step + 1):
        step_profiler.before_step(step + 1, functools.partial(_hlo_text, step_fn, state, batch,
                                                              key))
      state, metrics = step_fn(state, batch, key)
      step += 1
      step_profiler.after_step(step, metrics, last_step=step >= settings.num_train_steps)
      metrics = guard.record(step, metrics)  # keeps a device scalar: no sync here
      faults.hit("step", step)
      if step < settings.num_train_steps:
        # Read and transfer the next batch while the device runs this step.
        with gp.span("input_wait"):
          next_host_batch, next_input_state = prefetch.next()
        next_batch = partitioner.shard_batch(next_host_batch)
      if t_mark is None:
        jax.block_until_ready(metrics)
        result.compile_seconds = time.perf_counter() - t_start
        logging.info("first step (with compilation) took %.2fs", result.compile_seconds)
        gp.first_step(result.compile_seconds)
        if options.measure_hardware_flops:
          with gp.span("other"):
            hw = flops.measure_step(step_fn, (state, batch, key), num_devices,
                                    may_compile=not pgle.auto_active(options.pgle))
          options.hardware_flops_per_step = hw.total if hw else None
        t_mark, step_mark = time.perf_counter(), step
        values = {k: float(v) for k, v in partitioner.unshard(metrics).items()}
        writer.scalars(step, values)
        summaries.log_step(step, values)
        result.history.append({"step": step, **values})
      elif step % settings.summary_interval_steps == 0 or step == settings.num_train_steps:
        values = {k: float(v) for k, v in partitioner.unshard(metrics).items()}
        now = time.perf_counter()
        if step > step_mark:
          values["steps_per_sec"] = (step - step_mark) / (now - t_mark)
          values["tokens_per_sec"] = values["steps_per_sec"] * tokens_per_step
          _add_mfu(values, options, num_devices)
        values["goodput"] = gp.report()["goodput"]
        efficiency = train_input.packing_efficiency(host_batch)
        if efficiency is not None:
          values["packing_efficiency"] = efficiency
        t_mark, step_mark = now, step
        writer.scalars(step, values)
        summaries.log_step(step, values)
        result.history.append({"step": step, **values})
      stop = watcher.reached(step)  # every process stops after the same step
      save = options.enable_checkpoint_saving and last_saved != step and (
          stop or step % settings.checkpoint_every_n_steps == 0
          or step == settings.num_train_steps)
      if (save or stop or step % settings.summary_interval_steps == 0
          or step == settings.num_train_steps):
        guard.check(last_saved)  # where the loop waits for the device anyway
      if save:
        with gp.span("checkpoint"):
          ckpt.save(step, partitioner.to_saveable(state), input_state)
        last_saved = step
        faults.hit("save", step)
      if stop:
        result.stopped_by = watcher.signal_name
        break
      if (options.evaluator and settings.eval_interval_steps and step < settings.num_train_steps
          and step % settings.eval_interval_steps == 0):
        with gp.span("eval"):
          evals = _run_eval(options, state, step, decode=options.decode_during_train)
        if _reached_target(settings.target_log_pplx, evals, step):
          if options.enable_checkpoint_saving and last_saved != step:
            with gp.span("checkpoint"):
              ckpt.save(step, partitioner.to_saveable(state), input_state)
            last_saved = step
          break
      gp.step_done(step, force_progress=last_saved == step)
      if step < settings.num_train_steps:
        batch, host_batch, input_state = next_batch, next_host_batch, next_input_state
    result.final_step = step
    gp.loop_ended(step)
    if options.evaluator and not result.stopped_by:
      with gp.span("eval"):
        result.eval_metrics = _run_eval(options, state, step, decode=True)
  finally:
    watcher.uninstall()
    step_profiler.finish()  # a run that stopped inside the profiled steps
    prefetch.close()
    if pgle_collector:
      pgle_collector.close()
    with gp.span("checkpoint"):
      ckpt.wait()
    gp.finish()
    writer.scalars(result.final_step, gp.scalars())
    writer.close()
    ckpt.close()
  result.goodput = gp.write(job_log_dir) if is_chief else gp.report()
  logging.info("%s", gp.summary_line())
  if result.stopped_by:
    logging.warning("%s: stopped after step %d, last checkpoint %d (%.2fs after the "
                    "signal); rerun the same command to continue", result.stopped_by,
                    result.final_step, last_saved, time.monotonic() - (watcher.requested_at or
                                                                       time.monotonic()))
  logging.info("training done at step %d (last checkpoint %d)", result.final_step, last_saved)
  result.state = state
  return result


def _run_eval(options: TrainOptions, state: Any, step: int,
              decode: bool) -> dict[str, dict[str, float]]:
  out = {f"eval_test_{k}": v for k, v in options.evaluator.evaluate(state, step).items()}
  faults.hit("eval", step)
  if decode:
    out.update({f"decode_{k}": v for k, v in options.evaluator.decode(state, step).items()})
  return out


def _reached_target(target: float | None, evals: dict[str, dict[str, float]],
                    step: int) -> bool:
  """TARGET_LOG_PPLX: whether an eval's log-perplexity reached it (logged when it did)."""
  if target is None:
    return False
  reached = {k: m["log_pplx"] for k, m in evals.items()
             if "log_pplx" in m and m["log_pplx"] <= target}
  if reached:
    logging.info("TARGET_LOG_PPLX %g reached at step %d (%s): training stops", target, step,
                 ", ".join(f"{k} log_pplx {v:.4f}" for k, v in reached.items()))
  return bool(reached)


def _hlo_text(step_fn: Any, *args: Any) -> str:
  """The compiled step's HLO text (the jit cache has it after the first step)."""
  return step_fn.lower(*args).compile().as_text()


def _num_devices(partitioner: Any) -> int:
  device_mesh = getattr(partitioner, "mesh", None)
  return device_mesh.size if device_mesh is not None else jax.device_count()


def _add_mfu(values: dict[str, float], options: TrainOptions, num_devices: int) -> None:
  """tflops_per_device and mfu (model FLOPs), hfu (hardware FLOPs, remat included)."""
  if "steps_per_sec" not in values:
    return
  peak = options.peak_flops_per_device
  if options.model_flops_per_step:
    per_device = options.model_flops_per_step * values["steps_per_sec"] / num_devices
    values["tflops_per_device"] = per_device / 1e12
    if peak:
      values["mfu"] = per_device / peak
  if options.hardware_flops_per_step and peak:
    values["hfu"] = options.hardware_flops_per_step * values["steps_per_sec"] / num_devices / peak
