"""praxis.contrib.gpu.scripts_gpu.models: CustomMetricsLM, the GPU configs' MODEL_CLASS.

praxis's CustomMetricsLM adds zero-shot eval metrics to its LM:
- eval_task='lambada' reports acc_strict, as report_strict_acc does: the
  fraction of rows whose every weighted token is predicted (for LAMBADA, the
  whole last word);
- eval_task='boolq' reports boolq_acc, the fraction of rows whose answer token
  has a higher logit than the other of boolq_yn_tokens (the 'yes' and 'no'
  ids).

CustomMetricsLM is paxlike's LanguageModel with those fields; the Pax LLaMA
template (llama_utils.BaseLLaMA) builds CustomMetricsLlama, paxlike's Llama
family model with the same fields. The praxis LM's return_predictions and
count_tokens are refused when set: paxlike does not compute them.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from paxlike.errors import UserError
from paxlike.models.language_model import LanguageModel, sample_weighted, weighted_loss
from paxlike.models.llama import LlamaModel

EVAL_TASKS = (None, "lambada", "boolq")


def _checked(module: Any) -> None:
  """Refuses what paxlike does not compute; keeps boolq_yn_tokens as a pair of ints."""
  asked = {name: getattr(module, name) for name in ("return_predictions", "count_tokens")
           if getattr(module, name)}
  if module.eval_task not in EVAL_TASKS:
    asked = {"eval_task": module.eval_task, **asked}
  if asked:
    shown = ", ".join(f"{k}={v!r}" for k, v in asked.items())
    raise UserError(f"CustomMetricsLM {shown}: paxlike does not compute these eval outputs "
                    "(per-example predictions, token counts); leave them at their defaults "
                    f"(eval_task is one of {EVAL_TASKS}).")
  if module.eval_task == "boolq":
    given = module.boolq_yn_tokens
    words = [] if given is None else [np.ravel(np.asarray(w)) for w in given]
    ids = tuple(int(w[0]) for w in words if w.size == 1)
    if len(ids) != 2 or len(words) != 2:
      raise UserError(f"CustomMetricsLM eval_task='boolq' needs boolq_yn_tokens, the ids of "
                      f"'yes' and 'no', one token each; got {module.boolq_yn_tokens!r}.")
    object.__setattr__(module, "boolq_yn_tokens", ids)


def _strict(module: Any) -> bool:
  """Whether fprop counts rows predicted whole (acc_strict)."""
  return module.report_strict_acc or module.eval_task == "lambada"


def _yes_no(module: Any) -> tuple[int, int] | None:
  """The ids whose logits fprop compares (boolq_acc), or None."""
  return module.boolq_yn_tokens if module.eval_task == "boolq" else None


class CustomMetricsLM(LanguageModel):
  """paxlike's LanguageModel with praxis's CustomMetricsLM fields (see the module)."""

  return_predictions: bool = False
  count_tokens: bool = False
  eval_task: str | None = None
  boolq_yn_tokens: Any = None

  def __post_init__(self) -> None:
    _checked(self)
    super().__post_init__()

  @property
  def strict_accuracy(self) -> bool:
    return _strict(self)

  @property
  def yes_no_tokens(self) -> tuple[int, int] | None:
    return _yes_no(self)


class CustomMetricsLlama(LlamaModel):
  """paxlike's Llama family model with praxis's CustomMetricsLM fields, and its
  apply_eval_sample_weights and report_strict_acc (see the module)."""

  return_predictions: bool = False
  count_tokens: bool = False
  eval_task: str | None = None
  boolq_yn_tokens: Any = None
  apply_eval_sample_weights: bool = False
  report_strict_acc: bool = False

  def __post_init__(self) -> None:
    _checked(self)
    super().__post_init__()

  def optional_features(self) -> tuple[str, ...]:
    return ("eval_sample_weights",) if self.apply_eval_sample_weights else ()

  def fprop(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    logits = self(batch["ids"], batch.get("positions"), batch.get("segment_ids"))
    return weighted_loss(logits, batch["labels"],
                         sample_weighted(batch, self.apply_eval_sample_weights),
                         _strict(self), _yes_no(self))


__all__ = ["CustomMetricsLM", "CustomMetricsLlama"]
