"""paxml.contrib.gpu.scripts_gpu.checkpoint_utils: CheckpointRestoreMixin."""

from __future__ import annotations

from typing import Any


class CheckpointRestoreMixin:
  """Pax's mixin that starts a run from a Pax checkpoint (CHECKPOINT_RESTORE_PATH).

  The path is read as INIT_FROM = "pax:PATH" (paxlike.initial,
  paxlike.interop.pax): a Pax LLaMA checkpoint, such as saxml's
  convert_llama_ckpt.py writes, gives the first step's weights and the
  optimizer starts fresh, as in Pax. configure_checkpoint_restore leaves the
  task as it is; CHECKPOINT_IGNORE_RULES (Pax variable names to keep fresh)
  is refused, pointing to INIT_FROM_RULES.
  """

  CHECKPOINT_RESTORE_PATH = None
  CHECKPOINT_IGNORE_RULES = None

  def configure_checkpoint_restore(self, task_p: Any) -> Any:
    """The task as it is; the path and rules are read (a class whose task() does not call
    this leaves them unread, and is refused for it, where Pax ignored them)."""
    _ = (self.CHECKPOINT_RESTORE_PATH, self.CHECKPOINT_IGNORE_RULES)  # read: initial.InitFrom
    return task_p


__all__ = ["CheckpointRestoreMixin"]
