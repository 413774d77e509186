"""How a run starts (its checkpoint, INIT_FROM weights or a fresh init), and whether it fits.

The rule (Pax's): the latest complete step in job_log_dir/checkpoints; if
there is none, --restore_checkpoint_dir (its latest step, or
--restore_checkpoint_step): another job's checkpoints only start a job that
has none of its own, so the same command continues it. Without
--restore_checkpoint_dir (or with the job's own folder),
--restore_checkpoint_step rolls a training job back to an older step of its
own; train_restore() refuses one below later checkpoints, unless they were
written since the job's last training run rolled it back to that same step
(run_env.json's "restore" record), which the same command continues.
Partial steps (orbax's `*.orbax-checkpoint-tmp*` directories left by a crash
mid-save) are never listed, and the trainer's checkpointer removes them when
it opens the directory.

`preflight()` runs before a run writes anything: it resolves the step,
checks that it exists, and compares the checkpoint's stored metadata
(shapes and dtypes; no array is read) with this run's abstract train state,
so a changed model is refused with the first mismatched parameter while
the job_log_dir is still untouched. The same layers stored in another layout
(NUM_STAGES, CIRCULAR_REPEAT, USE_REPEATED_LAYER) are no changed model: the
read restacks them (paxlike.relayout) and logs from which layout to which.
`restore()` does the actual read; a step whose files cannot be read fails
naming the step, and with fallback=True the damaged step is moved aside
(checkpoint_N.damaged, nothing is deleted) and the newest older step is tried.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from typing import Any

from paxlike import checkpoint_folders, initial, relayout
from paxlike import checkpoints as ckpt_lib
from paxlike import log as logging
from paxlike.errors import UserError


@dataclasses.dataclass
class Source:
  """Where a run's state comes from; step None means a fresh init."""

  checkpointer: ckpt_lib.Checkpointer | None
  step: int | None
  own: bool  # job_log_dir's own checkpoints (not --restore_checkpoint_dir)

  @property
  def directory(self) -> str | None:
    return self.checkpointer.directory if self.checkpointer else None


def _read_only(directory: str) -> ckpt_lib.Checkpointer:
  return ckpt_lib.Checkpointer(directory, read_only=True)


def _pick(ckpt: ckpt_lib.Checkpointer, steps: list[int], step: int | None,
          own: bool) -> Source:
  """The requested step of ckpt (the latest when None)."""
  if step is None:
    return Source(ckpt, max(steps), own)
  if step not in steps:
    raise UserError(
        f"no complete checkpoint for step {step} (--restore_checkpoint_step) in "
        f"{ckpt.directory}; available: {sorted(steps)}.")
  return Source(ckpt, step, own)


def _is_own(own_dir: str, restore_checkpoint_dir: str) -> bool:
  """--restore_checkpoint_dir names own_dir (a job's checkpoints/ folder) or its job_log_dir."""
  path = os.path.realpath(os.path.expanduser(restore_checkpoint_dir))
  return path in (os.path.realpath(own_dir), os.path.dirname(os.path.realpath(own_dir)))


def find_source(own: ckpt_lib.Checkpointer, restore_checkpoint_dir: str | None,
                restore_checkpoint_step: int | None) -> Source:
  """Applies the restore rule; see the module docstring.

  Raises:
    UserError: a requested step or directory does not exist.
  """
  own_steps = own.all_steps()
  if own_steps:
    # (train_restore drops another job's step once the job has checkpoints of its own.)
    return _pick(own, own_steps, restore_checkpoint_step, True)
  if restore_checkpoint_dir:
    other = _read_only(ckpt_lib.resolve_restore_dir(restore_checkpoint_dir))
    steps = other.all_steps()
    if not steps:
      raise UserError(f"--restore_checkpoint_dir {other.directory} holds no complete "
                      "checkpoint; pass the checkpoints/ folder of a run that saved one.")
    return _pick(other, steps, restore_checkpoint_step, False)
  if restore_checkpoint_step is not None:
    raise UserError(
        f"no checkpoint for step {restore_checkpoint_step} (--restore_checkpoint_step): "
        f"{own.directory} has none and no --restore_checkpoint_dir was given; pass the "
        "checkpoints/ folder that holds that step.")
  return Source(None, None, True)


RECORD = "restore"  # run_env.json: a training run's restore flags (train_restore)


@dataclasses.dataclass
class TrainRestore:
  """How a training run goes by its restore flags (train_restore)."""

  step: int | None  # the --restore_checkpoint_step it restores (None: the newest)
  record: dict[str, Any] | None  # run_env.json's RECORD (write_record() fills in a None "since")
  note: str | None = None  # why the flags are not used, for the log


