"""praxis.layers.glam: GLaM's mixture-of-experts LM builder, importable and refused when called.

A Pax file that uses it imports and registers; calling it (in task()) is
refused in one line, since paxlike has no mixture-of-experts layers yet.
"""

from __future__ import annotations

from typing import Any

from paxlike.errors import UserError


def refuse_moe(builder: str, family: str) -> None:
  """The one line for a praxis MoE LM builder (glam, grok)."""
  raise UserError(f"{builder} builds a {family} mixture-of-experts LM; MoE is not modelled yet "
                  "in paxlike, so use a dense template (model_params.TransformerLmSpmdAdafactor "
                  "/ c4.TransformerLmSpmdAdam).")


def GlamUniTransformerLmHParams(**kwargs: Any) -> Any:  # noqa: N802  (praxis's name)
  """praxis's GLaM decoder-only LM config; refused: MoE is not modelled yet."""
  del kwargs
  refuse_moe("glam.GlamUniTransformerLmHParams", "GLaM")


__all__ = ["GlamUniTransformerLmHParams", "refuse_moe"]
