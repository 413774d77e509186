"""Orbax checkpoints: job_log_dir/checkpoints/checkpoint_<step:08d>/.

Each checkpoint holds the train state and the input position (JSON). The
state is written in one of two formats:

- "tensorstore" (SPMD runs, and pmap runs with --pmap_use_tensorstore):
  orbax's sharded arrays, each host writing its shards.
- "msgpack" (pmap runs by default, as in Pax): the unreplicated state
  serialised with flax.serialization into state/state.msgpack by process 0.

Both are managed by orbax's CheckpointManager, so saves are asynchronous and
a step directory becomes visible only once complete (orbax writes under a
temporary name and renames). Restore reads whichever format a step holds,
so a pmap checkpoint can initialise an SPMD run and the other way round.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import sys
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import serialization

from paxlike.checkpoint_folders import (  # noqa: F401  (checkpoint_dir: also named here)
    STEP_DIGITS,
    STEP_PREFIX,
    checkpoint_dir,
)
from paxlike.errors import UserError
from paxlike.partitioning.host_blocks import process_copy

FORMATS = ("tensorstore", "msgpack")
MSGPACK_FILE = "state.msgpack"


class MsgpackHandler(ocp.CheckpointHandler):
  """A pytree of host arrays in one msgpack file, written by process 0."""

  def save(self, directory: epath.Path, args: MsgpackSave) -> None:
    if jax.process_index() == 0:
      tree = jax.tree.map(lambda x: np.asarray(jax.device_get(process_copy(x))), args.item)
      (directory / MSGPACK_FILE).write_bytes(serialization.msgpack_serialize(
          serialization.to_state_dict(tree)))

  def restore(self, directory: epath.Path, args: MsgpackRestore) -> Any:
    raw = serialization.msgpack_restore((directory / MSGPACK_FILE).read_bytes())
    stored = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), raw)
    _check_fits(args.item, stored)  # Checkpointer.restore adds the step to the message
    return serialization.from_state_dict(args.item, raw)


@ocp.args.register_with_handler(MsgpackHandler, for_save=True)
@dataclasses.dataclass
class MsgpackSave(ocp.args.CheckpointArgs):
  item: Any


@ocp.args.register_with_handler(MsgpackHandler, for_restore=True)
@dataclasses.dataclass
class MsgpackRestore(ocp.args.CheckpointArgs):
  item: Any  # the target pytree (structure; leaves may be ShapeDtypeStructs)


class ModelMismatchError(UserError):
  """A checkpoint of a different model (parameter names, shapes or dtypes)."""

  def __init__(self, problem: str, step: int | None = None, directory: str | None = None):
    where = f"checkpoint step {step} in {directory}" if step is not None else "the checkpoint"
    super().__init__(
        f"{where} does not fit this run's model: {problem}; restore it with the model that "
        "wrote it, or start this model in a new --job_log_dir.")
    self.problem = problem


def _check_fits(abstract: Any, stored: Any, step: int | None = None,
                directory: str | None = None) -> None:
  problem = first_mismatch(abstract, stored)
  if problem:
    raise ModelMismatchError(problem, step, directory)


class DamagedCheckpointError(UserError):
  """A checkpoint step whose files cannot be read back."""

  def __init__(self, step: int, path: str, cause: BaseException) -> None:
    reason = " ".join(str(cause).split())
    reason = (reason[:160] + "...") if len(reason) > 160 else reason
    super().__init__(
        f"checkpoint step {step} at {path} cannot be restored; its files are damaged or "
        f"incomplete ({type(cause).__name__}: {reason}); rerun with --restore_fallback to "
        "move it aside and restore the newest older step.")
    self.step = step
    self.path = path


# What orbax/tensorstore operations still in flight print after a read or write has
# failed: each straggler fails on orbax's closed event loop and Python prints it as an
# "Exception ignored" traceback. The failure itself reaches the caller (save, wait or
# restore) and becomes one UserError; the stragglers add nothing.
_STRAGGLER_MARKS = ("Event loop is closed", "Encountered error while reading",
                    "No space left on device", "sys.meta_path is None", "RESOURCE_EXHAUSTED")


def _quiet_stragglers() -> None:
  """Drops (only) the straggler tracebacks of a failed orbax read or write."""
  previous = sys.unraisablehook
  if getattr(previous, "paxlike_quiet", False):
    return

  def hook(unraisable: Any) -> None:
    if not any(m in str(unraisable.exc_value) for m in _STRAGGLER_MARKS):
      previous(unraisable)

  hook.paxlike_quiet = True
  sys.unraisablehook = hook


class _StragglerTraceback(logging.Filter):
  """orbax's threads and asyncio log a failed read/write with its traceback: keep one line."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.exc_info and any(m in str(record.exc_info[1]) for m in _STRAGGLER_MARKS):
      record.exc_info, record.exc_text = None, None
    return True


