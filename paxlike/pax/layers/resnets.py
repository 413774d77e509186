"""praxis.layers.resnets: ResNet, ResNetBlock and ResNetBasicBlock, runnable.

praxis's ResNets (https://arxiv.org/abs/1512.03385) with praxis's fields,
children names and defaults: ConvBNAct blocks whose batch norm decays by 0.9,
weights drawn GaussianSqrtFanOut(1.4141), a 7x7 stride-2 entry convolution
and 3x3 max pool, the stride at each stage's first block (on the bottleneck's
3x3 convolution), and global average pooling at the end. `HParamsResNet50()`
and its siblings are praxis's class methods.
"""

import dataclasses
from collections.abc import Sequence

import fiddle as fdl
import jax

from paxlike.errors import UserError
from paxlike.pax import pax_fiddle
from paxlike.pax.base_layer import BaseLayer, WeightInit, template_field
from paxlike.pax.layers import activations
from paxlike.pax.user_layers import (
    BatchNorm,
    ConvBNAct,
    GlobalPooling,
    Pooling,
    StochasticResidual,
)

LayerTpl = pax_fiddle.Config[BaseLayer]


class ResNetBlock(BaseLayer):
  """praxis's bottleneck block: 1x1 to output_dim / 4, kernel_size x kernel_size at
  `stride`, 1x1 to output_dim (no activation), plus the input (through a 1x1 `shortcut`
  where the shape changes), then the activation. zero_init_residual starts the last batch
  norm's scale at 0 (gamma -1)."""

  input_dim: int = 0
  output_dim: int = 0
  conv_params: LayerTpl = template_field(ConvBNAct)
  kernel_size: int = 3
  stride: int = 1
  activation_tpl: pax_fiddle.Config[activations.BaseActivation] = template_field(
      activations.ReLU)
  residual_droppath_prob: float = 0.0
  zero_init_residual: bool = False

  def _body(self) -> list[LayerTpl]:
    quarter = self.output_dim // 4
    last = {}
    if self.zero_init_residual:
      if self.conv_params.batch_norm_tpl is None:
        raise UserError(f"{type(self).__name__}: zero_init_residual needs the convolutions' "
                        "batch norm (conv_params.batch_norm_tpl).")
      last["batch_norm_tpl"] = self.conv_params.batch_norm_tpl.clone().set(
          gamma_init=WeightInit.Constant(-1.0))
    return [
        self.conv_params.clone().set(filter_shape=(1, 1, self.input_dim, quarter),
                                     filter_stride=(1, 1), activation_tpl=self.activation_tpl),
        self.conv_params.clone().set(
            filter_shape=(self.kernel_size, self.kernel_size, quarter, quarter),
            filter_stride=(self.stride, self.stride), activation_tpl=self.activation_tpl),
        self.conv_params.clone().set(filter_shape=(1, 1, quarter, self.output_dim),
                                     filter_stride=(1, 1),
                                     activation_tpl=pax_fiddle.Config(activations.Identity),
                                     **last),
    ]

  def setup(self) -> None:
    self.create_children("body", self._body())
    if not self._in_out_same_shape:
      self.create_child("shortcut", self.conv_params.clone().set(
          filter_shape=(1, 1, self.input_dim, self.output_dim),
          filter_stride=(self.stride, self.stride),
          activation_tpl=pax_fiddle.Config(activations.Identity)))
    if self.residual_droppath_prob > 0:
      self.create_child("residual_droppath", pax_fiddle.Config(
          StochasticResidual, survival_prob=1.0 - self.residual_droppath_prob))
    self.create_child("postact", self.activation_tpl.clone())

  def __call__(self, inputs: jax.Array) -> jax.Array:
    outputs = inputs
    for layer in self.body:
      outputs = layer(outputs)
    if not self._in_out_same_shape:
      inputs = self.shortcut(inputs)
    if self.residual_droppath_prob:
      outputs = self.residual_droppath(inputs, outputs)
    else:
      outputs = outputs + inputs
    return self.postact(outputs)

  @property
  def _in_out_same_shape(self) -> bool:
    return self.input_dim == self.output_dim and self.stride == 1


class ResNetBasicBlock(ResNetBlock):
  """praxis's basic block (ResNet-18/34): two kernel_size convolutions at output_dim, the
  first at `stride`, the second without activation, plus the (shortcut) input."""

  def _body(self) -> list[LayerTpl]:
    return [
        self.conv_params.clone().set(
            filter_shape=(self.kernel_size, self.kernel_size, self.input_dim, self.output_dim),
            filter_stride=(self.stride, self.stride), activation_tpl=self.activation_tpl.clone()),
        self.conv_params.clone().set(
            filter_shape=(self.kernel_size, self.kernel_size, self.output_dim, self.output_dim),
            filter_stride=(1, 1), activation_tpl=pax_fiddle.Config(activations.Identity)),
    ]


