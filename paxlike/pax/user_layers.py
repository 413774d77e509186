"""praxis's basic layers, runnable, for a Pax user's own BaseLayer models (paxml's mnist.py).

Linear, Bias and FeedForward (praxis.layers.linears), LayerNorm and RmsNorm
(normalizations), Conv2D and ConvBNAct (convolutions), Pooling (poolings)
and Dropout (stochastics), with praxis's fields, variable names
(`w`, `b`), initialisers and arithmetic, BatchNorm (normalizations), whose
moving statistics are non-trainable variables a train step moves,
GlobalPooling, StochasticResidual, and the runnable FullSoftmax a classifier
makes from the LM tree's node (embedding_softmax).
They are BaseLayers (paxlike.pax.base_layer), so a user's layer makes them
with create_child from a pax_fiddle.Config, as in Pax. What praxis offers
and paxlike does not run is refused when the layer is set up: weight
normalisation, causal and TF-equivalent padding, and pooling over paddings.

FeedForward (the softmax's `feed_forward_tpl`) and the norms are also nodes of
praxis's LM config tree: paxlike.pax.config_tree reads them there and builds
no layer from them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from paxlike.errors import UserError
from paxlike.layers import activations
from paxlike.partitioning.pmap import pmap_axis
from paxlike.pax import pax_fiddle
from paxlike.pax.base_layer import (
    BaseLayer,
    WeightHParams,
    WeightInit,
    maybe_shard,
    template_field,
)


def _refuse(layer: BaseLayer, what: str) -> None:
  raise UserError(f"{type(layer).__name__}: {what} is not run by paxlike.")


class Linear(BaseLayer):
  """praxis's Linear: `w` [input_dims, output_dims], no bias."""

  input_dims: int = 0
  output_dims: int = 0
  weight_init: Any = None
  einsum_tpl: Any = None

  def setup(self) -> None:
    if self.einsum_tpl is not None:
      _refuse(self, "einsum_tpl (a quantized or custom einsum)")
    self.create_variable("w", WeightHParams(shape=[self.input_dims, self.output_dims],
                                            init=self.weight_init, tensor_split_dims_mapping=(
                                                self.weight_split_dims_mapping.wt)))

  def __call__(self, inputs: jax.Array) -> jax.Array:
    out = jnp.einsum("...y,yz->...z", inputs, self.theta.w)
    mapping = self.activation_split_dims_mapping.out
    if out.ndim == 2 and mapping is not None and len(mapping) == 3:
      mapping = [mapping[0], mapping[2]]  # praxis's [batch, length, dim] split, one step
    return maybe_shard(out, mapping, self.mesh_axis_names)


class Bias(BaseLayer):
  """praxis's Bias: `b` [dims], a constant bias_init."""

  dims: int = 0
  bias_init: float | None = 0.0

  def setup(self) -> None:
    self.create_variable("b", WeightHParams(shape=[self.dims],
                                            init=WeightInit.Constant(self.bias_init or 0.0),
                                            tensor_split_dims_mapping=(
                                                self.weight_split_dims_mapping.wt)))

  def __call__(self, inputs: jax.Array) -> jax.Array:
    return inputs + self.theta.b


class FeedForward(BaseLayer):
  """praxis's FeedForward: linear, bias (has_bias), activation (ReLU unless set)."""

  input_dims: int = 0
  output_dims: int = 0
  has_bias: bool = True
  linear_tpl: pax_fiddle.Config[BaseLayer] = template_field(Linear)
  bias_tpl: pax_fiddle.Config[BaseLayer] = template_field(Bias)
  activation_tpl: pax_fiddle.Config[activations.BaseActivation] = template_field(
      activations.ReLU)
  weight_init: Any = None
  bias_init: float | None = 0.0
  checkpoint_str: str | None = None

  def setup(self) -> None:
    linear = self.linear_tpl.clone().set(input_dims=self.input_dims,
                                         output_dims=self.output_dims,
                                         weight_init=self.weight_init,
                                         weight_split_dims_mapping=(
                                             self.weight_split_dims_mapping.clone()),
                                         activation_split_dims_mapping=(
                                             self.activation_split_dims_mapping.clone()))
    self.create_child("linear", linear)
    if self.has_bias:
      bias = self.bias_tpl.clone().set(dims=self.output_dims, bias_init=self.bias_init)
      out = self.activation_split_dims_mapping.out
      if self.mesh_shape is not None and out is not None:
        bias.weight_split_dims_mapping.wt = [out[-1]]  # split as the output's last dim
      self.create_child("bias", bias)
    self.create_child("activation", self.activation_tpl.clone())

  def __call__(self, inputs: jax.Array) -> jax.Array:
    out = self.linear(inputs)
    if self.checkpoint_str is not None:
      out = jax.ad_checkpoint.checkpoint_name(out, self.checkpoint_str)
    if self.has_bias:
      out = self.bias(out)
    return self.activation(out)


