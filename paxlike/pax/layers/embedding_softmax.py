"""praxis.layers.embedding_softmax: the LM's tables and position embeddings."""

from paxlike.pax.praxis_layers import (
    Embedding,
    FullSoftmax,
    GShardSharedEmbeddingSoftmax,
    PositionalEmbedding,
    RotaryPositionalEmbedding,
    SharedEmbeddingSoftmax,
    TrainablePositionalEmbedding,
)

__all__ = ["Embedding", "FullSoftmax", "GShardSharedEmbeddingSoftmax", "PositionalEmbedding",
           "RotaryPositionalEmbedding", "SharedEmbeddingSoftmax", "TrainablePositionalEmbedding"]
