"""praxis.layers.stochastics: Dropout, for a Pax user's own layers."""

from paxlike.pax.user_layers import Dropout

__all__ = ["Dropout"]