def _keep_mask(layer: BaseLayer, prob: float, shape: Sequence[int], dtype: Any) -> jax.Array:
  """praxis's keep mask: 1 with probability prob, else 0, from the layer's next key."""
  return jnp.floor(prob + jax.random.uniform(layer.next_prng_key(), shape, dtype))


class Dropout(BaseLayer):
  """praxis's Dropout: keeps each value with keep_prob (scaled by 1 / keep_prob) while
  training; the identity in eval (a pass without the train step's key)."""

  keep_prob: float = 1.0
  noise_shape: Sequence[int] | None = None
  noise_shape_broadcast_dims: Sequence[int] | None = None
  dropout_at_eval: bool = False
  transpose_qk: bool | None = False

  def __call__(self, inputs: jax.Array) -> jax.Array:
    if self.keep_prob == 1.0:
      return inputs
    if self.do_eval:
      if self.dropout_at_eval:
        _refuse(self, "dropout_at_eval (paxlike's eval passes no random key)")
      return inputs
    shape = list(self.noise_shape or inputs.shape)
    for dim in self.noise_shape_broadcast_dims or ():
      shape[dim] = 1
    keep = _keep_mask(self, self.keep_prob, shape, inputs.dtype)
    if self.transpose_qk and len(shape) == 4 and shape[2] == shape[3]:
      keep = jnp.swapaxes(keep, 2, 3)
    return inputs * keep / self.keep_prob


def _same_padding(size: int, dilation: int) -> tuple[int, int]:
  """praxis's SAME padding of one dim: (k - 1) split, the extra one at the end."""
  total = dilation * (size - 1)
  return total // 2, total - total // 2


class LayerNorm(BaseLayer):
  """praxis's LayerNorm over the last dim: `scale` (stored as scale - 1 unless
  direct_scale) and `bias`. reductions_in_fp32 is True by default here (praxis's is
  False): the LM reads only True, and in float32 the two are the same."""

  dim: int = 0
  epsilon: float = 1e-6
  use_scale: bool = True
  use_bias: bool = True
  direct_scale: bool = False
  reductions_in_fp32: bool = True

  def setup(self) -> None:
    if self.use_scale:
      self.create_variable("scale", WeightHParams(
          shape=[self.dim], init=WeightInit.Constant(1.0 if self.direct_scale else 0.0)))
    if self.use_bias:
      self.create_variable("bias", WeightHParams(shape=[self.dim],
                                                 init=WeightInit.Constant(0.0)))

  def __call__(self, inputs: jax.Array, paddings: jax.Array | None = None) -> jax.Array:
    del paddings  # praxis's LayerNorm reads none
    dtype = inputs.dtype
    x = inputs.astype(jnp.float32) if self.reductions_in_fp32 else inputs
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    out = ((x - mean) * jax.lax.rsqrt(var + self.epsilon)).astype(dtype)
    if self.use_scale:
      out = out * (self.theta.scale if self.direct_scale else 1 + self.theta.scale)
    if self.use_bias:
      out = out + self.theta.bias
    return out


class RmsNorm(BaseLayer):
  """praxis's RmsNorm over the last dim: `scale` (direct unless direct_scale=False)."""

  dim: int = 0
  epsilon: float = 1e-6
  direct_scale: bool = True
  intermediate_dtype: Any = None

  def setup(self) -> None:
    self.create_variable("scale", WeightHParams(
        shape=[self.dim], init=WeightInit.Constant(1.0 if self.direct_scale else 0.0)))

  def __call__(self, inputs: jax.Array, paddings: jax.Array | None = None) -> jax.Array:
    del paddings
    x = inputs if self.intermediate_dtype is None else inputs.astype(self.intermediate_dtype)
    var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    out = (x * jax.lax.rsqrt(var + self.epsilon)).astype(self.fprop_dtype)
    return out * (self.theta.scale if self.direct_scale else 1 + self.theta.scale)


