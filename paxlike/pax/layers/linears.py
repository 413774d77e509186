"""praxis.layers.linears: FeedForward (the softmax's feed_forward_tpl)."""

from paxlike.pax.praxis_layers import FeedForward

__all__ = ["FeedForward"]