def _preset(**fields: object) -> classmethod:
  """A praxis HParamsResNetN class method: the config of the class with these fields (a
  block class given as its config)."""
  def make(cls: type) -> LayerTpl:
    return pax_fiddle.Config(cls, **{k: pax_fiddle.Config(v) if isinstance(v, type) else v
                                     for k, v in fields.items()})
  return classmethod(make)


class ResNet(BaseLayer):
  """praxis's ResNet over [B, H, W, 3] images, ResNet-50 by default: stages of `blocks`
  blocks of `channels`, `kernels` and `strides` each; returns [B, channels[-1]] after the
  output pooling (or the per-stage features, return_block_features)."""

  conv_params: LayerTpl = template_field(pax_fiddle.Config(
      ConvBNAct, batch_norm_tpl=pax_fiddle.Config(BatchNorm, decay=0.9),
      params_init=WeightInit.GaussianSqrtFanOut(1.4141)))
  block_params: LayerTpl = template_field(ResNetBlock)
  strides: Sequence[int] = (1, 2, 2, 2)
  channels: Sequence[int] = (256, 512, 1024, 2048)
  blocks: Sequence[int] = (3, 4, 6, 3)
  kernels: Sequence[int] = (3, 3, 3, 3)
  entryflow_conv_kernel: Sequence[int] = (7, 7, 3)
  entryflow_conv_stride: Sequence[int] = (2, 2)
  output_spatial_pooling_params: LayerTpl | None = template_field(
      pax_fiddle.Config(GlobalPooling, pooling_dims=(1, 2)))
  return_block_features: bool = False
  entry_max_pool: bool = True

  # praxis's presets: ResNet.HParamsResNet50() and its siblings, configs of the class.
  HParamsResNet5 = _preset(strides=[1], channels=[16], blocks=[1], kernels=[1])
  HParamsResNet18 = _preset(channels=(64, 128, 256, 512), block_params=ResNetBasicBlock,
                            blocks=[2, 2, 2, 2])
  HParamsResNet34 = _preset(channels=(64, 128, 256, 512), block_params=ResNetBasicBlock,
                            blocks=[3, 4, 6, 3])
  HParamsResNet50 = _preset()
  HParamsResNet56 = _preset(blocks=[3, 3, 9, 3])
  HParamsResNet83 = _preset(blocks=[3, 3, 18, 3])
  HParamsResNet101 = _preset(blocks=[3, 4, 23, 3])
  HParamsResNet152 = _preset(blocks=[3, 8, 36, 3])

  def setup(self) -> None:
    stages = len(self.strides)
    for name in ("channels", "blocks", "kernels"):
      if len(getattr(self, name)) != stages:
        raise UserError(f"ResNet: {name} has {len(getattr(self, name))} entries for "
                        f"{stages} stages (strides).")
    block = self.block_params.clone()
    block_cls = fdl.get_callable(block)
    if "conv_params" in {f.name for f in dataclasses.fields(block_cls)}:
      block.conv_params = self.conv_params.clone()
    contraction = 4 if block_cls is ResNetBlock else 1  # praxis's test, the class itself
    input_dim = self.channels[0] // contraction
    entry = self.conv_params.clone()
    entry.filter_shape = (*self.entryflow_conv_kernel[:3], input_dim)
    entry.filter_stride = self.entryflow_conv_stride
    self.create_child("entryflow_conv", entry)
    self.create_child("entryflow_maxpool", pax_fiddle.Config(
        Pooling, window_shape=(3, 3), window_stride=(2, 2), pooling_type="MAX"))
    for stage, (channel, num, kernel, stride) in enumerate(
        zip(self.channels, self.blocks, self.kernels, self.strides, strict=True)):
      for index in range(num):
        self.create_child(f"stage_{stage}_block_{index}", block.clone().set(
            kernel_size=kernel, input_dim=input_dim, output_dim=channel,
            stride=stride if index == 0 else 1))
        input_dim = channel
    if self.output_spatial_pooling_params is not None:
      self.create_child("output_spatial_pooling", self.output_spatial_pooling_params)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    features = {}
    outputs = self.entryflow_conv(inputs)
    if self.entry_max_pool:
      outputs, _ = self.entryflow_maxpool(outputs)
    for stage, num in enumerate(self.blocks):
      for index in range(num):
        outputs = getattr(self, f"stage_{stage}_block_{index}")(outputs)
      features[2 + stage] = outputs
    if self.return_block_features:
      return features
    if self.output_spatial_pooling_params is not None:
      outputs = self.output_spatial_pooling(outputs)
    return outputs


__all__ = ["ResNet", "ResNetBasicBlock", "ResNetBlock"]