def _previous_record(job_log_dir: str) -> dict[str, Any]:
  """The RECORD of the job's last training run ({} when it has none)."""
  from paxlike import xla_flags

  record = (xla_flags.training_run_env(job_log_dir) or {}).get(RECORD)
  return record if isinstance(record, dict) else {}


def _agreed(verdict: bool) -> bool:
  """Process 0's verdict, for every process (they read files process 0 may be rewriting)."""
  import jax

  if jax.process_count() == 1:
    return verdict
  import numpy as np
  from jax.experimental import multihost_utils

  return bool(int(multihost_utils.broadcast_one_to_all(np.int32(verdict))))


def train_restore(job_log_dir: str, restore_checkpoint_dir: str | None,
                  restore_checkpoint_step: int | None) -> TrainRestore:
  """The restore flags of a training run, read against the job's own checkpoints.

  With another job's --restore_checkpoint_dir, a job with checkpoints of its own
  continues from its newest (find_source). A rollback (--restore_checkpoint_step in
  the job's own checkpoints) below later steps would write those steps again, so it
  is refused, unless the job's last training run recorded the same rollback and every
  later step was written since it began: then this is a rerun of that command, which
  continues from the newest step.

  Raises:
    UserError: a rollback below later checkpoints that no run of this rollback wrote.
  """
  if restore_checkpoint_dir is None and restore_checkpoint_step is None:
    return TrainRestore(None, None)
  own_dir = ckpt_lib.checkpoint_dir(job_log_dir)
  record = {"restore_checkpoint_dir": restore_checkpoint_dir and os.path.abspath(
      os.path.expanduser(restore_checkpoint_dir)), "restore_checkpoint_step":
      restore_checkpoint_step}
  steps = checkpoint_folders.step_folders(job_log_dir)
  if restore_checkpoint_dir and not _is_own(own_dir, restore_checkpoint_dir):
    if not steps:  # they start the job
      return TrainRestore(restore_checkpoint_step, record)
    return TrainRestore(None, record, (
        f"--restore_checkpoint_dir and --restore_checkpoint_step are not used: the job "
        f"continues from its own step {max(steps)} (they start a job with no checkpoint)"))
  step = restore_checkpoint_step
  if step is None:  # the job's own folder, its newest step: no rollback
    return TrainRestore(None, record)
  later = sorted(s for s in steps if s > step)
  if not later:
    return TrainRestore(step, {**record, "since": None})
  previous = _previous_record(job_log_dir)
  since = previous.get("since")
  same = (previous.get("restore_checkpoint_step") == step
          and isinstance(since, (int, float)) and not isinstance(since, bool)
          and (not previous.get("restore_checkpoint_dir")
               or _is_own(own_dir, previous["restore_checkpoint_dir"])))
  # The later steps this rollback did not write (all of them, for another rollback).
  stale = [s for s in later if not same or _written_at(steps[s]) < since]
  if _agreed(not stale):
    return TrainRestore(None, {**record, "since": since}, (
        f"--restore_checkpoint_step={step} is not used: the job continues from its own step "
        f"{later[-1]}, written since this command rolled it back to step {step}"))
  if step not in steps:  # preflight names the steps there are
    return TrainRestore(step, record)
  raise UserError(f"--restore_checkpoint_step={step} trains on from there, but {own_dir} "
                  f"already has step {stale[0] if stale else later[0]} after it, which this run "
                  "would write again; train into a new --job_log_dir with "
                  f"--restore_checkpoint_dir={own_dir}, or move the later checkpoints away.")


def _written_at(folder: str) -> float:
  """When a checkpoint folder was written: its files' newest mtime (orbax's
  _CHECKPOINT_METADATA, ...), as run_env.json's `since` is a file's. A folder's own
  mtime is not used: a FUSE mount of a bucket (gcsfuse) may give folders the time they
  were looked up, which would make an old step look written since."""
  with os.scandir(folder) as entries:
    times = [e.stat().st_mtime for e in entries if e.is_file()]
  return max(times) if times else os.stat(folder).st_mtime


def write_record(job_log_dir: str, restore: TrainRestore) -> None:
  """Adds restore's RECORD to the training run's run_env.json (written just before). A
  rollback that starts now gets "since": the file's time on the job's file system,
  where its checkpoints' times come from too."""
  if restore.record is None:
    return
  from paxlike import xla_flags

  entry = dict(restore.record)
  if "since" in entry and entry["since"] is None:
    entry["since"] = os.stat(os.path.join(job_log_dir, xla_flags.TRAINING_RUN_ENV)).st_mtime
  xla_flags.update_run_env(job_log_dir, {RECORD: entry})


