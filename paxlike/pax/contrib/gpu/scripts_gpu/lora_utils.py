"""paxml.contrib.gpu.scripts_gpu.lora_utils: LoRAMixin."""

from __future__ import annotations

from typing import Any

from paxlike.errors import UserError
from paxlike.layers.linear import LORA_NAMES, lora_targets


class LoRAMixin:
  """Pax's mixin whose configure_lora(task_p) gives the LM LoRA adapters when USE_LORA.

  As Pax's: LORA_RANK-wide adapters on LORA_TARGET_LAYERS' projections ('all',
  'attention': the q/k/v (or combined) and output projections, 'mlp': the
  feed-forward's), and the learner trains only them
  (bprop_variable_inclusion). paxlike's LM templates read the same knobs
  themselves (paxlike.training_experiment.LoraHParams), so a class that
  never calls configure_lora gets its adapters too; calling it again
  changes nothing.
  """

  USE_LORA = False
  LORA_RANK = 8
  LORA_TARGET_LAYERS = "all"

  def configure_lora(self, task_p: Any) -> Any:
    if not self.USE_LORA:
      return task_p
    lora_targets(self.LORA_RANK, self.LORA_TARGET_LAYERS)
    if not hasattr(task_p.model, "lora_rank"):
      raise UserError(f"USE_LORA=True on {type(self).__name__}, whose model has no LoRA "
                      "adapters; the models of paxlike's LM, Llama and Flan-T5 templates "
                      "have them.")
    task_p.model.lora_rank = self.LORA_RANK
    task_p.model.lora_target_layers = self.LORA_TARGET_LAYERS
    task_p.train.learner.bprop_variable_inclusion = [LORA_NAMES]
    return task_p


__all__ = ["LoRAMixin"]
