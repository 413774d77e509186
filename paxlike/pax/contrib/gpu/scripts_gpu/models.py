"""praxis.contrib.gpu.scripts_gpu.models: CustomMetricsLM, the GPU configs' MODEL_CLASS."""

from __future__ import annotations

from typing import Any

from paxlike.errors import UserError
from paxlike.models.language_model import LanguageModel


class CustomMetricsLM(LanguageModel):
  """paxlike's LanguageModel with the fields praxis's CustomMetricsLM adds to its LM.

  At their defaults the model is the LanguageModel (apply_eval_sample_weights is
  the LanguageModel's own; report_strict_acc is noted as not applied, as on any
  LM config). The zero-shot eval metrics (eval_task 'lambada' or 'boolq') and
  the praxis LM's return_predictions and count_tokens are refused when set:
  paxlike does not compute them yet.
  """

  return_predictions: bool = False
  count_tokens: bool = False
  eval_task: str | None = None
  boolq_yn_tokens: Any = None

  def __post_init__(self) -> None:
    asked = {name: getattr(self, name) for name in (
        "return_predictions", "count_tokens", "eval_task", "boolq_yn_tokens")
        if getattr(self, name) is not None and getattr(self, name) is not False}
    if asked:
      shown = ", ".join(f"{k}={v!r}" for k, v in asked.items())
      raise UserError(f"CustomMetricsLM {shown}: paxlike does not compute these eval outputs "
                      "yet (Lambada's strict accuracy, BoolQ's yes/no accuracy, per-example "
                      "predictions, token counts); leave them at their defaults.")
    super().__post_init__()


__all__ = ["CustomMetricsLM"]
