"""praxis.layers.poolings: Pooling, for a Pax user's own layers."""

from paxlike.pax.user_layers import Pooling

__all__ = ["Pooling"]
