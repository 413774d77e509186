"""paxlike.export.load: an export read back, to check it against its checkpoint."""

from __future__ import annotations

from typing import Any


def load(path: str) -> Any:
  """Loads a StableHLO export directory with its own runner (see paxlike/export/runner.py).

  Returns:
    A runner.Decoder: `decoder(features, seed=0) -> (tokens, scores)` over
    token ids, `decoder.generate(texts)` from text, `decoder.manifest`.
  """
  from paxlike.export import runner

  return runner.load(path)
