"""Pure step functions: (state, batch, key) -> (state, metrics)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from paxlike import nontrainable
from paxlike.errors import UserError, counted
from paxlike.layers.linear import FP8_META
from paxlike.learners import FrozenTransformation, apply_updates
from paxlike.models.base import WEIGHT, split_weighted, weighted_means, weighted_sums
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


def split_microbatches(batch: dict[str, jax.Array], num_microbatches: int
                       ) -> dict[str, jax.Array]:
  """[B, ...] -> [k, B / k, ...]; microbatch j takes rows j, j + k, j + 2k, ...

  Strided rather than contiguous: a batch sharded over devices by rows then
  keeps every microbatch spread over all of them.
  """
  def split(x):
    rows = x.shape[0]
    return jnp.swapaxes(x.reshape(rows // num_microbatches, num_microbatches, *x.shape[1:]),
                        0, 1)
  return jax.tree.map(split, batch)


def batch_shards(partitioner: Any) -> int:
  """How many ways the partitioner splits a batch's rows (mesh batch shards or pmap devices)."""
  shards = getattr(partitioner, "num_batch_shards", None)
  return shards if shards is not None else jax.device_count()


def accumulation_knob(partitioner: Any) -> str:
  """The hyperparameter that sets a run's gradient accumulation, as messages name it: on a
  pipeline's mesh (a 'stage' axis) GRADIENT_ACCUMULATION_STEPS, since its NUM_MICROBATCHES
  are the pipeline's; else NUM_MICROBATCHES."""
  mesh = getattr(partitioner, "mesh", None)
  pipelined = "stage" in getattr(mesh, "axis_names", ())
  return "GRADIENT_ACCUMULATION_STEPS" if pipelined else "NUM_MICROBATCHES"


def check_microbatches(global_batch: int, num_microbatches: int, batch_shards: int,
                       knob: str | None = None) -> None:
  """Raises UserError unless every microbatch divides over the batch shards.

  Args:
    global_batch: rows of one step's batch, over every host.
    num_microbatches: the gradient-accumulation slices (task.train.num_microbatches).
    batch_shards: devices (or mesh shards) the batch rows are split over.
    knob: the hyperparameter that set num_microbatches, as the message names it
      (accumulation_knob); None: NUM_MICROBATCHES.
  """
  if num_microbatches < 1 or global_batch % (num_microbatches * batch_shards):
    knob = knob or "NUM_MICROBATCHES"
    shards = counted(batch_shards, "batch shard")
    raise UserError(
        f"{knob}={num_microbatches} must be a positive divisor of the global batch "
        f"{global_batch} that leaves each microbatch divisible over the {shards}; change "
        f"{knob} or the batch size.")


