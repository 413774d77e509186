"""praxis.layers.grok: Grok's mixture-of-experts LM builder, importable and refused when called."""

from __future__ import annotations

from typing import Any

from paxlike.pax.layers.glam import refuse_moe


def GrokUniTransformerLmHParams(**kwargs: Any) -> Any:  # noqa: N802  (praxis's name)
  """praxis's Grok decoder-only LM config; refused: MoE is not modelled yet."""
  del kwargs
  refuse_moe("grok.GrokUniTransformerLmHParams", "Grok")


__all__ = ["GrokUniTransformerLmHParams"]
