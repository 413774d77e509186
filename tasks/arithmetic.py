"""Small-integer addition as text: "37+45=" -> "82"; and subtraction: "37-45=" -> "-8".

Defined once as plain Python: `examples(split)` and `score(targets,
predictions)`. The native TextInput reads it through its `generator` field
("tasks.arithmetic:examples"); tasks/seqio_tasks.py registers the same
generator as a SeqIO task.

Every pair (a, b) with 0 <= a, b < MAX_OPERAND is an example; a fixed,
seeded set of TEST_SIZE pairs is held out for the "test" split, so test
prompts are never seen in training. `subtraction_examples(split)` is the
same over "a-b=" -> str(a - b) (negative results included), with the same
held-out pairs; it is the second task that fine-tuning from addition learns.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MAX_OPERAND = 100
TEST_SIZE = 500
SPLIT_SEED = 20260101


def _pairs() -> np.ndarray:
  a, b = np.meshgrid(np.arange(MAX_OPERAND), np.arange(MAX_OPERAND), indexing="ij")
  return np.stack([a.ravel(), b.ravel()], axis=1)


def _split_mask() -> np.ndarray:
  """True for the held-out test pairs."""
  pairs = _pairs()
  test = np.random.default_rng(SPLIT_SEED).choice(len(pairs), TEST_SIZE, replace=False)
  mask = np.zeros(len(pairs), bool)
  mask[test] = True
  return mask


def example(a: int, b: int) -> dict[str, str]:
  return {"inputs": f"{a}+{b}=", "targets": str(a + b)}


def subtraction_example(a: int, b: int) -> dict[str, str]:
  return {"inputs": f"{a}-{b}=", "targets": str(a - b)}


def _split_pairs(split: str) -> np.ndarray:
  if split not in ("train", "test"):
    raise ValueError(f"unknown split {split!r}; use 'train' or 'test'")
  mask = _split_mask()
  return _pairs()[mask if split == "test" else ~mask]


def examples(split: str) -> list[dict[str, str]]:
  """'train' (all but the held-out pairs) or 'test' (the held-out pairs), in a fixed order."""
  return [example(int(a), int(b)) for a, b in _split_pairs(split)]


def subtraction_examples(split: str) -> list[dict[str, str]]:
  """Like examples(), for a - b: the same pairs held out, so test prompts are unseen."""
  return [subtraction_example(int(a), int(b)) for a, b in _split_pairs(split)]


def score(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
  """Exact match of the answer text, ignoring surrounding whitespace."""
  if not targets:
    return {"exact_match": 0.0}
  hits = sum(t.strip() == p.strip() for t, p in zip(targets, predictions, strict=True))
  return {"exact_match": hits / len(targets)}
