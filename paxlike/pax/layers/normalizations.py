"""praxis.layers.normalizations: LayerNorm and RmsNorm."""

from paxlike.pax.praxis_layers import LayerNorm, RmsNorm

__all__ = ["LayerNorm", "RmsNorm"]