def check_step_batch(model: Any, partitioner: Any, global_batch: int,
                     num_microbatches: int) -> None:
  """Raises UserError unless a training step's batch of global_batch rows divides over the
  partitioner's batch shards, into num_microbatches gradient-accumulation slices that each
  divide over them too, and into what the model needs (a pipeline's microbatches)."""
  partitioner.check_global_batch(global_batch)
  check_microbatches(global_batch, num_microbatches, batch_shards(partitioner),
                     accumulation_knob(partitioner))
  model.check_batch(global_batch // num_microbatches)


def _accumulated_grads(grad_fn: Callable, params: Any, batch: dict[str, jax.Array],
                       key: jax.Array, num_microbatches: int,
                       select: Callable[[Any], Any] | None = None):
  """(loss, metrics), grads of the whole batch, computed k microbatches at a time.

  fprop's loss is a mean over its weighted tokens (metrics["num_tokens"]), so
  the whole batch's gradient is the token-weighted mean of the microbatches'
  gradients; it is accumulated in float32. Count metrics (num_*) add up, a metric
  with its own weight (paxlike.models.base.WEIGHT) is averaged by it, the others
  are token-weighted means, as for the whole batch.
  """
  micro = split_microbatches(batch, num_microbatches)
  trained = params if select is None else select(params)  # grad_fn's gradients' tree
  zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), trained)

  def body(carry, xs):
    grad_sum, metric_sums = carry
    index, mb = xs
    (loss, metrics), grads = grad_fn(params, mb, jax.random.fold_in(key, index))
    n = jnp.asarray(metrics.get("num_tokens", 1.0), jnp.float32)
    grad_sum = jax.tree.map(lambda s, g: s + n * g.astype(jnp.float32), grad_sum, grads)
    metrics = {k: v.astype(jnp.float32) for k, v in dict(metrics, loss=loss).items()}
    means, weighted = weighted_sums({k: v for k, v in metrics.items() if not _is_count(k)})
    adds = {k: v for k, v in metrics.items() if _is_count(k)}
    adds.update({k: n * v for k, v in means.items()})
    adds.update(weighted)  # value x its own weight, and the weight
    metric_sums = {k: metric_sums[k] + v for k, v in adds.items()}
    return (grad_sum, metric_sums), None

  (_, first_metrics), _ = jax.eval_shape(
      grad_fn, params, jax.tree.map(lambda x: x[0], micro), key)
  metric_zeros = {k: jnp.zeros((), jnp.float32) for k in dict(first_metrics, loss=0.0)}
  (grad_sum, metric_sums), _ = jax.lax.scan(
      body, (zeros, metric_zeros), (jnp.arange(num_microbatches), micro))
  total = jnp.maximum(metric_sums.get("num_tokens", float(num_microbatches)), 1e-8)
  grads = jax.tree.map(lambda g, p: (g / total).astype(p.dtype), grad_sum, trained)
  means, sums = split_weighted({k: v for k, v in metric_sums.items() if not _is_count(k)})
  metrics = {k: v for k, v in metric_sums.items() if _is_count(k)}
  metrics.update({k: v / total for k, v in means.items()})
  metrics.update(weighted_means(sums))
  return (metrics["loss"], metrics), grads


def _by_own_weights(pairs: dict[str, tuple[jax.Array, jax.Array]],
                    reduce_sum: Callable[[Any], Any]) -> dict[str, jax.Array]:
  """{name: sum(value x weight) / sum(weight), name-weight: sum(weight)} over pmap devices
  (reduce_sum) of metrics with their own weights. Each value is scaled by its device's
  share of the weight before the sum, so that where there is nothing to sum (SPMD) a
  value comes back as it is (x 1.0)."""
  totals = reduce_sum({k + WEIGHT: w for k, (_, w) in pairs.items()})
  out = reduce_sum({k: v * (w / jnp.maximum(totals[k + WEIGHT], 1e-8))
                    for k, (v, w) in pairs.items()})
  return {**out, **totals}


def _is_count(name: str) -> bool:
  """A metric that adds up (num_tokens, a Pax model's num_predictions or Metrics/num_tokens)."""
  return name.rsplit("/", 1)[-1].startswith("num_")


def fp8_meta(grads: Any) -> dict[str, jax.Array]:
  """The FP8 scales and amax histories among the gradients (by their names, FP8_META): each
  one's "gradient" is its next value (paxlike.layers.linear.fp8_project)."""
  flat = flax.traverse_util.flatten_dict(grads, sep="/") if isinstance(grads, dict) else {}
  return {k: v for k, v in flat.items() if v is not None and re.fullmatch(FP8_META, k)}


def picked_leaves(tree: Any, paths: set[str]) -> dict[str, Any]:
  """The leaves of tree at the given '/'-joined paths (those it holds, not None)."""
  if not paths or not isinstance(tree, dict):
    return {}
  flat = flax.traverse_util.flatten_dict(tree, sep="/")
  return {k: flat[k] for k in paths if flat.get(k) is not None}


def with_leaves(tree: dict[str, Any], leaves: dict[str, Any]) -> dict[str, Any]:
  """tree with the leaves at the given '/'-joined paths replaced."""
  flat = flax.traverse_util.flatten_dict(tree, sep="/")
  flat.update(leaves)
  return flax.traverse_util.unflatten_dict(flat, sep="/")


