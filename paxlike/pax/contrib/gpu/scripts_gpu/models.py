"""praxis.contrib.gpu.scripts_gpu.models: CustomMetricsLM, the GPU configs' MODEL_CLASS."""

from __future__ import annotations

from typing import Any

from paxlike.errors import UserError
from paxlike.models.language_model import LanguageModel

EVAL_TASKS = (None, "lambada")


class CustomMetricsLM(LanguageModel):
  """paxlike's LanguageModel with the fields praxis's CustomMetricsLM adds to its LM.

  eval_task='lambada' reports praxis's acc_strict on eval, as report_strict_acc
  does: the fraction of rows whose every weighted token is predicted (for
  LAMBADA, the whole last word). BoolQ's yes/no accuracy (eval_task='boolq',
  boolq_yn_tokens) and the praxis LM's return_predictions and count_tokens are
  refused when set: paxlike does not compute them yet.
  """

  return_predictions: bool = False
  count_tokens: bool = False
  eval_task: str | None = None
  boolq_yn_tokens: Any = None

  def __post_init__(self) -> None:
    asked = {name: getattr(self, name) for name in (
        "return_predictions", "count_tokens", "boolq_yn_tokens")
        if getattr(self, name) is not None and getattr(self, name) is not False}
    if self.eval_task not in EVAL_TASKS:
      asked = {"eval_task": self.eval_task, **asked}
    if asked:
      shown = ", ".join(f"{k}={v!r}" for k, v in asked.items())
      raise UserError(f"CustomMetricsLM {shown}: paxlike does not compute these eval outputs "
                      "yet (BoolQ's yes/no accuracy, per-example predictions, token counts); "
                      "leave them at their defaults (eval_task may be 'lambada').")
    super().__post_init__()

  @property
  def strict_accuracy(self) -> bool:
    return self.report_strict_acc or self.eval_task == "lambada"


__all__ = ["CustomMetricsLM"]
