"""praxis.layers.convolutions: Conv2D and ConvBNAct, for a Pax user's own layers."""

from paxlike.pax.user_layers import Conv2D, ConvBNAct

__all__ = ["Conv2D", "ConvBNAct"]
