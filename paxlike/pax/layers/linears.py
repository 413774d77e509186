"""praxis.layers.linears: Linear, Bias and FeedForward (also the softmax's feed_forward_tpl)."""

from paxlike.pax.user_layers import Bias, FeedForward, Linear

__all__ = ["Bias", "FeedForward", "Linear"]
