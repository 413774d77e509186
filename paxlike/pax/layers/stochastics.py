"""praxis.layers.stochastics: Dropout and StochasticResidual, for a Pax user's own layers."""

from paxlike.pax.user_layers import Dropout, StochasticResidual

__all__ = ["Dropout", "StochasticResidual"]
