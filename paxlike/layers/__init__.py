"""flax.linen layers that carry logical axis names (the praxis role)."""

from paxlike.layers.attention import DotProductAttention
from paxlike.layers.embedding import SharedEmbeddingSoftmax, sinusoidal_position_embedding
from paxlike.layers.linear import FeedForward, LayerNorm, Linear
from paxlike.layers.transformer import CHECKPOINT_POLICIES, StackedTransformer, TransformerLayer

__all__ = [
    "CHECKPOINT_POLICIES", "DotProductAttention", "FeedForward", "LayerNorm", "Linear",
    "SharedEmbeddingSoftmax", "StackedTransformer", "TransformerLayer",
    "sinusoidal_position_embedding",
]
