"""Non-trainable parameters: state a forward pass moves, which no optimizer touches.

praxis keeps such state (batch norm's moving mean and variance) in a
NON_TRAINABLE collection that the forward pass updates. paxlike keeps it in
`params`, beside the weights, so checkpoints, shardings, restores and the
pmap and SPMD paths carry it unchanged, and the train step treats it apart:

- A layer says, while it is traced, that a parameter is non-trainable
  (`declare(path)`), and reads it through `frozen(value)`, so no loss
  gradient reaches it.
- Its new value joins the loss through `carry(old, new)`, which adds exactly
  0 to the loss and whose "gradient" for `old` is `new - old`. Averaged like
  any gradient (over microbatches by their weight, over pmap devices), that is
  the mean change the step's batches made.
- The train step (paxlike.steps) collects the declared paths while it traces
  the forward pass, hands the optimizer zeros for them (no clipping share, no
  update, and any weight decay undone), and adds the change to the old value.

A parameter a pass declares but does not move gets no change. Eval, init and
decode passes move nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax
import jax.numpy as jnp

_DECLARED: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar(
    "paxlike_nontrainable", default=None)


@contextlib.contextmanager
def collecting() -> Iterator[set[str]]:
  """The '/'-joined parameter paths declared non-trainable while the block traces."""
  paths: set[str] = set()
  token = _DECLARED.set(paths)
  try:
    yield paths
  finally:
    _DECLARED.reset(token)


def declare(path: str) -> None:
  """Marks the parameter at `path` ('/'-joined, from the model's params root) as
  non-trainable for the train step being traced; outside one, nothing happens."""
  paths = _DECLARED.get()
  if paths is not None:
    paths.add(path)


def frozen(value: jax.Array) -> jax.Array:
  """A non-trainable parameter's value as a forward pass reads it: no gradient."""
  return jax.lax.stop_gradient(value)


@jax.custom_vjp
def carry(old: jax.Array, new: jax.Array) -> jax.Array:
  """0.0 (float32), to add to the loss; its gradient for `old` is `new - old`."""
  del old, new
  return jnp.zeros((), jnp.float32)


def _carry_fwd(old: jax.Array, new: jax.Array) -> tuple[jax.Array, jax.Array]:
  return jnp.zeros((), jnp.float32), new - old


def _carry_bwd(change: jax.Array, g: jax.Array) -> tuple[jax.Array, jax.Array]:
  del g  # the change is the same whatever the loss is scaled by
  return change, jnp.zeros_like(change)


carry.defvjp(_carry_fwd, _carry_bwd)


def moved(old: jax.Array, new: jax.Array) -> jax.Array:
  """carry() of the parameter `old` (as stored, not frozen()) and its new value computed
  by the pass, which no gradient flows back into."""
  return carry(old, jax.lax.stop_gradient(new).astype(old.dtype))
