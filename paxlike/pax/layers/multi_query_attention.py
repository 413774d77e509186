"""praxis.layers.multi_query_attention: MultiQueryDotProductAttention (Grok's attention)."""

from paxlike.pax.praxis_layers import MultiQueryDotProductAttention, OneHeadedAttentionProjection

__all__ = ["MultiQueryDotProductAttention", "OneHeadedAttentionProjection"]
