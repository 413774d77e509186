"""praxis.layers.normalizations: LayerNorm, RmsNorm and BatchNorm."""

from paxlike.pax.praxis_layers import LayerNorm, RmsNorm
from paxlike.pax.user_layers import BatchNorm

__all__ = ["BatchNorm", "LayerNorm", "RmsNorm"]
