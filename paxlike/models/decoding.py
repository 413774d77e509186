"""Autoregressive decoding: greedy or temperature / top-k sampling.

Rows carry prompts of different lengths in one [batch, length] buffer:
position t+1 keeps the prompt token while t+1 < prompt_len and takes the
model's choice after that. With use_cache (the default) every step feeds one
position through the model's key/value cache; without it every step re-runs
the whole buffer (the reference the cached path is tested against).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


def sample(logits: jax.Array, key: jax.Array, temperature: float, top_k: int) -> jax.Array:
  """Greedy when temperature == 0; otherwise softmax(logits / T) over the top k."""
  if temperature <= 0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits.astype(jnp.float32) / temperature
  if top_k > 0:
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, jnp.finfo(jnp.float32).min, logits)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def decode(model: nn.Module, params, tokens: jax.Array, prompt_lens: jax.Array, key: jax.Array,
           temperature: float = 0.0, top_k: int = 0, use_cache: bool = True) -> jax.Array:
  """Fills tokens[:, prompt_len:] with generated ids; returns the whole buffer.

  Args:
    model: a LanguageModel (decode=False; the cached clone is made here).
    params: its parameters.
    tokens: [batch, length] int32; row r's prompt occupies [:prompt_lens[r]].
    prompt_lens: [batch] int32, at least 1.
    key: PRNG key for sampling.
  """
  batch, length = tokens.shape
  prompt_lens = jnp.maximum(prompt_lens, 1)

  def choose(t, logits_t, buf, step_key):
    nxt = sample(logits_t, step_key, temperature, top_k)
    keep = (t + 1) < prompt_lens
    return buf.at[:, t + 1].set(jnp.where(keep, buf[:, t + 1], nxt))

  if use_cache:
    cached = model.clone(decode=True)
    shapes = jax.eval_shape(lambda: cached.init(jax.random.key(0), tokens)["cache"])
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def body(t, carry):
      buf, cache = carry
      logits, mutated = cached.apply({"params": params, "cache": cache}, buf[:, t][:, None],
                                     mutable=["cache"])
      return choose(t, logits[:, 0], buf, jax.random.fold_in(key, t)), mutated["cache"]

    out, _ = jax.lax.fori_loop(0, length - 1, body, (tokens, cache))
    return out

  def body_full(t, buf):
    logits = model.apply({"params": params}, buf)
    return choose(t, logits[:, t], buf, jax.random.fold_in(key, t))

  return jax.lax.fori_loop(0, length - 1, body_full, tokens)
