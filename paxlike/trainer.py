"""The training loop: cadence of steps, summaries and checkpoints.

The trainer does not know which model it trains nor how it is partitioned:
it drives a partitioner (spmd or pmap) through one interface.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from paxlike import checkpoints as ckpt_lib
from paxlike import log as logging
from paxlike import summaries
from paxlike import train_state as ts
from paxlike.inputs.base_input import BaseInput
from paxlike.steps import make_train_step
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


@dataclasses.dataclass
class TrainResult:
  """What a run did, for callers and tests."""

  start_step: int
  final_step: int
  history: list[dict[str, float]]  # one entry per summary: step and scalars
  compile_seconds: float = 0.0
  state: Any = None


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


def input_specs(inp: BaseInput) -> dict[str, jax.ShapeDtypeStruct]:
  return {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in inp.peek_specs().items()}


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
  tx = task.learner.transform()
  schedule = task.learner.lr_schedule()
  specs_in = input_specs(train_input)
  seq_shape = specs_in["ids"].shape
  sample_ids = jnp.zeros((1, *seq_shape[1:]), jnp.int32)
  global_batch = seq_shape[0] * train_input.hosts[0]
  tokens_per_step = global_batch * int(np.prod(seq_shape[1:]))
  partitioner.check_global_batch(global_batch)

  abstract, logical = ts.logical_specs(task.model, tx, sample_ids)
  partitioner.set_state_specs(logical)
  if is_chief:
    num_params = write_model_analysis(os.path.join(job_log_dir, "model_analysis.txt"),
                                      abstract.params, partitioner.mesh_specs(logical.params))
    logging.info("model has %s parameters", f"{num_params:,}")

  ckpt = ckpt_lib.Checkpointer(
      ckpt_lib.checkpoint_dir(job_log_dir), max_to_keep=settings.max_checkpoints_to_keep,
      async_save=options.async_checkpoint, state_format=options.checkpoint_format)
  state, start_step = _restore_or_init(task, tx, sample_ids, train_input, partitioner, ckpt,
                                       options, settings.seed)
  result = TrainResult(start_step=start_step, final_step=start_step, history=[])
  if start_step >= settings.num_train_steps:
    logging.info("checkpoint at step %d already reaches NUM_TRAIN_STEPS=%d; nothing to train",
                 start_step, settings.num_train_steps)
    ckpt.close()
    result.state = state
    return result

  step_fn = partitioner.compile(make_train_step(task.model, tx, schedule, partitioner.reduce))
  key = jax.random.key(settings.seed)
  writer = summaries.SummaryWriter(job_log_dir, "train",
                                   enabled=is_chief and options.enable_summary_writer)
  prefetch = Prefetcher(train_input)
  last_saved = start_step
  try:
    step = start_step
    t_start = time.perf_counter()
    host_batch, input_state = prefetch.next()
    batch = partitioner.shard_batch(host_batch)
    t_mark, step_mark = None, step
    while step < settings.num_train_steps:
      state, metrics = step_fn(state, batch, key)
      step += 1
      if step < settings.num_train_steps:
        # Read and transfer the next batch while the device runs this step.
        next_host_batch, next_input_state = prefetch.next()
        next_batch = partitioner.shard_batch(next_host_batch)
      if t_mark is None:
        jax.block_until_ready(metrics)
        result.compile_seconds = time.perf_counter() - t_start
        logging.info("first step (with compilation) took %.2fs", result.compile_seconds)
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
          _add_mfu(values, options, jax.device_count())
        t_mark, step_mark = now, step
        writer.scalars(step, values)
        summaries.log_step(step, values)
        result.history.append({"step": step, **values})
      if options.enable_checkpoint_saving and (
          step % settings.checkpoint_every_n_steps == 0 or step == settings.num_train_steps):
        ckpt.save(step, partitioner.to_saveable(state), input_state)
        last_saved = step
      if step < settings.num_train_steps:
        batch, input_state = next_batch, next_input_state
    result.final_step = step
  finally:
    prefetch.close()
    writer.close()
    ckpt.wait()
    ckpt.close()
  logging.info("training done at step %d (last checkpoint %d)", result.final_step, last_saved)
  result.state = state
  return result


def _add_mfu(values: dict[str, float], options: TrainOptions, num_devices: int) -> None:
  if not options.model_flops_per_step or "steps_per_sec" not in values:
    return
  per_device = options.model_flops_per_step * values["steps_per_sec"] / num_devices
  values["tflops_per_device"] = per_device / 1e12
  if options.peak_flops_per_device:
    values["mfu"] = per_device / options.peak_flops_per_device


def _restore_or_init(task: Task, tx: Any, sample_ids: jax.Array, train_input: BaseInput,
                     partitioner: Any, ckpt: ckpt_lib.Checkpointer, options: TrainOptions,
                     seed: int) -> tuple[Any, int]:
  abstract = jax.eval_shape(ts.init_fn(task.model, tx, sample_ids), jax.random.key(0))
  target = partitioner.abstract_state(abstract)
  step = ckpt.latest_step()
  source = ckpt
  if step is None and options.restore_checkpoint_dir:
    source = ckpt_lib.Checkpointer(options.restore_checkpoint_dir, read_only=True)
    step = options.restore_checkpoint_step or source.latest_step()
  elif options.restore_checkpoint_step is not None and step is not None:
    step = options.restore_checkpoint_step
  if step is None:
    logging.info("no checkpoint found: initialising from seed %d", seed)
    return partitioner.init_state(ts.init_fn(task.model, tx, sample_ids), seed), 0
  state, input_state = source.restore(step, target)
  state = partitioner.shard_state(state)
  train_input.set_state(input_state)
  logging.info("restored step %d from %s", step, source.step_path(step))
  return state, int(step)
