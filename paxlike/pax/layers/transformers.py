"""praxis.layers.transformers: the layer-stack classes Pax files compare and configure."""

from paxlike.pax.praxis_layers import (
    PipelinedTransformer,
    StackedTransformer,
    StackedTransformerRepeated,
    Transformer,
    TransformerFeedForward,
    TransformerFeedForwardMoe,
)

__all__ = ["PipelinedTransformer", "StackedTransformer", "StackedTransformerRepeated",
           "Transformer", "TransformerFeedForward", "TransformerFeedForwardMoe"]
