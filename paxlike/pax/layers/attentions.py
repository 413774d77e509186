"""praxis.layers.attentions: DotProductAttention and its sub-templates."""

from paxlike.pax.praxis_layers import (
    AttentionProjection,
    CombinedQKVProjectionLayer,
    DotProductAttention,
    RelativeBias,
)

__all__ = ["AttentionProjection", "CombinedQKVProjectionLayer", "DotProductAttention",
           "RelativeBias"]
