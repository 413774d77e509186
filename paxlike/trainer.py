"""The training loop: cadence of steps, summaries and checkpoints.

The trainer does not know which model it trains nor how it is partitioned:
it drives a partitioner (spmd or pmap) through one interface.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import pathlib
import queue
import threading
import time
from typing import Any

import jax
import numpy as np

from paxlike import checkpoints as ckpt_lib
from paxlike import (
    faults,
    flops,
    goodput,
    initial,
    memory,
    nonfinite,
    pgle,
    preemption,
    resume,
    summaries,
    xla_flags,
)
from paxlike import log as logging
from paxlike import profiler as prof_lib
from paxlike import train_state as ts
from paxlike.inputs.base_input import BaseInput, input_specs
from paxlike.steps import check_step_batch, make_train_step
from paxlike.task import RunningMode, Task


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
  device_memory_bytes: int | None = None  # --device_memory_gib: checked before step 1
  checkpoint_todelete_subdir: str | None = None  # old checkpoints move into it, not deleted


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

  @functools.cached_property
  def _init(self) -> Any:
    # One init function per program: jax.jit caches by function, so a second
    # init_state (--mode=tune makes a fresh state for every timed visit) compiles nothing.
    return ts.init_fn(self.task.model, self.tx, self.sample_batch)

  def init_state(self, seed: int) -> ts.TrainState:
    """A freshly initialised state, created in the partitioner's layout."""
    return self.partitioner.init_state(self._init, seed)


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
  num_microbatches = task.train.num_microbatches
  check_step_batch(model, partitioner, global_batch, num_microbatches)
  abstract, logical = ts.task_logical_specs(task, sample_batch)
  partitioner.set_state_specs(logical)
  step_fn = partitioner.compile(make_train_step(task.model, tx, schedule, partitioner.reduce,
                                                skip_nonfinite=skip_nonfinite,
                                                num_microbatches=num_microbatches,
                                                variable_norms=task.train.variable_norm_summary,
                                                reduce_sum=partitioner.reduce_sum))
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
  run = _TrainRun(task, train_input, partitioner, job_log_dir, options or TrainOptions())
  run.restore()
  if run.start_step >= task.train.num_train_steps:
    return run.nothing_to_train()
  run.open_loop()
  try:
    run.loop()
  except BaseException:
    run.close_loop(quiet=True)
    raise
  run.close_loop()
  return run.report()


