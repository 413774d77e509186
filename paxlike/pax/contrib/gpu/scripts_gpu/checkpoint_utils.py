"""paxml.contrib.gpu.scripts_gpu.checkpoint_utils: CheckpointRestoreMixin."""

from __future__ import annotations

from typing import Any

from paxlike.errors import UserError


class CheckpointRestoreMixin:
  """Pax's mixin that starts a run from a Pax checkpoint (CHECKPOINT_RESTORE_PATH).

  Without a path, configure_checkpoint_restore leaves the task as it is, as in
  Pax. With one it is refused: the path holds a Pax checkpoint, whose variable
  tree paxlike does not read. INIT_FROM starts a run from a paxlike job, a
  Hugging Face directory or a T5X checkpoint.
  """

  CHECKPOINT_RESTORE_PATH = None
  CHECKPOINT_IGNORE_RULES = None

  def configure_checkpoint_restore(self, task_p: Any) -> Any:
    if self.CHECKPOINT_RESTORE_PATH:
      raise UserError(f"CHECKPOINT_RESTORE_PATH={self.CHECKPOINT_RESTORE_PATH!r} restores a "
                      "Pax checkpoint, which paxlike does not read; INIT_FROM starts a run "
                      "from a paxlike job_log_dir, a Hugging Face directory or a T5X "
                      "checkpoint (docs/fine_tuning.md).")
    return task_p


__all__ = ["CheckpointRestoreMixin"]
