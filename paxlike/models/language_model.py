"""Decoder-only Transformer language model."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from paxlike.layers.embedding import SharedEmbeddingSoftmax, sinusoidal_position_embedding
from paxlike.layers.linear import LayerNorm
from paxlike.layers.transformer import StackedTransformer

Dtype = Any


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-token cross-entropy in float32."""
  logits = logits.astype(jnp.float32)
  logz = jax.nn.logsumexp(logits, axis=-1)
  label_logit = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
  return logz - label_logit


class LanguageModel(nn.Module):
  """Token ids -> next-token logits, with Pax's shared embedding/softmax.

  Batches are dicts with int `ids` and `labels` [batch, length] and float
  `weights` [batch, length] (0 for padding).
  """

  vocab_size: int
  model_dims: int
  num_layers: int
  num_heads: int
  dim_per_head: int
  hidden_dims: int
  activation: str = "relu"
  combine_qkv: bool = False
  use_repeated_layer: bool = True
  checkpoint_policy: str = "SAVE_NOTHING"
  fprop_dtype: Dtype = jnp.float32
  decode: bool = False  # KV-cached one-position-per-call mode (see models.decoding)

  def setup(self) -> None:
    self.softmax = SharedEmbeddingSoftmax(self.vocab_size, self.model_dims, self.fprop_dtype)
    self.transformer = StackedTransformer(
        num_layers=self.num_layers, num_heads=self.num_heads, dim_per_head=self.dim_per_head,
        hidden_dims=self.hidden_dims, activation=self.activation,
        combine_qkv=self.combine_qkv, use_repeated_layer=self.use_repeated_layer,
        checkpoint_policy=self.checkpoint_policy, dtype=self.fprop_dtype, decode=self.decode)
    self.final_norm = LayerNorm(dtype=self.fprop_dtype)
    if self.decode:
      self.position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))

  def __call__(self, ids: jax.Array) -> jax.Array:
    x = self.softmax.embed(ids)
    offset = 0
    if self.decode and not self.is_initializing():
      offset = self.position.value
      self.position.value = offset + ids.shape[1]
    pos = sinusoidal_position_embedding(ids.shape[1], self.model_dims, offset=offset)
    x = x + pos.astype(self.fprop_dtype)[None]
    x = nn.with_logical_constraint(x, ("batch", "length", "activation_embed"))
    x = self.transformer(x)
    x = self.final_norm(x)
    logits = self.softmax.logits(x)
    return nn.with_logical_constraint(logits, ("batch", "length", "activation_vocab"))

  def fprop(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Returns (mean weighted loss, metrics)."""
    logits = self(batch["ids"])
    labels = batch["labels"]
    weights = batch["weights"].astype(jnp.float32)
    xent = softmax_cross_entropy(logits, labels)
    total = jnp.maximum(jnp.sum(weights), 1e-8)
    loss = jnp.sum(xent * weights) / total
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    metrics = {
        "loss": loss,
        "log_pplx": loss,
        "accuracy": jnp.sum(correct * weights) / total,
        "num_tokens": jnp.sum(weights),
    }
    return loss, metrics