class Conv2D(BaseLayer):
  """praxis's Conv2D (NHWC inputs, HWIO `w`): SAME padding is praxis's own, (k - 1) split
  evenly with the extra cell at the end whatever the stride; depthwise convolutions come
  from an input dim that is a multiple of the filter's."""

  filter_shape: Sequence[int] = (0, 0, 0, 0)
  filter_stride: Sequence[int] = (0, 0)
  dilations: Sequence[int] = (1, 1)
  bias: bool = False
  bias_init: Any = None
  kernel_init: Any = None
  padding: str = "SAME"
  tf_equivalent_padding: bool = False
  is_causal: bool = False
  weight_norm_tpl: Any = None

  def setup(self) -> None:
    if len(self.filter_shape) != 4 or len(self.filter_stride) != 2 or len(self.dilations) != 2:
      raise UserError(f"{type(self).__name__}: filter_shape has 4 values (h, w, in, out), "
                      "filter_stride and dilations 2; got "
                      f"{tuple(self.filter_shape)}, {tuple(self.filter_stride)}, "
                      f"{tuple(self.dilations)}.")
    if self.padding not in ("SAME", "VALID"):
      raise UserError(f"{type(self).__name__}: padding is SAME or VALID, got {self.padding!r}.")
    if self.tf_equivalent_padding or self.is_causal:
      _refuse(self, "tf_equivalent_padding / is_causal")
    if self.weight_norm_tpl is not None:
      _refuse(self, "weight_norm_tpl")
    self.create_variable("w", WeightHParams(shape=list(self.filter_shape),
                                            init=self.kernel_init, tensor_split_dims_mapping=(
                                                self.weight_split_dims_mapping.wt)))
    if self.bias:
      self.create_variable("b", WeightHParams(shape=[self.filter_shape[-1]],
                                              init=self.bias_init or WeightInit.Constant(0.0)))

  def __call__(self, inputs: jax.Array) -> jax.Array:
    groups = inputs.shape[3] // self.filter_shape[2]
    if inputs.shape[3] % self.filter_shape[2] or self.filter_shape[3] % groups:
      raise UserError(f"{type(self).__name__}: input features {inputs.shape[3]} do not fit "
                      f"filter_shape {tuple(self.filter_shape)}.")
    padding = ([_same_padding(self.filter_shape[i], self.dilations[i]) for i in (0, 1)]
               if self.padding == "SAME" else [(0, 0), (0, 0)])
    out = jax.lax.conv_general_dilated(
        inputs.astype(self.fprop_dtype), self.theta.w.astype(self.fprop_dtype),
        window_strides=tuple(self.filter_stride), padding=padding,
        rhs_dilation=tuple(self.dilations), dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=groups)
    if self.bias:
      out = out + self.theta.b.astype(out.dtype)
    return out