class _TrainRun:
  """One call of train(): the steps it goes through, each a method, in order.

  restore -> open_loop -> loop (step, summaries, checkpoint or stop, eval) ->
  close_loop -> report.
  """

  def __init__(self, task: Task, train_input: BaseInput, partitioner: Any, job_log_dir: str,
               options: TrainOptions) -> None:
    self.settings, self.options = task.train, options
    self.early_stopping_fn = getattr(task, "early_stopping_fn", None)
    self.train_input, self.partitioner, self.job_log_dir = train_input, partitioner, job_log_dir
    self.is_chief = jax.process_index() == 0
    self.gp = options.goodput or goodput.Recorder()
    self.program = build_train_program(task, train_input, partitioner,
                                       skip_nonfinite=options.skip_nonfinite_steps)
    # The parameters the step takes gradients of (the learner's bprop_variable_* rules).
    task.learner.check_names(self.program.abstract.params)
    self.trained = task.learner.trainable(self.program.abstract.params)
    if options.model_flops_per_step is None:
      options.model_flops_per_step = task.model.model_flops_per_step(self.program.global_specs)
    if self.is_chief:
      num_params = write_model_analysis(
          os.path.join(job_log_dir, "model_analysis.txt"), self.program.abstract.params,
          partitioner.mesh_specs(self.program.logical.params))
      logging.info("model has %s parameters", f"{num_params:,}")
      trained_params = ts.count_params(self.trained)
      if trained_params != num_params:
        logging.info("training %s of them (%.2f%%); the learner's bprop_variable_inclusion / "
                     "_exclusion freeze the rest", f"{trained_params:,}",
                     100.0 * trained_params / num_params)
    self.ckpt = ckpt_lib.Checkpointer(
        ckpt_lib.checkpoint_dir(job_log_dir), max_to_keep=self.settings.max_checkpoints_to_keep,
        async_save=options.async_checkpoint, state_format=options.checkpoint_format,
        todelete_subdir=options.checkpoint_todelete_subdir)

  def restore(self) -> None:
    """The run's start: a checkpoint, INIT_FROM's weights or a fresh state (resume.start)."""
    t_restore = time.perf_counter()
    chief_dir = self.job_log_dir if self.is_chief else None
    self.state, self.start_step = resume.start(self.program, self.train_input, self.ckpt,
                                               self.options, self.settings.seed, chief_dir)
    self.gp.restored(chief_dir, self.start_step, time.perf_counter() - t_restore)
    self.result = TrainResult(start_step=self.start_step, final_step=self.start_step,
                              history=[])
    self.last_saved = self.start_step

  def nothing_to_train(self) -> TrainResult:
    logging.info("checkpoint at step %d already reaches NUM_TRAIN_STEPS=%d; nothing to train",
                 self.start_step, self.settings.num_train_steps)
    self.ckpt.close()
    self.result.state = self.state
    return self.result

  def open_loop(self) -> None:
    """What the loop holds open: step function, writer, prefetcher, guards, profiler."""
    self.step_fn, self.pgle_collector = pgle.prepare_step(self.program.step_fn,
                                                          self.options.pgle)
    self.num_devices = _num_devices(self.partitioner)
    self.key = jax.random.key(self.settings.seed)
    self.writer = summaries.SummaryWriter(
        self.job_log_dir, "train", enabled=self.is_chief and self.options.enable_summary_writer)
    self.prefetch = Prefetcher(self.train_input)
    # The step's nonfinite code counts the gradients it takes: the trained parameters'.
    self.guard = nonfinite.FiniteGuard(nonfinite.param_names(self.trained),
                                       self.partitioner.unshard,
                                       skip=self.options.skip_nonfinite_steps)
    self.watcher = preemption.StopWatcher().install()
    plan = self.options.profile
    if plan is not None:  # the run's own steps (a resumed run starts past step 1)
      plan = plan.fit(self.start_step + 1, self.settings.num_train_steps)
    self.step_profiler = prof_lib.StepProfiler(plan, self.job_log_dir, enabled=self.is_chief)

  def loop(self) -> None:
    """Steps until NUM_TRAIN_STEPS, a stop signal or TARGET_LOG_PPLX; then the final eval."""
    last = self.settings.num_train_steps
    step = self.start_step
    self.t_start = time.perf_counter()
    self.gp.loop_started()
    host_batch, input_state = self._next_batch()
    batch = self.partitioner.shard_batch(host_batch)
    self.t_mark, self.step_mark = None, step
    if self.options.device_memory_bytes:
      with self.gp.span("other"):
        policy = getattr(self.program.task.model, "checkpoint_policy", None)
        memory.preflight(self.step_fn, (self.state, batch, self.key),
                         self.options.device_memory_bytes, self.last_saved,
                         in_place=(getattr(policy, "name", str(policy)),))
    with memory.out_of_memory_is_one_line(lambda: self.last_saved):
      self._steps(step, last, batch, host_batch, input_state)

  def _steps(self, step: int, last: int, batch: Any, host_batch: Any, input_state: Any) -> None:
    while step < last:
      metrics = self._step(step, batch)
      step += 1
      if step < last:
        # Read and transfer the next batch while the device runs this step.
        next_host_batch, next_input_state = self._next_batch()
        next_batch = self.partitioner.shard_batch(next_host_batch)
      self._summaries(step, metrics, batch, host_batch)
      if self._checkpoint_or_stop(step, input_state) or self._eval_reached_target(
          step, input_state, next_batch if step < last else None):
        break
      self._decode_at_interval(step)
      self.gp.step_done(step, force_progress=self.last_saved == step)
      if step < last:
        batch, host_batch, input_state = next_batch, next_host_batch, next_input_state
    self.result.final_step = step
    self.gp.loop_ended(step)
    if self.options.evaluator and not self.result.stopped_by:
      with self.gp.span("eval"):
        self.result.eval_metrics = _run_eval(self.options, self.state, step, decode=True)

  def _next_batch(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    with self.gp.span("input_wait"):
      return self.prefetch.next()

  def _step(self, step: int, batch: Any) -> Any:
    """One train step (step + 1), under the profiler when it asks; metrics stay on device."""
    if self.step_profiler.wants(step + 1):
      self.step_profiler.before_step(step + 1, functools.partial(
          _hlo_text, self.step_fn, self.state, batch, self.key))
    self.state, metrics = self.step_fn(self.state, batch, self.key)
    self.step_profiler.after_step(step + 1, metrics,
                                  last_step=step + 1 >= self.settings.num_train_steps)
    metrics = self.guard.record(step + 1, metrics)  # keeps a device scalar: no sync here
    faults.hit("step", step + 1)
    return metrics

  def _summaries(self, step: int, metrics: Any, batch: Any, host_batch: Any) -> None:
    """The first step's timing and HFU, then scalars every SUMMARY_INTERVAL_STEPS."""
    if self.t_mark is None:
      jax.block_until_ready(metrics)
      # Without the wait for the first batches, which goodput counts as input_wait.
      self.result.compile_seconds = self.gp.first_step(time.perf_counter() - self.t_start)
      logging.info("first step (with compilation) took %.2fs", self.result.compile_seconds)
      if self.options.measure_hardware_flops:
        with self.gp.span("other"):
          hw = flops.measure_step(self.step_fn, (self.state, batch, self.key), self.num_devices,
                                  may_compile=not pgle.auto_active(self.options.pgle))
        self.options.hardware_flops_per_step = hw.total if hw else None
      self.t_mark, self.step_mark = time.perf_counter(), step
      self._write(step, {k: float(v) for k, v in self.partitioner.unshard(metrics).items()})
    elif (step % self.settings.summary_interval_steps == 0
          or step == self.settings.num_train_steps):
      values = {k: float(v) for k, v in self.partitioner.unshard(metrics).items()}
      now = time.perf_counter()
      if step > self.step_mark:
        values["steps_per_sec"] = (step - self.step_mark) / (now - self.t_mark)
        values["tokens_per_sec"] = values["steps_per_sec"] * self.program.tokens_per_step
        _add_mfu(values, self.options, self.num_devices)
      values["goodput"] = self.gp.report()["goodput"]
      efficiency = self.train_input.packing_efficiency(host_batch)
      if efficiency is not None:
        values["packing_efficiency"] = efficiency
      self.t_mark, self.step_mark = now, step
      self._write(step, values)

  def _write(self, step: int, values: dict[str, float]) -> None:
    self.writer.scalars(step, values)
    summaries.log_step(step, values)
    self.result.history.append({"step": step, **values})

  def _checkpoint_or_stop(self, step: int, input_state: dict[str, Any]) -> bool:
    """Saves at the cadence, the last step or a stop signal; True when a signal stops the run."""
    last = self.settings.num_train_steps
    stop = self.watcher.reached(step)  # every process stops after the same step
    save = self.options.enable_checkpoint_saving and self.last_saved != step and (
        stop or step % self.settings.checkpoint_every_n_steps == 0 or step == last)
    if save or stop or step % self.settings.summary_interval_steps == 0 or step == last:
      self.guard.check(self.last_saved)  # where the loop waits for the device anyway
    if save:
      self._save(step, input_state)
      faults.hit("save", step)
    if stop:
      self.result.stopped_by = self.watcher.signal_name
    return stop

  def _save(self, step: int, input_state: dict[str, Any]) -> None:
    with self.gp.span("checkpoint"):
      self.ckpt.save(step, self.partitioner.to_checkpoint(self.state), input_state)
    self.last_saved = step

  def _eval_reached_target(self, step: int, input_state: dict[str, Any],
                           next_batch: Any = None) -> bool:
    """Evals every EVAL_INTERVAL_STEPS (and, as Pax's eval_skip_train=False does, the next
    training batch); True (after a save) when TARGET_LOG_PPLX is reached."""
    interval = self.settings.eval_interval_steps
    if not (self.options.evaluator and interval and step < self.settings.num_train_steps
            and step % interval == 0):
      return False
    with self.gp.span("eval"):
      if not self.settings.eval_skip_train and next_batch is not None:
        self.options.evaluator.eval_train(self.state, step, next_batch)
      evals = _run_eval(self.options, self.state, step, decode=self.options.decode_during_train)
    if not (_reached_target(self.settings.target_log_pplx, evals, step)
            or self._early_stopped(evals, step)):
      return False
    if self.options.enable_checkpoint_saving and self.last_saved != step:
      self._save(step, input_state)
    return True

  def _decode_at_interval(self, step: int) -> None:
    """Decodes every task.train.decode_interval_steps (Pax's), unless this step's eval
    decoded (--decode_during_train) or the run ends here (its last decode follows)."""
    every, ev = self.settings.decode_interval_steps, self.options.evaluator
    if not (every and ev and ev.decode_inputs and step < self.settings.num_train_steps
            and step % every == 0):
      return
    interval = self.settings.eval_interval_steps
    if self.options.decode_during_train and interval and step % interval == 0:
      return
    with self.gp.span("eval"):
      ev.decode(self.state, step)

  def _early_stopped(self, evals: dict[str, dict[str, float]], step: int) -> bool:
    """Task.early_stopping_fn (Pax's hook) on this eval's metrics; True stops training."""
    fn = self.early_stopping_fn
    if fn is None:
      return False
    metrics = {f"{k}/metrics/{m}": v for k, values in evals.items() for m, v in values.items()}
    mode = RunningMode.detect(True, True, self.options.decode_during_train)
    path = pathlib.Path(ckpt_lib.checkpoint_dir(self.job_log_dir))
    if not fn(metrics, mode, step, False, path):
      return False
    logging.info("early_stopping_fn stops training at step %d", step)
    return True

  def close_loop(self, quiet: bool = False) -> None:
    """Closes what open_loop opened; waits for the last checkpoint to be written.

    quiet: the loop is already failing; a failure while closing (the full disk
    that stopped a checkpoint also refuses the summaries' last flush) is dropped,
    so that the loop's own error is the one the user sees.
    """
    guard = contextlib.suppress(Exception) if quiet else contextlib.nullcontext()
    self.watcher.uninstall()
    self.step_profiler.finish()  # a run that stopped inside the profiled steps
    self.prefetch.close()
    if self.pgle_collector:
      self.pgle_collector.close()
    with guard, self.gp.span("checkpoint"):
      self.ckpt.wait()
    self.gp.finish()
    with guard:
      self.writer.scalars(self.result.final_step, self.gp.scalars())
      self.writer.close()
    with guard:
      self.ckpt.close()

  def report(self) -> TrainResult:
    """Goodput written, the end of the run logged; the result with the final state."""
    result = self.result
    result.goodput = self.gp.write(self.job_log_dir) if self.is_chief else self.gp.report()
    logging.info("%s", self.gp.summary_line())
    if result.stopped_by:
      if self.is_chief and os.path.exists(os.path.join(self.job_log_dir,
                                                            xla_flags.TRAINING_RUN_ENV)):
        # An evaler beside the job waits for the rerun (follow.py).
        xla_flags.update_run_env(self.job_log_dir, {"stopped": {
            "signal": result.stopped_by, "step": result.final_step, "time": time.time()}})
      waited = time.monotonic() - (self.watcher.requested_at or time.monotonic())
      logging.warning("%s: stopped after step %d, last checkpoint %d (%.2fs after the "
                      "signal); rerun the same command to continue", result.stopped_by,
                      result.final_step, self.last_saved, waited)
    logging.info("training done at step %d (last checkpoint %d)", result.final_step,
                 self.last_saved)
    result.state = self.state
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
