"""Pre-norm Transformer layer and the stack (scanned when repeated)."""

from __future__ import annotations

import enum
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from paxlike.errors import UserError
from paxlike.layers.attention import DotProductAttention
from paxlike.layers.linear import FeedForward, LayerNorm

Dtype = Any

# Pax's remat policy names -> jax.checkpoint policies. None means "no remat".
CHECKPOINT_POLICIES: dict[str, Any] = {
    "SAVE_NOTHING": jax.checkpoint_policies.nothing_saveable,
    "SAVE_EVERYTHING": None,
    "SAVE_DOT_WITH_NO_BATCH_DIM": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "SAVE_DOT_FOR_MLPERF_200B": jax.checkpoint_policies.save_only_these_names(
        "ffn1", "context", "out_proj"),
    "SAVE_CONTEXT_AND_OUT_PROJ": jax.checkpoint_policies.save_only_these_names(
        "context", "out_proj"),
}


class AutodiffCheckpointType(enum.Enum):
  """Pax's remat policy enum (`layers.AutodiffCheckpointType.SAVE_NOTHING`); the
  string names above work too."""

  SAVE_NOTHING = "SAVE_NOTHING"
  SAVE_EVERYTHING = "SAVE_EVERYTHING"
  SAVE_DOT_WITH_NO_BATCH_DIM = "SAVE_DOT_WITH_NO_BATCH_DIM"
  SAVE_DOT_FOR_MLPERF_200B = "SAVE_DOT_FOR_MLPERF_200B"
  SAVE_CONTEXT_AND_OUT_PROJ = "SAVE_CONTEXT_AND_OUT_PROJ"


def policy_name(value: Any) -> str:
  """The policy's name for an AutodiffCheckpointType member or a string."""
  return value.name if isinstance(value, enum.Enum) else value


def remat_policy(name: Any) -> Any:
  name = policy_name(name)
  if name not in CHECKPOINT_POLICIES:
    raise UserError(f"CHECKPOINT_POLICY={name!r} is not one of {sorted(CHECKPOINT_POLICIES)}.")
  return CHECKPOINT_POLICIES[name]


class TransformerLayer(nn.Module):
  """x + attention(norm(x)), then x + ffn(norm(x))."""

  num_heads: int
  dim_per_head: int
  hidden_dims: int
  activation: str = "relu"
  combine_qkv: bool = False
  dtype: Dtype = jnp.float32
  cache_mode: str | None = None  # see DotProductAttention

  @nn.compact
  def __call__(self, x: jax.Array, index: jax.Array | None = None) -> tuple[jax.Array, None]:
    h = LayerNorm(dtype=self.dtype, name="pre_attn_norm")(x)
    x = x + DotProductAttention(self.num_heads, self.dim_per_head, self.combine_qkv,
                                self.dtype, self.cache_mode, name="attention")(h, index)
    x = nn.with_logical_constraint(x, ("batch", "length", "activation_embed"))
    h = LayerNorm(dtype=self.dtype, name="pre_ffn_norm")(x)
    x = x + FeedForward(self.hidden_dims, self.activation, self.dtype, name="ffn")(h)
    x = nn.with_logical_constraint(x, ("batch", "length", "activation_embed"))
    return x, None


class StackedTransformer(nn.Module):
  """num_layers TransformerLayers; scanned over a 'layers' axis when repeated."""

  num_layers: int
  num_heads: int
  dim_per_head: int
  hidden_dims: int
  activation: str = "relu"
  combine_qkv: bool = False
  use_repeated_layer: bool = True
  checkpoint_policy: str = "SAVE_NOTHING"
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, cache_mode: str | None = None,
               index: jax.Array | None = None) -> jax.Array:
    """cache_mode None trains/evaluates; "prefill" / "extend" decode (DotProductAttention)."""
    policy = remat_policy(self.checkpoint_policy)
    layer_cls = TransformerLayer
    if policy_name(self.checkpoint_policy) != "SAVE_EVERYTHING" and cache_mode is None:
      layer_cls = nn.remat(TransformerLayer, policy=policy, prevent_cse=not self.use_repeated_layer)
    kwargs = dict(num_heads=self.num_heads, dim_per_head=self.dim_per_head,
                  hidden_dims=self.hidden_dims, activation=self.activation,
                  combine_qkv=self.combine_qkv, dtype=self.dtype, cache_mode=cache_mode)
    if self.use_repeated_layer:
      stack = nn.scan(layer_cls, variable_axes={"params": 0, "cache": 0},
                      split_rngs={"params": True}, in_axes=nn.broadcast,
                      length=self.num_layers, metadata_params={nn.PARTITION_NAME: "layers"})
      x, _ = stack(**kwargs, name="repeat")(x, index)
      return x
    for i in range(self.num_layers):
      x, _ = layer_cls(**kwargs, name=f"x_layers_{i}")(x, index)
    return x
