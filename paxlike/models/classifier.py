"""Pax's MLP classifier (praxis's ClassificationMLPModel): lm_cloud.py's SmallMlp and LargeMlp.

Each token id is looked up in the shared softmax's table, goes through
`num_layers` ReLU feed-forward layers with biases (praxis's MLPBlock: the
first from input_dims to hidden_dims, the last to output_dims, the final
one activated too), and is classified by the same table (its logits, plus
a bias). The parameters carry praxis's names (`mlp_layers_0/mlp_layers_1/
linear/w`, `softmax/logits_ffn/...`) and its Xavier-uniform initialisation.

What the learner minimises is praxis's total_loss for this model: the
accuracy of the logits' argmax against the labels. That has no gradient,
so, in Pax as here, a train step is the forward pass and the optimizer's
weight decay: the model is Pax's throughput benchmark of a plain MLP, not a
classifier that learns. The model FLOPs of a step (and so its MFU) count
the forward's matmuls only, the work the step does. log_pplx reports the
softmax's cross-entropy beside it, which praxis computes and does not show.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from paxlike.layers.linear import project
from paxlike.models.base import BaseModel, NoDecoder
from paxlike.models.language_model import weighted_loss

# Logical names of the weights' dims; the experiment maps them to mesh axes
# (MLP_WEIGHT_SHARDING, SOFTMAX_WEIGHT_SHARDING; paxlike.classifier_experiments).
MLP_AXES = ("mlp_in", "mlp_out")
SOFTMAX_AXES = ("softmax_in", "softmax_classes")


class _Dense(nn.Module):
  """praxis's FeedForward: `linear/w` [in, out] (Xavier uniform), `bias/b` [out] (zeros)."""

  features: int
  axes: Sequence[str]
  activation: bool = True

  def setup(self) -> None:
    self.linear = _Weight(self.features, tuple(self.axes))
    self.bias = _Bias(self.features, tuple(self.axes[1:]))

  def __call__(self, x: jax.Array) -> jax.Array:
    y = project(x, self.linear.w(x.shape[-1])) + self.bias.b()
    return jax.nn.relu(y) if self.activation else y


class _Weight(nn.Module):
  features: int
  axes: tuple[str, ...]

  @nn.compact
  def w(self, in_dims: int) -> jax.Array:
    return self.param("w", nn.with_logical_partitioning(nn.initializers.xavier_uniform(),
                                                        self.axes),
                      (in_dims, self.features), jnp.float32)


class _Bias(nn.Module):
  features: int
  axes: tuple[str, ...]

  @nn.compact
  def b(self) -> jax.Array:
    return self.param("b", nn.with_logical_partitioning(nn.initializers.zeros, self.axes),
                      (self.features,), jnp.float32)


class _Mlp(nn.Module):
  """praxis's MLPBlock, named `mlp_layers_<i>` layer by layer as its children are."""

  num_layers: int
  hidden_dims: int
  output_dims: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    for i in range(self.num_layers):
      out = self.output_dims if i == self.num_layers - 1 else self.hidden_dims
      x = _Dense(out, MLP_AXES, name=f"mlp_layers_{i}")(x)
    return x


class ClassificationMLP(NoDecoder, BaseModel):
  """praxis's ClassificationMLPModel; see the module docstring."""

  NO_DECODER = ("an MLP classifier (ClassificationMLP) has no decoder to decode, infer or "
                "export with")

  num_layers: int = 8
  input_dims: int = 4096
  hidden_dims: int = 7168
  output_dims: int = 4096
  num_classes: int = 4096

  def setup(self) -> None:
    # ClassificationModelAdam.validate checks the dims (at least a layer, output = input).
    self.mlp_layers_0 = _Mlp(self.num_layers, self.hidden_dims, self.output_dims)
    self.softmax = _Softmax(self.num_classes, self.input_dims)

  @property
  def vocab_size(self) -> int:
    """The ids an input may hold: the table's rows, one per class."""
    return self.num_classes

  def logits(self, ids: jax.Array) -> jax.Array:
    """[batch, time, num_classes] float32 logits of the ids' MLP outputs."""
    return self.softmax(self.mlp_layers_0(self.softmax.lookup(ids)))

  def fprop(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(the accuracy, the LM's metrics): praxis's total_loss for this model is the accuracy."""
    _, metrics = weighted_loss(self.logits(batch["ids"]), batch["labels"], batch["weights"])
    metrics["loss"] = metrics["accuracy"]
    return metrics["accuracy"], metrics

  def input_features(self) -> tuple[str, ...]:
    return ("ids", "labels", "weights")

  def decode_features(self) -> tuple[str, ...]:
    return ("ids",)

  def matmul_params(self) -> int:
    """The weights a token's forward multiplies by: every layer's and the softmax's."""
    dims = [self.input_dims] + [self.hidden_dims] * (self.num_layers - 1) + [self.output_dims]
    return sum(a * b for a, b in zip(dims, dims[1:], strict=False)) + (
        self.input_dims * self.num_classes)

  def model_flops_per_step(self, specs: dict[str, jax.ShapeDtypeStruct]) -> float:
    """The forward's matmul FLOPs: the step computes no gradient (the module docstring)."""
    return 2.0 * self.matmul_params() * self.tokens_per_step(specs)

  def tokens_per_step(self, specs: dict[str, jax.ShapeDtypeStruct]) -> int:
    return int(np.prod(specs["ids"].shape[:2]))

  def compute_dtype(self) -> str:
    return "float32"


class _Softmax(nn.Module):
  """praxis's SharedEmbeddingSoftmax: the logits' `logits_ffn` (w [input_dims, num_classes],
  a bias), whose w's transpose is the table ids are looked up in (unscaled)."""

  num_classes: int
  input_dims: int

  def setup(self) -> None:
    self.logits_ffn = _Dense(self.num_classes, SOFTMAX_AXES, activation=False)

  def lookup(self, ids: jax.Array) -> jax.Array:
    return jnp.take(self.logits_ffn.linear.w(self.input_dims).T, ids, axis=0)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.logits_ffn(x)
