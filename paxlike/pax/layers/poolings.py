"""praxis.layers.poolings: Pooling and GlobalPooling, for a Pax user's own layers."""

from paxlike.pax.user_layers import GlobalPooling, Pooling

__all__ = ["GlobalPooling", "Pooling"]
