"""praxis.layers.activations: paxlike's activation classes."""

from paxlike.layers.activations import (
    GELU,
    BaseActivation,
    Identity,
    ReLU,
    Sigmoid,
    SiLU,
    Swish,
    Tanh,
)

__all__ = ["GELU", "BaseActivation", "Identity", "ReLU", "SiLU", "Sigmoid", "Swish", "Tanh"]
