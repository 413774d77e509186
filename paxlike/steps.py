"""Pure step functions: (state, batch, key) -> (state, metrics)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from paxlike.train_state import TrainState


def make_train_step(model: nn.Module, tx: optax.GradientTransformation,
                    schedule: optax.Schedule,
                    reduce: Callable[[Any], Any] = lambda t: t) -> Callable:
  """One optimizer step. `reduce` averages gradients and metrics over pmap devices.

  The key is folded with the step, so a resumed run draws the same randomness.
  """

  def train_step(state: TrainState, batch: dict[str, jax.Array], key: jax.Array):
    step_key = jax.random.fold_in(key, state.step)

    def loss_fn(params):
      return model.apply({"params": params}, batch, method="fprop",
                         rngs={"dropout": step_key})

    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    grads, metrics = reduce((grads, metrics))
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics)
    metrics["grad_norm"] = optax.tree.norm(grads)
    metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
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
