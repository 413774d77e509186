"""praxis.layers.attentions: DotProductAttention."""

from paxlike.pax.praxis_layers import DotProductAttention

__all__ = ["DotProductAttention"]
