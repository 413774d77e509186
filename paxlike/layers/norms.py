"""RMS normalisation, shared by the LM, Llama and T5 stacks."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Dtype = Any


class RmsNorm(nn.Module):
  """x / rms(x) (computed in float32) times a learned `scale`; no mean, no bias.

  scale_in_float32: T5's order (the scale multiplies in float32, then the cast), as
  transformers' T5LayerNorm; otherwise Llama's (the cast, then the scale in `dtype`), as
  its LlamaRMSNorm. The two agree in float32.
  """

  epsilon: float = 1e-6
  dtype: Dtype = jnp.float32
  scale_in_float32: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                       (x.shape[-1],), jnp.float32)
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + self.epsilon)
    if self.scale_in_float32:
      return (y * scale).astype(self.dtype)
    return y.astype(self.dtype) * scale.astype(self.dtype)
