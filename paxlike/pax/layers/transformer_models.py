"""praxis.layers.transformer_models: TransformerLm and LanguageModelType."""

from paxlike.pax.praxis_layers import LanguageModelType, TransformerLm

__all__ = ["LanguageModelType", "TransformerLm"]
