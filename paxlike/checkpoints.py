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

import dataclasses
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import serialization

from paxlike.errors import UserError

STEP_PREFIX = "checkpoint"
STEP_DIGITS = 8
FORMATS = ("tensorstore", "msgpack")
MSGPACK_FILE = "state.msgpack"


class MsgpackHandler(ocp.CheckpointHandler):
  """A pytree of host arrays in one msgpack file, written by process 0."""

  def save(self, directory: epath.Path, args: MsgpackSave) -> None:
    if jax.process_index() == 0:
      tree = jax.tree.map(lambda x: np.asarray(jax.device_get(x)), args.item)
      (directory / MSGPACK_FILE).write_bytes(serialization.msgpack_serialize(
          serialization.to_state_dict(tree)))

  def restore(self, directory: epath.Path, args: MsgpackRestore) -> Any:
    raw = serialization.msgpack_restore((directory / MSGPACK_FILE).read_bytes())
    return serialization.from_state_dict(args.item, raw)


@ocp.args.register_with_handler(MsgpackHandler, for_save=True)
@dataclasses.dataclass
class MsgpackSave(ocp.args.CheckpointArgs):
  item: Any


@ocp.args.register_with_handler(MsgpackHandler, for_restore=True)
@dataclasses.dataclass
class MsgpackRestore(ocp.args.CheckpointArgs):
  item: Any  # the target pytree (structure; leaves may be ShapeDtypeStructs)


def checkpoint_dir(job_log_dir: str) -> str:
  return os.path.join(job_log_dir, "checkpoints")


class Checkpointer:
  """A CheckpointManager wrapper with Pax's directory names.

  Args:
    directory: the checkpoints/ folder.
    max_to_keep: how many step directories to keep (None keeps all).
    async_save: write in the background while training continues.
    read_only: restore only (never create or delete anything).
    state_format: how save() writes the state, one of FORMATS.
  """

  def __init__(self, directory: str, max_to_keep: int | None = 10, async_save: bool = True,
               read_only: bool = False, state_format: str = "tensorstore") -> None:
    if state_format not in FORMATS:
      raise ValueError(f"state_format must be one of {FORMATS}, got {state_format!r}")
    self.directory = directory
    self.state_format = state_format
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        step_prefix=STEP_PREFIX,
        step_format_fixed_length=STEP_DIGITS,
        enable_async_checkpointing=async_save,
        create=not read_only,
        read_only=read_only,
        cleanup_tmp_directories=not read_only,
    )
    self._manager = ocp.CheckpointManager(
        epath.Path(directory), options=options, item_names=("state", "input"))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def step_path(self, step: int) -> str:
    return os.path.join(self.directory, f"{STEP_PREFIX}_{step:0{STEP_DIGITS}d}")

  def save(self, step: int, state: Any, input_state: dict[str, Any]) -> None:
    """Starts saving; returns once the arrays are copied off the device."""
    state_args = (ocp.args.StandardSave(state) if self.state_format == "tensorstore"
                  else MsgpackSave(state))
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
    state_args = (ocp.args.StandardRestore(abstract_state)
                  if self.format_of(step) == "tensorstore" else MsgpackRestore(abstract_state))
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=state_args, input=ocp.args.JsonRestore()))
    return restored["state"], dict(restored["input"] or {})

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()
