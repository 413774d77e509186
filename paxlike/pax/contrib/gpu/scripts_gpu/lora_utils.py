"""paxml.contrib.gpu.scripts_gpu.lora_utils: LoRAMixin."""

from __future__ import annotations

from typing import Any

from paxlike.errors import UserError
from paxlike.training_experiment import LoraHParams


class LoRAMixin(LoraHParams):
  """Pax's mixin whose configure_lora(task_p) gives the LM LoRA adapters when USE_LORA.

  Its knobs (USE_LORA, LORA_RANK, LORA_TARGET_LAYERS) are the templates' own
  (paxlike.training_experiment.LoraHParams): the LM, Llama and Flan-T5
  templates' model() and task() already give the model its adapters and the
  learner Pax's bprop_variable_inclusion, so a class that never calls
  configure_lora gets them too, and configure_lora only checks that its
  template did.
  """

  def configure_lora(self, task_p: Any) -> Any:
    if self.USE_LORA and getattr(task_p.model, "lora_rank", None) != self.LORA_RANK:
      raise UserError(f"USE_LORA=True on {type(self).__name__}, whose model has no LoRA "
                      "adapters; the models of paxlike's LM, Llama and Flan-T5 templates "
                      "have them.")
    return task_p


__all__ = ["LoRAMixin"]
