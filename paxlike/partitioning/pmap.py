"""The pmap partitioner: state replicated over local devices, batch split.

Pax runs an experiment with pmap when ICI_MESH_SHAPE is None. Gradients and
metrics are averaged with a collective over the 'batch' axis, each device's
weighed by its tokens (the whole batch's mean, as under SPMD); the PRNG key
is folded with the device index (after the step fold done by the train
step), so devices draw different randomness, reproducibly.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from paxlike.errors import UserError
from paxlike.partitioning.host_blocks import process_copy, put_and_release

AXIS = "batch"

# Set while a step traces under this partitioner's pmap (pmap_axis says so to a layer).
_TRACING: contextvars.ContextVar[bool] = contextvars.ContextVar("paxlike_pmap", default=False)


def pmap_axis() -> str | None:
  """AXIS while a pmap step is being traced (a layer that sums over the whole batch, as
  praxis's batch norm does, adds the other devices' rows over it); None otherwise."""
  return AXIS if _TRACING.get() else None


class PmapPartitioner:
  """Same interface as SpmdPartitioner; see paxlike.partitioning.spmd."""

  kind = "pmap"

  def __init__(self, devices: list[jax.Device] | None = None) -> None:
    self.devices = list(devices or jax.local_devices())
    self.num_local = len(self.devices)
    self._stacked = NamedSharding(Mesh(np.asarray(self.devices), (AXIS,)), PartitionSpec(AXIS))
    self._abstract = None
    self._global: NamedSharding | None = None

  @property
  def num_batch_shards(self) -> int:
    return jax.device_count()

  def check_global_batch(self, global_batch: int) -> None:
    per_host = global_batch // jax.process_count()
    if per_host % self.num_local:
      raise UserError(
          f"the per-host batch {per_host} does not divide over the {self.num_local} local "
          "devices of a pmap run; change PERCORE_BATCH_SIZE or the device count.")

  def check_decode_batch(self, global_batch: int) -> None:
    """Any decode batch fits: it runs on one device (decode_inputs)."""
    del global_batch

  def _step_devices(self) -> list[jax.Device] | None:
    """The devices a step maps over: these, or (None) every process's where there are
    several processes and these are this one's."""
    if jax.process_count() > 1 and self.devices == jax.local_devices():
      return None
    return self.devices

  def set_state_specs(self, specs: Any) -> None:
    del specs  # pmap replicates everything

  def mesh_specs(self, specs: Any) -> Any:
    return jax.tree.map(lambda _: "replicated", specs,
                        is_leaf=lambda x: isinstance(x, PartitionSpec))

  def abstract_state(self, abstract: Any) -> Any:
    """Restore targets: the unreplicated state, on the first device (with several
    processes, replicated over every process's devices, as orbax reads it there), whatever
    devices wrote it."""
    sharding = self._everywhere() or jax.sharding.SingleDeviceSharding(self.devices[0])
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
                        abstract)

  def _everywhere(self) -> NamedSharding | None:
    """With several processes: a value replicated over every device of every process."""
    if jax.process_count() == 1:
      return None
    if self._global is None:
      self._global = NamedSharding(Mesh(np.asarray(jax.devices()), ("all",)), PartitionSpec())
    return self._global

  def _replicate(self, tree: Any) -> Any:
    def rep(x):
      x = np.asarray(jax.device_get(process_copy(x)))
      return jax.device_put(np.broadcast_to(x, (self.num_local, *x.shape)), self._stacked)
    return jax.tree.map(rep, tree)

  def init_state(self, init: Callable[[jax.Array], Any], seed: int) -> Any:
    """Every device runs init with the same key: identical replicas."""
    keys = jax.device_put(
        np.broadcast_to(jax.random.key_data(jax.random.key(seed)), (self.num_local, 2)),
        self._stacked)
    return jax.pmap(lambda k: init(jax.random.wrap_key_data(k)), devices=self.devices)(keys)

  def shard_state(self, state: Any) -> Any:
    return self._replicate(state)

  def place_param(self, read: Callable[[tuple[slice, ...] | None], np.ndarray],
                  like: jax.Array) -> jax.Array:
    """A parameter replicated like `like` ([local devices, ...]) from its host value."""
    value = np.asarray(read(None), like.dtype)
    return put_and_release(value, lambda v: [jax.device_put(
        np.broadcast_to(v, like.shape), self._stacked, may_alias=False)])[0]

  def to_saveable(self, state: Any) -> Any:
    """The first device's copy: the unreplicated state, which SPMD runs can load. Taken
    from the shard itself: indexing the stacked array would be a program over the step's
    devices, every process's on many hosts, which each process runs alone."""
    return jax.tree.map(lambda x: x.addressable_data(0).reshape(x.shape[1:]), state)

  def to_checkpoint(self, state: Any) -> Any:
    """What checkpoints store: to_saveable, or with several processes each leaf as one
    array replicated over every process's devices (orbax writes no array of one
    process's alone there)."""
    sharding = self._everywhere()
    if sharding is None:
      return self.to_saveable(state)

    def everywhere(x: jax.Array) -> jax.Array:
      copies = [s.data.reshape(x.shape[1:]) for s in x.addressable_shards]  # one per device
      return jax.make_array_from_single_device_arrays(x.shape[1:], sharding, copies)

    return jax.tree.map(everywhere, state)

  def shard_batch(self, host_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    out = {}
    for k, v in host_batch.items():
      if v.shape[0] % self.num_local:
        raise UserError(f"batch field {k!r} has {v.shape[0]} rows, which do not divide over "
                        f"{self.num_local} local devices.")
      out[k] = jax.device_put(v.reshape(self.num_local, -1, *v.shape[1:]), self._stacked)
    return out

  def unshard(self, tree: Any) -> Any:
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x))[0], tree)

  @staticmethod
  def reduce(tree: Any, weight: jax.Array | None = None) -> Any:
    """Mean over devices, each device's values weighed by its `weight` where given: the
    step weighs gradients, loss and metrics by each device's loss weight (its tokens), so
    that they are the whole batch's, as under SPMD (and as Pax's pmap loss aggregation)."""
    if weight is None:
      return jax.lax.pmean(tree, AXIS)
    share = weight / jnp.maximum(jax.lax.psum(weight, AXIS), 1e-8)

    def weigh(x: jax.Array) -> jax.Array:
      if not jnp.issubdtype(x.dtype, jnp.inexact):
        return jax.lax.pmean(x, AXIS)
      return jax.lax.psum(x * share.astype(x.dtype), AXIS)
    return jax.tree.map(weigh, tree)

  @staticmethod
  def reduce_sum(tree: Any) -> Any:
    """Sum over devices (eval counts)."""
    return jax.lax.psum(tree, AXIS)

  def context(self) -> Any:
    return contextlib.nullcontext()

  def decode_params(self, state: Any) -> Any:
    """Decoding runs on one device with one replica's parameters."""
    return self.to_saveable(state).params

  def decode_inputs(self, *arrays: np.ndarray) -> tuple[jax.Array, ...]:
    return tuple(jax.device_put(a, self.devices[0]) for a in arrays)

  def compile(self, step: Callable, *, donate_state: bool = True,
              returns_state: bool = True) -> Callable:
    """pmap over local devices; the step sees one device's slice of the batch."""
    del returns_state

    def per_device(state, batch, key):
      token = _TRACING.set(True)
      try:
        return step(state, batch, jax.random.fold_in(key, jax.lax.axis_index(AXIS)))
      finally:
        _TRACING.reset(token)

    # Over every process's devices (each process feeds its own): the step's means and sums
    # then cover the whole global batch, as Pax's multi-host pmap does.
    mapped = jax.pmap(per_device, axis_name=AXIS, in_axes=(0, 0, None),
                      donate_argnums=(0,) if donate_state else (), devices=self._step_devices())
    mapped_run = lambda state, batch, key: mapped(state, batch, key)
    mapped_run.jitted = mapped
    mapped_run.lower = mapped.lower
    return mapped_run
