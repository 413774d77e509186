"""praxis.metric_utils: top_k_accuracy."""

import jax
import jax.numpy as jnp


def top_k_accuracy(top_k: int, logits: jax.Array, label_ids: jax.Array | None = None,
                   label_probs: jax.Array | None = None,
                   weights: jax.Array | None = None) -> jax.Array:
  """The weighted share of examples whose label's logit is among their top_k (ties count
  as in praxis: at least the k-th largest logit); labels as ids or as probabilities (their
  argmax)."""
  from paxlike.errors import UserError

  if label_ids is None and label_probs is None:
    raise UserError("top_k_accuracy: give label_ids or label_probs.")
  if label_ids is None:
    label_ids = jnp.argmax(label_probs, axis=-1)
  if weights is None:
    weights = jnp.ones(logits.shape[:-1])
  threshold = jnp.min(jax.lax.top_k(logits, k=top_k)[0], axis=-1)
  picked = jnp.take_along_axis(logits, label_ids[..., None], axis=-1)[..., 0]
  correct = picked >= threshold
  return jnp.sum(correct * weights) / jnp.maximum(1.0, jnp.sum(weights))


__all__ = ["top_k_accuracy"]
