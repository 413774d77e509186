"""Pure step functions: (state, batch, key) -> (state, metrics)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from paxlike.train_state import TrainState

# Metrics key of an int32 code saying what, if anything, was not finite in a step:
# 0 nothing, 1 the loss, 2 + i the gradient of parameter leaf i (tree order),
# 2 + number of leaves the gradient norm alone (overflow). See paxlike.nonfinite.
NONFINITE_KEY = "nonfinite_code"


def nonfinite_code(loss: jax.Array, grads: Any, grad_norm: jax.Array) -> jax.Array:
  """The NONFINITE_KEY code of one step, computed on device (no host sync)."""
  leaves = jax.tree.leaves(grads)
  leaf_ok = jnp.stack([jnp.all(jnp.isfinite(g)) for g in leaves])
  code = jnp.where(jnp.isfinite(grad_norm), 0, 2 + len(leaves))
  code = jnp.where(jnp.all(leaf_ok), code, 2 + jnp.argmin(leaf_ok))
  return jnp.where(jnp.isfinite(loss), code, 1).astype(jnp.int32)


def make_train_step(model: nn.Module, tx: optax.GradientTransformation,
                    schedule: optax.Schedule,
                    reduce: Callable[[Any], Any] = lambda t: t,
                    skip_nonfinite: bool = False) -> Callable:
  """One optimizer step. `reduce` averages gradients and metrics over pmap devices.

  The key is folded with the step, so a resumed run draws the same randomness.
  metrics[NONFINITE_KEY] says whether the loss and gradients were finite; with
  skip_nonfinite, a step where they were not keeps the old parameters and
  optimizer state (the step counter still advances).
  """

  def train_step(state: TrainState, batch: dict[str, jax.Array], key: jax.Array):
    step_key = jax.random.fold_in(key, state.step)

    def loss_fn(params):
      return model.apply({"params": params}, batch, method="fprop",
                         rngs={"dropout": step_key})

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    grads, metrics, loss = reduce((grads, metrics, loss))
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics)
    metrics["grad_norm"] = optax.tree.norm(grads)
    metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
    metrics[NONFINITE_KEY] = nonfinite_code(loss, grads, metrics["grad_norm"])
    if skip_nonfinite:
      keep_new = metrics[NONFINITE_KEY] == 0
      params, opt_state = jax.tree.map(lambda new, old: jnp.where(keep_new, new, old),
                                       (params, opt_state), (state.params, state.opt_state))
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics

  return train_step


def make_eval_step(model: nn.Module, reduce: Callable[[Any], Any] = lambda t: t) -> Callable:
  """Loss and metrics on one batch, no update."""

  def eval_step(state: TrainState, batch: dict[str, jax.Array], key: jax.Array):
    del key
    _, metrics = model.apply({"params": state.params}, batch, method="fprop")
    return reduce(metrics)

  return eval_step