class BatchNorm(BaseLayer):
  """praxis's BatchNorm over the last dim of [..., dim]: `beta`, `gamma` (scaling by
  1 + gamma, so gamma starts at 0) and the non-trainable `moving_mean` and
  `moving_variance`, moved by decay each train step.

  A train pass normalises with the batch's statistics over every row that is not
  padding, the whole global batch's (SPMD arrays are global; under pmap the devices'
  sums are added, as praxis's sync batch norm does); eval passes, and force_eval_mode,
  with the moving ones.
  """

  dim: int = 0
  decay: float = 0.999
  use_moving_avg_in_training: bool = False
  set_padded_output_to_zero: bool = True
  force_eval_mode: bool = False
  gamma_init: WeightInit = dataclasses.field(default_factory=lambda: WeightInit.Constant(0.0))

  def setup(self) -> None:
    if self.dim <= 0:
      raise UserError(f"{type(self).__name__}: dim must be set (the inputs' last dim), "
                      f"got {self.dim}.")
    self.create_variable("beta", WeightHParams(shape=[self.dim],
                                               init=WeightInit.Constant(0.0)))
    self.create_variable("gamma", WeightHParams(shape=[self.dim], init=self.gamma_init))
    self.create_variable("moving_mean", WeightHParams(
        shape=[self.dim], init=WeightInit.Constant(0.0)), trainable=False)
    self.create_variable("moving_variance", WeightHParams(
        shape=[self.dim], init=WeightInit.Constant(1.0)), trainable=False)

  def _moments(self, inputs: jax.Array, paddings: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean and variance over every non-padding row (praxis's compute_moments)."""
    dims = tuple(range(inputs.ndim - 1))
    mask = 1.0 - paddings
    total = jnp.sum(inputs * mask, axis=dims)
    count = jnp.sum(jnp.ones_like(inputs) * mask, axis=dims)
    axis = pmap_axis()
    if axis is not None:
      total, count = jax.lax.psum((total, count), axis)
    count = jnp.maximum(count, 1.0)
    mean = total / count
    squares = jnp.sum((inputs - mean) * (inputs - mean) * mask, axis=dims)
    if axis is not None:
      squares = jax.lax.psum(squares, axis)
    return mean, squares / count

  def __call__(self, inputs: jax.Array, paddings: jax.Array | None = None) -> jax.Array:
    inputs = inputs.astype(self.fprop_dtype)
    if paddings is None:
      paddings = jnp.zeros((*inputs.shape[:-1], 1), inputs.dtype)
    else:
      paddings = jnp.expand_dims(paddings, -1).astype(inputs.dtype)
    if self.do_eval or self.force_eval_mode:
      mean, variance = self.get_var("moving_mean"), self.get_var("moving_variance")
    else:
      mean, variance = self._moments(inputs, paddings)
      self.update_var("moving_mean", self.get_var("moving_mean") * self.decay
                      + mean * (1.0 - self.decay))
      self.update_var("moving_variance", self.get_var("moving_variance") * self.decay
                      + variance * (1.0 - self.decay))
      if self.use_moving_avg_in_training:
        mean, variance = self.get_var("moving_mean"), self.get_var("moving_variance")
    if self.use_moving_avg_in_training:
      beta, gamma = 0.0, 1.0
    else:
      beta, gamma = self.theta.beta, self.theta.gamma + 1.0
    out = (inputs - mean) * (gamma / jnp.sqrt(variance + 0.001)) + beta
    if self.set_padded_output_to_zero:
      out = out * (1.0 - paddings)
    return out.astype(self.fprop_dtype)


class ConvBNAct(Conv2D):
  """praxis's ConvBNAct: Conv2D, then batch norm (BatchNorm unless set; None for none),
  then the activation (ReLU unless set)."""

  batch_norm_tpl: pax_fiddle.Config[BaseLayer] | None = template_field(BatchNorm)
  activation_tpl: pax_fiddle.Config[activations.BaseActivation] = template_field(
      activations.ReLU)

  def setup(self) -> None:
    super().setup()
    if self.batch_norm_tpl is not None:
      bn = self.batch_norm_tpl.clone()
      bn.dim = self.filter_shape[3]
      bn.use_moving_avg_in_training = False
      self.create_child("bn", bn)
    self.create_child("activation", self.activation_tpl.clone())

  def __call__(self, inputs: jax.Array) -> jax.Array:
    out = super().__call__(inputs)
    if self.batch_norm_tpl is not None:
      out = self.bn(out)
    return self.activation(out)


class Pooling(BaseLayer):
  """praxis's Pooling over [B, H, W, D]: MAX or AVG (the mean over the window's cells
  inside the input); returns (outputs, paddings) as praxis does."""

  window_shape: Sequence[int] = (0, 0)
  window_stride: Sequence[int] = (0, 0)
  pooling_type: str = "MAX"
  padding: str = "SAME"

  def setup(self) -> None:
    if (len(self.window_shape) != 2 or len(self.window_stride) != 2
        or min(*self.window_shape, *self.window_stride) <= 0):
      raise UserError(f"Pooling: window_shape and window_stride are 2 positive ints, got "
                      f"{tuple(self.window_shape)}, {tuple(self.window_stride)}.")
    if self.pooling_type not in ("MAX", "AVG") or self.padding not in ("SAME", "VALID"):
      raise UserError(f"Pooling: pooling_type is MAX or AVG and padding SAME or VALID, got "
                      f"{self.pooling_type!r}, {self.padding!r}.")

  def __call__(self, inputs: jax.Array, paddings: jax.Array | None = None
               ) -> tuple[jax.Array, jax.Array | None]:
    if paddings is not None:
      _refuse(self, "pooling with paddings")
    window = (1, *self.window_shape, 1)
    strides = (1, *self.window_stride, 1)
    if self.pooling_type == "MAX":
      # Concrete (numpy) initial values: jax then differentiates the window's max or sum.
      low = (-np.inf if jnp.issubdtype(inputs.dtype, jnp.inexact)
             else jnp.iinfo(inputs.dtype).min)
      return jax.lax.reduce_window(inputs, np.array(low, inputs.dtype), jax.lax.max,
                                   window, strides, self.padding), None
    total = jax.lax.reduce_window(inputs, np.array(0, inputs.dtype), jax.lax.add, window,
                                  strides, self.padding)
    cells = jax.lax.reduce_window(np.ones(inputs.shape[1:3], inputs.dtype),
                                  np.array(0, inputs.dtype), jax.lax.add,
                                  tuple(self.window_shape), tuple(self.window_stride),
                                  self.padding)
    return total / cells[None, :, :, None], None


class GlobalPooling(BaseLayer):
  """praxis's GlobalPooling: MAX or AVG over pooling_dims (keepdims to keep them); with
  compatible_paddings, over the cells that are not padding."""

  pooling_type: str = "AVG"
  pooling_dims: Sequence[int] | None = None
  keepdims: bool = False

  def setup(self) -> None:
    if self.pooling_type not in ("MAX", "AVG"):
      raise UserError(f"GlobalPooling: pooling_type is MAX or AVG, got {self.pooling_type!r}.")
    if self.pooling_dims is None or any(d < 0 for d in self.pooling_dims):
      raise UserError(f"GlobalPooling: pooling_dims must be set to non-negative dims, got "
                      f"{self.pooling_dims!r}.")

  def __call__(self, inputs: jax.Array, epsilon: float = 1e-8,
               compatible_paddings: jax.Array | None = None) -> jax.Array:
    dims = tuple(self.pooling_dims)
    if compatible_paddings is not None:
      fill = (-jnp.inf if jnp.issubdtype(inputs.dtype, jnp.inexact)
              else jnp.iinfo(inputs.dtype).min) if self.pooling_type == "MAX" else 0
      inputs = jnp.where(compatible_paddings > 0, jnp.asarray(fill, inputs.dtype), inputs)
    if self.pooling_type == "MAX":
      return jnp.max(inputs, dims, keepdims=self.keepdims)
    if compatible_paddings is None:
      return jnp.mean(inputs, dims, keepdims=self.keepdims).astype(inputs.dtype)
    cells = jnp.sum(1.0 - compatible_paddings, dims, keepdims=True, dtype=inputs.dtype)
    out = (jnp.sum(inputs, dims, keepdims=True) / (cells + epsilon)).astype(inputs.dtype)
    return out if self.keepdims else jnp.squeeze(out, axis=dims)


class StochasticResidual(BaseLayer):
  """praxis's StochasticResidual: inputs + residual_weight x residual, the residual of each
  example dropped with probability 1 - survival_prob (and scaled up) while training."""

  residual_weight: float = 1.0
  survival_prob: float = 1.0

  def __call__(self, inputs: jax.Array, residual: jax.Array) -> jax.Array:
    if not self.do_eval:
      shape = (residual.shape[0],) + (1,) * (residual.ndim - 1)
      keep = _keep_mask(self, self.survival_prob, shape, residual.dtype)
      residual = residual / self.survival_prob * keep
    return inputs + self.residual_weight * residual


class FullSoftmax(BaseLayer):
  """praxis's FullSoftmax run as a layer (a classifier's softmax_tpl; in an LM's tree it is
  the config node paxlike.pax.praxis_layers.FullSoftmax, built as this where a user's model
  makes it a child): logits from `logits_ffn` (a FeedForward with a bias and no
  activation), optionally soft-capped, and their cross entropy against class ids or
  probabilities (label smoothing on ids), in float32."""

  input_dims: int = 0
  num_classes: int = 0
  soft_cap_logits: float | None = 0.0
  bi_tempered_loss_tpl: Any = None
  label_smoothing_prob: float = 0.0
  label_smoothing_apply_for_eval: bool = True
  z_loss_weight: float = 0.0
  bias_init: float | None = 0.0
  feed_forward_tpl: pax_fiddle.Config[BaseLayer] | None = template_field(FeedForward)
  scale_before_logits: bool = False
  chunk_size: int | None = None

  def setup(self) -> None:
    if self.bi_tempered_loss_tpl is not None:
      _refuse(self, "bi_tempered_loss_tpl")
    if self.z_loss_weight:
      _refuse(self, "z_loss_weight (an auxiliary loss)")
    if self.chunk_size:
      _refuse(self, "chunk_size (the chunked softmax)")
    if self.feed_forward_tpl is not None:
      self.create_child("logits_ffn", self.feed_forward_tpl.clone().set(
          input_dims=self.input_dims, output_dims=self.num_classes,
          activation_tpl=pax_fiddle.Config(activations.Identity), bias_init=self.bias_init,
          weight_split_dims_mapping=self.weight_split_dims_mapping.clone(),
          activation_split_dims_mapping=self.activation_split_dims_mapping.clone()))

  def get_logits(self, inputs: jax.Array, input_ids: jax.Array | None = None) -> jax.Array:
    del input_ids
    if self.scale_before_logits:
      inputs = inputs * self.input_dims ** -0.5
    logits = self.logits_ffn(inputs) if self.feed_forward_tpl is not None else inputs
    if self.soft_cap_logits:
      logits = self.soft_cap_logits * jnp.tanh(logits / self.soft_cap_logits)
    return logits

  def logits_to_logp(self, logits: jax.Array) -> jax.Array:
    return jax.nn.log_softmax(logits)

  def __call__(self, inputs: jax.Array, class_weights: jax.Array,
               class_ids: jax.Array | None = None,
               class_probabilities: jax.Array | None = None,
               input_ids: jax.Array | None = None) -> Any:
    from paxlike.pax.py_utils import NestedMap

    if class_ids is None and class_probabilities is None:
      raise UserError("FullSoftmax: give class_ids or class_probabilities.")
    logits = self.get_logits(inputs).astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits)
    if class_probabilities is None:
      class_probabilities = jax.nn.one_hot(jnp.squeeze(class_ids, -1), self.num_classes,
                                           dtype=jnp.float32)
      if self.label_smoothing_prob > 0.0 and (not self.do_eval
                                              or self.label_smoothing_apply_for_eval):
        other = self.label_smoothing_prob / (self.num_classes - 1)
        class_probabilities = ((1.0 - self.label_smoothing_prob) * class_probabilities
                               + other * (1.0 - class_probabilities))
      class_probabilities = jax.lax.stop_gradient(class_probabilities)
    xent = -jnp.sum(log_probs * class_probabilities, axis=-1, dtype=jnp.float32)
    argmax = jax.lax.stop_gradient(jnp.argmax(logits, axis=-1))
    total_xent = jnp.sum(xent[..., None] * class_weights, dtype=jnp.float32)
    total_weight = jnp.sum(class_weights, dtype=jnp.float32)
    out = NestedMap(logits=logits.astype(inputs.dtype), log_probs=log_probs.astype(inputs.dtype),
                    per_example_argmax=argmax, per_example_xent=xent, total_xent=total_xent,
                    total_weight=total_weight,
                    avg_xent=(total_xent / (total_weight + 1e-6)).astype(jnp.float32))
    if class_ids is not None:
      out.accuracy = jnp.sum((argmax[..., None] == class_ids) * class_weights) / total_weight
    return out


__all__ = ["BatchNorm", "Bias", "Conv2D", "ConvBNAct", "Dropout", "FeedForward", "FullSoftmax",
           "GlobalPooling", "LayerNorm", "Linear", "Pooling", "RmsNorm", "StochasticResidual"]
