"""paxml.contrib.gpu.scripts_gpu.lora_utils: LoRAMixin."""

from __future__ import annotations

from typing import Any

from paxlike.errors import UserError


class LoRAMixin:
  """Pax's mixin that swaps the LM's projections for LoRA ones when USE_LORA is True.

  With USE_LORA False (its default) configure_lora leaves the task as it is, as
  in Pax; True is refused: paxlike has no LoRA adapters yet.
  """

  USE_LORA = False
  LORA_RANK = 8
  LORA_TARGET_LAYERS = "all"

  def configure_lora(self, task_p: Any) -> Any:
    if self.USE_LORA:
      raise UserError(f"USE_LORA=True (LORA_RANK={self.LORA_RANK}, LORA_TARGET_LAYERS="
                      f"{self.LORA_TARGET_LAYERS!r}): paxlike has no LoRA adapters yet; set "
                      "USE_LORA=False to fine-tune every parameter.")
    return task_p


__all__ = ["LoRAMixin"]
