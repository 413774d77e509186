"""praxis.layers: the activation classes and the remat policy enum experiment files name."""

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
from paxlike.layers.transformer import AutodiffCheckpointType
from paxlike.pax.layers import activations

__all__ = ["GELU", "AutodiffCheckpointType", "BaseActivation", "Identity", "ReLU", "SiLU",
           "Sigmoid", "Swish", "Tanh", "activations"]