def check_compatible(source: Source, step: int, abstract: Any,
                     model: Any = None) -> relayout.Restack | None:
  """Raises UserError when the stored state at step does not fit abstract.

  A checkpoint of model's layers in another layout (NUM_STAGES, CIRCULAR_REPEAT,
  USE_REPEATED_LAYER) fits once restacked (paxlike.relayout).

  Returns:
    The Restack a read of the step needs, or None when it reads as it is.

  Raises:
    UserError: a mismatch (naming the parameter and both shapes), or
      DamagedCheckpointError when the metadata cannot be read.
  """
  stored = source.checkpointer.state_metadata(step)
  restack, problem = relayout.compare(stored, abstract, model)
  if problem is None:
    return restack
  hint = ("start this model in a new --job_log_dir (the existing checkpoints stay as they are)"
          if source.own else "pass the checkpoints of a run of this model")
  from paxlike.layers.linear import LORA_PARAM

  if re.search(rf"(^|/){LORA_PARAM} ", problem):
    hint = ("the run that wrote it and this one differ in USE_LORA, LORA_RANK or "
            "LORA_TARGET_LAYERS: set them as that run did, or " + hint)
  elif problem.startswith("opt_state"):
    hint = ("the optimizer state differs: the run that wrote it had another OPTIMIZER (or "
            "optimizer config, or frozen parameters); set it as that run did, or " + hint)
  raise UserError(
      f"checkpoint step {step} in {source.directory} does not fit this run's model: "
      f"{problem}; {hint}.")


def preflight(job_log_dir: str, abstract: Any, restore_checkpoint_dir: str | None,
              restore_checkpoint_step: int | None, fallback: bool = False,
              model: Any = None) -> Source:
  """Everything restore() would refuse, found before the run writes anything.

  Args:
    job_log_dir: the run's directory (only read here).
    abstract: this run's abstract train state (ShapeDtypeStructs).
    restore_checkpoint_dir, restore_checkpoint_step: the flags.
    fallback: --restore_fallback (damaged metadata moves on to older steps).
    model: this run's model (a checkpoint of its layers in another layout fits).

  Returns:
    The source and step restore() will start from (its data may still turn
    out damaged when read).
  """
  source = find_source(_read_only(ckpt_lib.checkpoint_dir(job_log_dir)),
                       restore_checkpoint_dir, restore_checkpoint_step)
  if source.step is None:
    return source
  for step in _candidates(source, fallback):
    try:
      check_compatible(source, step, abstract, model)
      return Source(source.checkpointer, step, source.own)
    except ckpt_lib.DamagedCheckpointError:
      if not fallback:
        raise
      logging.warning("checkpoint step %d looks damaged; --restore_fallback tries older steps",
                      step)
  raise _no_good_step(source)


def abstract_train_state(task: Any, train_input: Any) -> Any:
  """The task's abstract train state (ShapeDtypeStructs; nothing allocated or compiled)."""
  from paxlike import train_state as ts
  from paxlike.inputs.base_input import input_specs

  return ts.task_logical_specs(task, task.model.init_batch(input_specs(train_input)))[0]


def state_bytes(abstract: Any) -> int:
  import jax
  import numpy as np

  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(abstract))


def check_free_space(job_log_dir: str, abstract: Any) -> None:
  """Refuses a job_log_dir whose file system cannot hold one more checkpoint.

  Raises:
    UserError: fewer free bytes than one uncompressed copy of the state.
  """
  need = state_bytes(abstract)
  free = shutil.disk_usage(job_log_dir).free
  if free < need:
    raise UserError(
        f"--job_log_dir {job_log_dir} has {free / 2**20:.1f} MiB free but one checkpoint of "
        f"this model needs about {need / 2**20:.1f} MiB; free some space or pick another "
        "--job_log_dir.")


def preflight_task(task: Any, train_input: Any, job_log_dir: str, mode: str,
                   restore_checkpoint_dir: str | None, restore_checkpoint_step: int | None,
                   fallback: bool = False, will_save: bool = True,
                   init_from: initial.InitFrom | None = None) -> Source:
  """preflight() for main.py: builds the abstract state, checks the space for checkpoints.

  eval, decode and export read --restore_checkpoint_dir when given (else
  job_log_dir), as evaluator.restore_for_eval does. When the run will start
  from init_from (no checkpoint to restore), that source is checked too.
  """
  abstract = abstract_train_state(task, train_input)
  if mode != "train":
    directory = ckpt_lib.read_dir(job_log_dir, restore_checkpoint_dir)
    source = find_source(_read_only(directory), None, restore_checkpoint_step)
    if source.step is not None:
      check_compatible(Source(source.checkpointer, source.step, not restore_checkpoint_dir),
                       source.step, abstract, task.model)
    elif init_from:
      initial.check(init_from, task.model, abstract)
    return source
  source = preflight(job_log_dir, abstract, restore_checkpoint_dir, restore_checkpoint_step,
                     fallback, task.model)
  if source.step is None and init_from:
    initial.check(init_from, task.model, abstract)
  if will_save:
    check_free_space(job_log_dir, abstract)
  return source


