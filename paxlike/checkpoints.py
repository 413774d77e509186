"""Orbax checkpoints: job_log_dir/checkpoints/checkpoint_<step:08d>/.

Each checkpoint holds the train state (sharded arrays, via tensorstore) and
the input position (JSON). Saves are asynchronous; a step directory becomes
visible only once complete (orbax writes to a temporary name and renames).
"""

from __future__ import annotations

import os
from typing import Any

import orbax.checkpoint as ocp
from etils import epath

from paxlike.errors import UserError

STEP_PREFIX = "checkpoint"
STEP_DIGITS = 8


def checkpoint_dir(job_log_dir: str) -> str:
  return os.path.join(job_log_dir, "checkpoints")


class Checkpointer:
  """A CheckpointManager wrapper with Pax's directory names.

  Args:
    directory: the checkpoints/ folder.
    max_to_keep: how many step directories to keep (None keeps all).
    async_save: write in the background while training continues.
    read_only: restore only (never create or delete anything).
  """

  def __init__(self, directory: str, max_to_keep: int | None = 10, async_save: bool = True,
               read_only: bool = False) -> None:
    self.directory = directory
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
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), input=ocp.args.JsonSave(input_state)), force=True)

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
    """Restores into abstract_state's shapes, dtypes and shardings."""
    if step not in self._manager.all_steps():
      raise UserError(f"no checkpoint for step {step} in {self.directory}; "
                      f"available: {self.all_steps() or 'none'}.")
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), input=ocp.args.JsonRestore()))
    return restored["state"], dict(restored["input"] or {})

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()
