"""Decode metrics beyond exact match: ROUGE-L and BLEU (the `metrics` extra).

Both on a 0-100 scale, as T5X reports them: `rougeL` is the mean ROUGE-L
F-measure of each (target, prediction) pair (Google's rouge-score, with
stemming), `bleu` is sacrebleu's corpus BLEU over all pairs.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from paxlike.errors import UserError

NAMES = {"rouge": "rouge_score", "bleu": "sacrebleu"}  # METRICS name -> the package it needs
INSTALL = "pip install -e '.[metrics]'"


def check(names: Sequence[str]) -> tuple[str, ...]:
  """The metric names, checked: known and installed.

  Raises:
    UserError: an unknown name, or a metric whose package is not installed.
  """
  names = tuple(names or ())
  for name in names:
    if name not in NAMES:
      raise UserError(f"METRICS has {name!r}; the decode metrics are {sorted(NAMES)} "
                      "(exact match is always reported).")
    if importlib.util.find_spec(NAMES[name]) is None:
      raise UserError(f"METRICS={list(names)} needs the {NAMES[name]} package; run {INSTALL}.")
  return names


def rouge_l(targets: Sequence[str], predictions: Sequence[str]) -> float:
  from rouge_score import rouge_scorer

  scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
  scores = [scorer.score(t, p)["rougeL"].fmeasure for t, p in zip(targets, predictions,
                                                                   strict=True)]
  return 100.0 * sum(scores) / max(len(scores), 1)


def bleu(targets: Sequence[str], predictions: Sequence[str]) -> float:
  import sacrebleu

  return float(sacrebleu.corpus_bleu(list(predictions), [list(targets)]).score)


def compute(names: Sequence[str], targets: Sequence[str],
            predictions: Sequence[str]) -> dict[str, float]:
  """{"rougeL": ..., "bleu": ...} for the names asked for."""
  out = {}
  if "rouge" in names:
    out["rougeL"] = rouge_l(targets, predictions)
  if "bleu" in names:
    out["bleu"] = bleu(targets, predictions)
  return out
