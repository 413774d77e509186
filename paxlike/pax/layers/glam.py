"""praxis.layers.glam: GLaM's mixture-of-experts LM builder, importable and refused when called.

A Pax file that uses it imports and registers; calling it (in task()) is
refused in one line, since paxlike has no mixture-of-experts layers yet.
"""

from __future__ import annotations

from typing import Any

from paxlike.errors import UserError


def GlamUniTransformerLmHParams(**kwargs: Any) -> Any:  # noqa: N802  (praxis's name)
  """praxis's GLaM decoder-only LM config; refused: MoE is not modelled yet."""
  del kwargs
  raise UserError("glam.GlamUniTransformerLmHParams builds a GLaM mixture-of-experts LM; MoE "
                  "is not modelled yet in paxlike, so use a dense template "
                  "(model_params.TransformerLmSpmdAdafactor / c4.TransformerLmSpmdAdam).")


__all__ = ["GlamUniTransformerLmHParams"]