def make_train_step(model: nn.Module, tx: optax.GradientTransformation,
                    schedule: optax.Schedule,
                    reduce: Callable[..., Any] = lambda t, weight=None: t,
                    skip_nonfinite: bool = False, num_microbatches: int = 1,
                    variable_norms: bool = False,
                    reduce_sum: Callable[[Any], Any] = lambda t: t) -> Callable:
  """One optimizer step. `reduce(tree, weight)` averages gradients, the loss and the
  token-mean metrics over pmap devices, each device's weighed by its num_tokens (so the
  step is the whole batch's, as a microbatched one is); `reduce_sum` adds counts (num_*)
  up, and value x weight and the weight of a metric with its own weight (a Pax model's,
  averaged by it as Pax's pmap step does).

  The key is folded with the step, so a resumed run draws the same randomness.
  metrics[NONFINITE_KEY] says whether the loss and gradients were finite; with
  skip_nonfinite, a step where they were not keeps the old parameters and
  optimizer state (the step counter still advances). num_microbatches > 1
  (NUM_MICROBATCHES) computes the gradient of the batch k rows-slices at a
  time and applies one update equal to the whole batch's. variable_norms (Pax's
  variable_norm_summary) adds metrics vars/<parameter path>: each parameter's root mean
  square after the step.
  """

  # A learner that freezes parameters (bprop_variable_inclusion / _exclusion, USE_LORA)
  # gives a FrozenTransformation: the gradient is taken of the trained ones only (None
  # for the others), so no frozen weight's gradient is computed, reduced or stored.
  select = tx.select if isinstance(tx, FrozenTransformation) else None

  def grad_fn(params, batch, key):
    def loss_fn(params):
      return model.apply({"params": params}, batch, method="fprop", rngs={"dropout": key})
    if select is None:
      return jax.value_and_grad(loss_fn, has_aux=True)(params)

    def trained_loss_fn(trained):
      return loss_fn(jax.tree.map(lambda p, t: p if t is None else t, params, trained))
    return jax.value_and_grad(trained_loss_fn, has_aux=True)(select(params))

  def train_step(state: TrainState, batch: dict[str, jax.Array], key: jax.Array):
    step_key = jax.random.fold_in(key, state.step)
    with nontrainable.collecting() as declared:  # what the forward pass's trace declares
      if num_microbatches > 1:
        (loss, metrics), grads = _accumulated_grads(grad_fn, state.params, batch, step_key,
                                                    num_microbatches, select)
      else:
        (loss, metrics), grads = grad_fn(state.params, batch, step_key)
    tokens = metrics.get("num_tokens")
    metrics, pairs = split_weighted(metrics)
    counts = {k: v for k, v in metrics.items() if _is_count(k)}
    means = {k: v for k, v in metrics.items() if not _is_count(k)}
    grads, means, loss = reduce((grads, means, loss), tokens)
    metrics = {**means, **reduce_sum(counts), **_by_own_weights(pairs, reduce_sum)}
    # FP8 scales and histories are written over, and non-trainable parameters (batch
    # norm's moving statistics) moved by their change, not optimised: zero gradients for
    # the optimizer (no clipping share, no update but weight decay's, which the write
    # undoes). See paxlike.nontrainable.
    meta = fp8_meta(grads)
    changes = picked_leaves(grads, declared)
    if meta or changes:
      grads = with_leaves(grads, {k: jnp.zeros_like(v) for k, v in {**meta, **changes}.items()})
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = apply_updates(state.params, updates)
    if meta:
      params = with_leaves(params, meta)
    if changes:
      old = picked_leaves(state.params, set(changes))
      params = with_leaves(params, {k: old[k] + changes[k].astype(old[k].dtype)
                                    for k in changes})
    metrics = dict(metrics)
    metrics["grad_norm"] = optax.tree.norm(grads)
    metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
    metrics[NONFINITE_KEY] = nonfinite_code(loss, grads, metrics["grad_norm"])
    if skip_nonfinite:
      keep_new = metrics[NONFINITE_KEY] == 0
      params, opt_state = jax.tree.map(lambda new, old: jnp.where(keep_new, new, old),
                                       (params, opt_state), (state.params, state.opt_state))
    if variable_norms:
      flat = flax.traverse_util.flatten_dict(params, sep="/") if isinstance(params, dict) else {}
      metrics.update({f"vars/{k}": jnp.sqrt(jnp.mean(jnp.square(v.astype(jnp.float32))))
                      for k, v in flat.items()})
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics

  return train_step
