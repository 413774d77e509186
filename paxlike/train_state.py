"""TrainState and its abstract (allocation-free) construction."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import PartitionSpec

from paxlike.learners import FrozenTransformation


class TrainState(struct.PyTreeNode):
  step: jax.Array
  params: Any
  opt_state: Any


def init_params(model: nn.Module, rng: jax.Array, sample_batch: dict[str, jax.Array]) -> Any:
  """The model's boxed parameters, traced through fprop on a sample batch."""
  params = model.init(rng, sample_batch, method="fprop")["params"]
  return model.initial_params(params, jax.random.fold_in(rng, 1))


def init_fn(model: nn.Module, tx: optax.GradientTransformation,
            sample_batch: dict[str, jax.Array]):
  """A function rng -> TrainState (params unboxed, float32)."""

  def init(rng: jax.Array) -> TrainState:
    return _fresh_state(init_params(model, rng, sample_batch), tx)

  return init


def _fresh_state(boxed_params: Any, tx: optax.GradientTransformation) -> TrainState:
  """The state at step 0 of boxed parameters: unboxed, with tx's fresh slots."""
  params = nn.unbox(boxed_params)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def logical_specs(model: nn.Module, tx: optax.GradientTransformation,
                  sample_batch: dict[str, jax.Array]) -> tuple[TrainState, TrainState]:
  """(abstract state, logical PartitionSpecs) without allocating anything.

  Optimizer slots shaped like their parameter (Adam's moments) take its spec,
  slots shaped like one layer of a stacked parameter its spec without the
  leading dim; factored statistics (Adafactor's row/column moments) and
  scalars are replicated.
  """
  def boxed_and_state(rng: jax.Array) -> tuple[Any, TrainState]:
    boxed = init_params(model, rng, sample_batch)
    return boxed, _fresh_state(boxed, tx)

  # One trace of the model's init gives both the boxed parameters (their logical
  # axes) and the state's shapes; a trace costs about half a second on a tiny model.
  boxed, abstract = jax.eval_shape(boxed_and_state, jax.random.key(0))
  param_specs = nn.get_partition_spec(boxed)
  opt_specs = opt_state_specs(tx, abstract.opt_state, param_specs, abstract.params)
  specs = TrainState(step=PartitionSpec(), params=param_specs, opt_state=opt_specs)
  return abstract, specs


def task_logical_specs(task: Any, sample_batch: dict[str, jax.Array]
                       ) -> tuple[TrainState, TrainState]:
  """logical_specs() of task's model and learner, computed once per task object.

  A run asks for its state's layout more than once (the preflight's checkpoint
  and disk checks, the train program, export); each ask would trace the model's
  init again. The model and learner objects and the one-row sample batch's shapes key
  the memo, so a task given another model or learner is traced afresh.
  """
  key = (id(task.model), id(task.learner),
         tuple((k, v.shape, str(v.dtype)) for k, v in sorted(sample_batch.items())))
  memo = task.__dict__.setdefault("_logical_specs_memo", {})
  if key not in memo:
    memo[key] = logical_specs(task.model, task.learner.transform(), sample_batch)
  return memo[key]


def opt_state_specs(tx: optax.GradientTransformation, opt_state: Any, param_specs: Any,
                    params: Any, slot_spec: Any = None) -> Any:
  """The optimizer state's PartitionSpecs: slot_spec(slot, param's spec, param) for each
  slot of a parameter (default _slot_spec), replicated for the rest. A
  FrozenTransformation's state holds slots of the trained parameters only."""
  is_spec = lambda x: isinstance(x, PartitionSpec)  # noqa: E731
  if isinstance(tx, FrozenTransformation):
    tx, params, param_specs = tx.inner, tx.select(params), tx.select(param_specs, is_spec)
  return optax.tree_map_params(
      tx, slot_spec or _slot_spec, opt_state, param_specs, params,
      transform_non_params=lambda _: PartitionSpec(), is_leaf=is_spec)


def _slot_spec(slot: Any, spec: PartitionSpec, param: Any) -> PartitionSpec:
  shape = getattr(slot, "shape", None)
  if shape == param.shape:
    return spec
  if shape is not None and len(shape) >= 2 and shape == param.shape[1:]:
    # A per-layer slot of a stacked parameter (sharded Adafactor's momentum scale of a
    # [layers, ...] or pipelined [repeats, stages, ...] weight): the parameter's spec
    # without its leading dim, not a replicated copy of nearly the whole parameter.
    parts = (*spec, *(None,) * (len(param.shape) - len(spec)))
    return PartitionSpec(*parts[1:])
  return PartitionSpec()


def count_params(params: Any) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(params))