def _candidates(source: Source, fallback: bool) -> list[int]:
  if not fallback:
    return [source.step]
  return sorted((s for s in source.checkpointer.all_steps() if s <= source.step), reverse=True)


def _no_good_step(source: Source) -> UserError:
  return UserError(f"no checkpoint in {source.directory} at or before step {source.step} "
                   "can be restored; every one is damaged. Start fresh in a new --job_log_dir.")


def read_step(source: Source, step: int, target: Any, abstract: Any,
              model: Any = None) -> tuple[Any, dict[str, Any]]:
  """One step's state and input position, checked against abstract.

  In this run's layout it is read straight into target's shardings; a checkpoint
  of model's layers in another layout is read as stored and restacked (host
  arrays: the caller places them with its partitioner's shard_state).
  """
  restack = check_compatible(source, step, abstract, model)
  if restack is None:
    return source.checkpointer.restore(step, target)
  return restack.read(source.checkpointer, step, abstract)


def restore(own: ckpt_lib.Checkpointer, target: Any, abstract: Any,
            restore_checkpoint_dir: str | None, restore_checkpoint_step: int | None,
            fallback: bool = False, model: Any = None) -> tuple[Any, dict[str, Any], int] | None:
  """Reads the state the restore rule picks; None when the run starts fresh.

  Args:
    own: job_log_dir's checkpointer (writable: damaged steps are moved aside here).
    target: the restore target (the partitioner's abstract state, with shardings).
    abstract: the plain abstract state, for the compatibility check.
    fallback: move a damaged step aside and try the newest older one.
    model: this run's model (a checkpoint of its layers in another layout is restacked).

  Returns:
    (state, input position, step), or None.
  """
  source = find_source(own, restore_checkpoint_dir, restore_checkpoint_step)
  if source.step is None:
    return None
  for step in _candidates(source, fallback):
    try:
      state, input_state = read_step(source, step, target, abstract, model)
    except ckpt_lib.DamagedCheckpointError as e:
      if not fallback:
        raise
      if source.own:
        moved = source.checkpointer.quarantine(step)
        logging.warning("checkpoint step %d is damaged (%s); moved it to %s and trying the "
                        "step before", step, e, moved)
      else:
        logging.warning("checkpoint step %d is damaged (%s); trying the step before", step, e)
      continue
    if step != source.step:
      logging.warning("--restore_fallback: restored step %d instead of step %d", step,
                      source.step)
    logging.info("restored step %d from %s", step, source.checkpointer.step_path(step))
    return state, input_state, step
  raise _no_good_step(source)


def start(program: Any, train_input: Any, ckpt: ckpt_lib.Checkpointer, options: Any,
          seed: int, record_dir: str | None = None) -> tuple[Any, int]:
  """The run's first state and step: its checkpoint, else INIT_FROM's weights, else the seed.

  Args:
    program: the trainer's TrainProgram (partitioner, abstract state, init).
    train_input: set to the restored input position when a checkpoint is read.
    ckpt: job_log_dir's checkpointer.
    options: the trainer's TrainOptions (restore flags, init_from).
    seed: the fresh-init seed.
    record_dir: where run_env.json records an INIT_FROM start (the chief's job_log_dir).
  """
  partitioner, abstract = program.partitioner, program.abstract
  target = partitioner.abstract_state(abstract)
  restored = restore(ckpt, target, abstract, options.restore_checkpoint_dir,
                     options.restore_checkpoint_step, fallback=options.restore_fallback,
                     model=program.task.model)
  if restored is None:
    if options.init_from:
      return _init_from(program, options.init_from, seed, record_dir), 0
    logging.info("no checkpoint found: initialising from seed %d", seed)
    return program.init_state(seed), 0
  state, input_state, step = restored
  state = partitioner.shard_state(state)
  train_input.set_state(input_state)
  return state, int(step)


def _init_from(program: Any, init: initial.InitFrom, seed: int,
               record_dir: str | None) -> Any:
  """The step-0 state of a run that starts from INIT_FROM; recorded in run_env.json."""

  from paxlike import xla_flags

  state, plan = initial.start_state(init, program.task.model, program.abstract,
                                    program.partitioner, program.init_state(seed))
  counts = plan.counts()
  logging.info("no checkpoint found: starting from the parameters of %s (%d parameters taken, "
               "%d of them renamed, %d freshly initialised) with %s optimizer state",
               init.spec, counts["from_source"], counts["renamed"], counts["fresh"],
               "its" if init.optimizer else "a fresh")
  if record_dir:
    xla_flags.update_run_env(record_dir, {"init_from": {
        "source": init.spec, "rules": [list(r) for r in init.rules], "strict": init.strict,
        "optimizer": "source" if init.optimizer else "fresh", "parameters": counts}})
  return state
