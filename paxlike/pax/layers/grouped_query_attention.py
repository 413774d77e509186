"""praxis.layers.grouped_query_attention: GroupedQueryAttention (GQA, optional RoPE)."""

from paxlike.pax.praxis_layers import GroupedQueryAttention

__all__ = ["GroupedQueryAttention"]