def _install_log_filter() -> None:
  for name in ("absl", "asyncio"):
    logger = logging.getLogger(name)
    if not any(isinstance(f, _StragglerTraceback) for f in logger.filters):
      logger.addFilter(_StragglerTraceback())


@contextlib.contextmanager
def _quiet_absl(quiet: bool):
  from absl import logging as absl_logging

  before = absl_logging.get_verbosity()
  if quiet:
    absl_logging.set_verbosity(absl_logging.ERROR)
  try:
    yield
  finally:
    absl_logging.set_verbosity(before)


def path_name(path: tuple[Any, ...]) -> str:
  """A pytree path as "a/b/0/c" (dict keys, attribute names, sequence indices)."""
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)


def flat(tree: Any) -> dict[str, Any]:
  """{path_name: leaf}: a train state and its stored tree (dicts and lists) name alike."""
  return {path_name(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _fmt(leaf: Any) -> str:
  return f"shape {tuple(leaf.shape)} {np.dtype(leaf.dtype).name}"


def first_mismatch(abstract: Any, stored: Any) -> str | None:
  """The first difference between this run's abstract state and a checkpoint's, in words.

  Each train-state field is compared both ways before the next (parameters before
  optimizer slots), so a parameter only one side has is named, not a slot it implies.
  """
  want, have = flat(abstract), flat(stored)
  for field in dict.fromkeys(name.split("/", 1)[0] for name in [*want, *have]):
    for name, leaf in want.items():
      if name.split("/", 1)[0] != field:
        continue
      if name not in have:
        return (f"{name} (shape {tuple(leaf.shape)}) is in this run's model but not in the "
                "checkpoint")
      got = have[name]
      if tuple(got.shape) != tuple(leaf.shape) or np.dtype(got.dtype) != np.dtype(leaf.dtype):
        return f"{name} has {_fmt(got)} in the checkpoint but {_fmt(leaf)} in this run"
    for name, got in have.items():
      if name.split("/", 1)[0] == field and name not in want:
        return f"{name} ({_fmt(got)}) is in the checkpoint but not in this run's model"
  return None


class Checkpointer:
  """A CheckpointManager wrapper with Pax's directory names.

  Args:
    directory: the checkpoints/ folder.
    max_to_keep: how many step directories to keep (None keeps all).
    async_save: write in the background while training continues.
    read_only: restore only (never create or delete anything).
    state_format: how save() writes the state, one of FORMATS.
    todelete_subdir: steps past max_to_keep move into directory/<this> instead of being
      deleted (Pax's --checkpoint_todelete_subdir).
  """

  def __init__(self, directory: str, max_to_keep: int | None = 10, async_save: bool = True,
               read_only: bool = False, state_format: str = "tensorstore",
               todelete_subdir: str | None = None) -> None:
    if state_format not in FORMATS:
      raise ValueError(f"state_format must be one of {FORMATS}, got {state_format!r}")
    self.directory = directory
    self.state_format = state_format
    self._write_failed = False
    self._other: ocp.CheckpointManager | None = None
    _install_log_filter()
    _quiet_stragglers()
    with _quiet_absl(read_only):  # orbax warns about every read-only manager and its options
      options = ocp.CheckpointManagerOptions(
          max_to_keep=max_to_keep,
          step_prefix=STEP_PREFIX,
          step_format_fixed_length=STEP_DIGITS,
          enable_async_checkpointing=async_save,
          create=not read_only,
          read_only=read_only,
          cleanup_tmp_directories=not read_only,
          todelete_subdir=todelete_subdir,
      )
      self._manager = ocp.CheckpointManager(
          epath.Path(directory), options=options, item_names=("state", "input"))

  def _reader(self) -> ocp.CheckpointManager:
    """A read-only manager of the same folder (for steps of the other format)."""
    if self._other is None:
      with _quiet_absl(True):
        self._other = ocp.CheckpointManager(
            epath.Path(self.directory), item_names=("state", "input"),
            options=ocp.CheckpointManagerOptions(
                step_prefix=STEP_PREFIX, step_format_fixed_length=STEP_DIGITS,
                create=False, read_only=True))
    return self._other

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def reload(self) -> None:
    """Reads the folder again: steps another process committed since are listed."""
    self._manager.reload()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def step_path(self, step: int) -> str:
    return os.path.join(self.directory, f"{STEP_PREFIX}_{step:0{STEP_DIGITS}d}")

  def save(self, step: int, state: Any, input_state: dict[str, Any]) -> None:
    """Starts saving; returns once the arrays are copied off the device."""
    state_args = (ocp.args.StandardSave(state) if self.state_format == "tensorstore"
                  else MsgpackSave(state))
    with self._write_errors():
      self._manager.save(step, args=ocp.args.Composite(
          state=state_args, input=ocp.args.JsonSave(input_state)), force=True)

  def format_of(self, step: int) -> str:
    state_dir = os.path.join(self.step_path(step), "state")
    return "msgpack" if os.path.exists(os.path.join(state_dir, MSGPACK_FILE)) else "tensorstore"

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
    """Restores into abstract_state's structure, shapes, dtypes and shardings.

    A msgpack state comes back as host arrays; callers place it with their
    partitioner's shard_state.
    """
    if step not in self._manager.all_steps():
      raise UserError(f"no checkpoint for step {step} in {self.directory}; "
                      f"available: {self.all_steps() or 'none'}.")
    fmt = self.format_of(step)
    if fmt == "tensorstore":  # msgpack: checked as it is read
      _check_fits(abstract_state, self.state_metadata(step), step, self.directory)
    state_args = (ocp.args.StandardRestore(abstract_state) if fmt == "tensorstore"
                  else MsgpackRestore(abstract_state))
    # orbax binds an item to the handler of its first use: a step of the other format is
    # read through a manager of its own, so that this one still saves in its format.
    manager = self._manager if fmt == self.state_format else self._reader()
    try:
      restored = manager.restore(step, args=ocp.args.Composite(
          state=state_args, input=ocp.args.JsonRestore()))
    except ModelMismatchError as e:
      raise ModelMismatchError(e.problem, step, self.directory) from None
    except UserError:
      raise
    except Exception as e:  # noqa: BLE001  (orbax/tensorstore raise plain Exceptions)
      raise DamagedCheckpointError(step, self.step_path(step), e) from None
    return restored["state"], dict(restored["input"] or {})

  def restore_host(self, step: int) -> tuple[Any, dict[str, Any]]:
    """The state as stored (dicts and lists, whatever model wrote it), as host numpy
    arrays, and the input position: what a read into another layout starts from."""
    empty = jax.tree.map(lambda m: np.empty(m.shape, m.dtype), self.state_metadata(step))
    return self.restore(step, empty)

  def state_metadata(self, step: int) -> Any:
    """The stored state's tree with a ShapeDtypeStruct leaf per array; no array is read.

    msgpack states have no separate metadata, so their file is read.

    Raises:
      DamagedCheckpointError: the metadata cannot be read.
    """
    state_dir = os.path.join(self.step_path(step), "state")
    try:
      if self.format_of(step) == "msgpack":
        raw = serialization.msgpack_restore(
            epath.Path(state_dir, MSGPACK_FILE).read_bytes())
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), raw)
      tree = ocp.StandardCheckpointHandler().metadata(epath.Path(state_dir)).tree
      return jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), tree)
    except Exception as e:  # noqa: BLE001
      raise DamagedCheckpointError(step, self.step_path(step), e) from None

  def quarantine(self, step: int) -> str:
    """Moves a damaged step aside (checkpoint_N.damaged[.k]); returns the new path.

    The files stay for inspection; orbax no longer lists the step, so a
    later save of the same step does not collide with it.
    """
    src = self.step_path(step)
    dst = f"{src}.damaged"
    k = 1
    while os.path.exists(dst):
      dst, k = f"{src}.damaged.{k}", k + 1
    os.rename(src, dst)
    self._manager.reload()
    return dst

  @contextlib.contextmanager
  def _write_errors(self):
    """A full disk while orbax writes (now or in the background) -> one UserError.

    Orbax reports a failed background write at the next save or wait; after
    the first report later ones are dropped, so cleanup can finish.
    """
    try:
      yield
    except Exception as e:  # noqa: BLE001  (tensorstore raises ValueError, the OS OSError)
      if self._write_failed:
        return
      if not (getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e)):
        raise
      self._write_failed = True
      raise UserError(
          f"writing a checkpoint into {self.directory} failed: no space left on device; the "
          f"complete checkpoints ({self.all_steps() or 'none'}) are intact: free some space "
          "and rerun the same command to continue.") from None

  def wait(self) -> None:
    with self._write_errors():
      self._manager.wait_until_finished()

  def close(self) -> None:
    with self._write_errors():
      self._manager.close()
    if self._other is not None:
      self._other.close()


def read_dir(job_log_dir: str, restore_dir: str | None) -> str:
  """The checkpoints/ folder an eval, decode, infer or export run reads: that of
  --restore_checkpoint_dir (resolved) when given, else job_log_dir's."""
  return resolve_restore_dir(restore_dir) if restore_dir else checkpoint_dir(job_log_dir)


def resolve_restore_dir(path: str) -> str:
  """--restore_checkpoint_dir as a checkpoints/ folder (a job_log_dir is accepted too).

  Raises:
    UserError: the path does not exist or is not a directory.
  """
  path = os.path.abspath(os.path.expanduser(path))
  if not os.path.isdir(path):
    raise UserError(f"--restore_checkpoint_dir {path} does not exist or is not a directory; "
                    "pass the checkpoints/ folder of an earlier run.")
  nested = checkpoint_dir(path)
  if os.path.isdir(nested) and not any(n.startswith(STEP_PREFIX + "_")
                                       for n in os.listdir(path)):
    return nested
  return path
