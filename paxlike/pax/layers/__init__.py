"""praxis.layers: activations, the remat policy enum, the LM's layer templates, and the
basic layers a Pax user's own layers build from (linears, normalizations,
convolutions, poolings, stochastics).

The LM's layer classes are config targets of praxis's tree (`task_p.model.lm_tpl...`,
paxlike.pax.config_tree); the activation classes are paxlike's own. praxis's ResNets
and ClassificationModel (resnets, models) run as a Pax user's own model does.
"""

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
from paxlike.pax.layers import (
    activations,
    attentions,
    convolutions,
    embedding_softmax,
    gpu_fast_attention,
    grouped_query_attention,
    linears,
    models,
    multi_query_attention,
    normalizations,
    poolings,
    resnets,
    stochastics,
    transformer_models,
    transformers,
)
from paxlike.pax.layers.linears import Bias, Linear
from paxlike.pax.layers.models import ClassificationModel
from paxlike.pax.layers.resnets import ResNet, ResNetBasicBlock, ResNetBlock
from paxlike.pax.layers.stochastics import Dropout
from paxlike.pax.praxis_layers import (
    AttentionProjection,
    DotProductAttention,
    EinsumOp,
    Embedding,
    FeedForward,
    FullSoftmax,
    GroupedQueryAttention,
    GShardSharedEmbeddingSoftmax,
    LanguageModelType,
    LayerNorm,
    PipelinedTransformer,
    PositionalEmbedding,
    RelativeBias,
    RmsNorm,
    RotaryPositionalEmbedding,
    SharedEmbeddingSoftmax,
    StackedTransformer,
    StackedTransformerRepeated,
    TrainablePositionalEmbedding,
    Transformer,
    TransformerFeedForward,
    TransformerFeedForwardMoe,
    TransformerLm,
)
from paxlike.pax.user_layers import (
    BatchNorm,
    Conv2D,
    ConvBNAct,
    GlobalPooling,
    Pooling,
    StochasticResidual,
)

__all__ = [
    "GELU", "AttentionProjection", "AutodiffCheckpointType", "Bias", "Dropout", "EinsumOp",
    "GShardSharedEmbeddingSoftmax", "Linear", "RelativeBias", "TransformerFeedForwardMoe",
    "BaseActivation", "BatchNorm", "ClassificationModel",
    "Conv2D", "ConvBNAct", "DotProductAttention", "Embedding", "GlobalPooling", "Pooling",
    "ResNet", "ResNetBasicBlock", "ResNetBlock", "StochasticResidual",
    "FeedForward", "FullSoftmax", "GroupedQueryAttention", "Identity", "LanguageModelType",
    "LayerNorm", "PipelinedTransformer", "PositionalEmbedding", "ReLU", "RmsNorm",
    "RotaryPositionalEmbedding", "SiLU", "SharedEmbeddingSoftmax", "Sigmoid",
    "StackedTransformer", "StackedTransformerRepeated", "Swish", "Tanh",
    "TrainablePositionalEmbedding", "Transformer", "TransformerFeedForward", "TransformerLm",
    "activations", "attentions", "convolutions", "embedding_softmax", "gpu_fast_attention",
    "grouped_query_attention", "linears", "models", "multi_query_attention", "normalizations",
    "poolings", "resnets", "stochastics", "transformer_models", "transformers",
]
