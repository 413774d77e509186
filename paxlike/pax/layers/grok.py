"""praxis.layers.grok: Grok's mixture-of-experts LM builder, importable and refused when called."""

from __future__ import annotations

from typing import Any

from paxlike.errors import UserError


def GrokUniTransformerLmHParams(**kwargs: Any) -> Any:  # noqa: N802  (praxis's name)
  """praxis's Grok decoder-only LM config; refused in one line."""
  del kwargs
  raise UserError("grok.GrokUniTransformerLmHParams builds Grok's mixture-of-experts LM (its "
                  "experts beside grouped-query attention with rotary positions), which "
                  "paxlike does not model yet; glam.GlamUniTransformerLmHParams builds GLaM's.")


__all__ = ["GrokUniTransformerLmHParams"]
