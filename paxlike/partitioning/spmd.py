"""The SPMD partitioner: jit with NamedShardings on a named device mesh."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from paxlike import mesh as mesh_lib
from paxlike.errors import UserError
from paxlike.partitioning.host_blocks import put_and_release


def _is_spec(x: Any) -> bool:
  return isinstance(x, PartitionSpec)


class SpmdPartitioner:
  """Shards state by logical-axis rules and the batch over replica x data (x data_expert).

  Args:
    mesh: the ('replica', 'data', 'mdl') mesh, or a 4-axis one (paxlike.mesh).
    rules: logical axis name -> mesh axes; None: paxlike.mesh's for this mesh.
  """

  kind = "spmd"

  def __init__(self, mesh: Mesh, rules=None) -> None:
    self.mesh = mesh
    # None: the plain rules of this mesh (the expert-parallel ones where it has 'data_expert').
    self.rules = tuple(rules if rules is not None else mesh_lib.logical_axis_rules(
        axes=mesh.axis_names))
    self.replicated = NamedSharding(mesh, PartitionSpec())
    # A pipeline's stage axis over processes: each process reads rows of its own, so the
    # input is split over the stages too (replicated over them, every process would have
    # to read every row); the model's first constraint regroups the rows.
    self.batch_axes = mesh_lib.batch_axes(mesh.axis_names)
    if "stage" in mesh.axis_names and len({d.process_index for d in mesh.devices.flat}) > 1:
      self.batch_axes = ("stage", *self.batch_axes)
    self.batch_sharding = NamedSharding(mesh, PartitionSpec(self.batch_axes))
    self._state_shardings = None

  @property
  def num_batch_shards(self) -> int:
    return int(np.prod([self.mesh.shape[a] for a in self.batch_axes]))

  def check_global_batch(self, global_batch: int) -> None:
    if global_batch % self.num_batch_shards:
      raise UserError(
          f"the global batch {global_batch} does not divide over {' x '.join(self.batch_axes)} "
          f"= {self.num_batch_shards} mesh shards; change the batch size or the mesh.")

  def check_decode_batch(self, global_batch: int) -> None:
    """A decode batch is sharded as a training batch is (decode_inputs)."""
    self.check_global_batch(global_batch)

  def state_shardings(self, specs: Any) -> Any:
    """Logical PartitionSpecs -> NamedShardings on this mesh (names that are mesh axes
    themselves, mesh.DIRECT's, resolve after the rules)."""
    rules = self.rules + mesh_lib.direct_rules(self.mesh.axis_names)
    return nn.logical_to_mesh_sharding(specs, self.mesh, rules)

  def mesh_specs(self, specs: Any) -> Any:
    """Logical PartitionSpecs -> mesh-axis PartitionSpecs."""
    return jax.tree.map(lambda s: s.spec, self.state_shardings(specs))

  def set_state_specs(self, specs: Any) -> None:
    self._state_shardings = self.state_shardings(specs)

  def abstract_state(self, abstract: Any) -> Any:
    """ShapeDtypeStructs carrying the state's shardings (restore targets)."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, self._state_shardings)

  def init_state(self, init: Callable[[jax.Array], Any], seed: int) -> Any:
    """Runs init directly into the state's shardings (no host copy)."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      return jax.jit(init, out_shardings=self._state_shardings)(jax.random.key(seed))

  def shard_state(self, state: Any) -> Any:
    return jax.device_put(state, self._state_shardings)

  def place_param(self, read: Callable[[tuple[slice, ...]], np.ndarray], like: jax.Array
                  ) -> jax.Array:
    """A parameter built in like's sharding from host blocks, one block at a time.

    read(index) gives the block `index` (a tuple of slices) of the parameter;
    each distinct block is read once and copied to every device that holds
    it, so the host holds one block, never the whole parameter unless it is
    replicated.
    """
    groups: dict[tuple, list[tuple[jax.Device, tuple[slice, ...]]]] = {}
    for device, index in like.sharding.addressable_devices_indices_map(like.shape).items():
      key = tuple(s.indices(n) for s, n in zip(index, like.shape, strict=True))
      groups.setdefault(key, []).append((device, index))
    shards = []
    for members in groups.values():
      block = np.asarray(read(members[0][1]), like.dtype)
      # may_alias=False: a CPU device would otherwise keep the host block as its buffer.
      shards += put_and_release(block, lambda b, members=members: [
          jax.device_put(b, device, may_alias=False) for device, _ in members])
      del block
    return jax.make_array_from_single_device_arrays(like.shape, like.sharding, shards)

  def to_saveable(self, state: Any) -> Any:
    """The state as checkpoints store it: the global sharded arrays."""
    return state

  to_checkpoint = to_saveable

  def shard_batch(self, host_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """This process's rows -> global arrays sharded over replica x data."""
    return {k: jax.make_array_from_process_local_data(self.batch_sharding, v)
            for k, v in host_batch.items()}

  def unshard(self, tree: Any) -> Any:
    """Values a host can use (metrics); replicated arrays only."""
    return jax.device_get(tree)

  @staticmethod
  def reduce(tree: Any, weight: jax.Array | None = None) -> Any:
    """Cross-device (weighted) mean of per-device values: nothing to do under SPMD, whose
    values are already the whole batch's."""
    del weight
    return tree

  @staticmethod
  def reduce_sum(tree: Any) -> Any:
    """Cross-device sum of per-device values: nothing to do under SPMD."""
    return tree

  @contextlib.contextmanager
  def context(self) -> Iterator[None]:
    """The mesh and logical-axis rules, for code jitted outside compile()."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      yield

  def decode_params(self, state: Any) -> Any:
    return state.params

  def decode_inputs(self, *arrays: np.ndarray) -> tuple[jax.Array, ...]:
    """Host arrays with a leading batch dim -> global arrays sharded like batches."""
    return tuple(jax.make_array_from_process_local_data(self.batch_sharding, a) for a in arrays)

  def compile(self, step: Callable, *, donate_state: bool = True,
              returns_state: bool = True) -> Callable:
    """jit with explicit shardings: (state, batch, key) -> (state, metrics) or metrics."""
    state_sh = self._state_shardings

    def traced(*args):
      with nn.logical_axis_rules(self.rules):
        return step(*args)

    out_shardings = (state_sh, self.replicated) if returns_state else self.replicated
    jitted = jax.jit(traced, in_shardings=(state_sh, self.batch_sharding, self.replicated),
                     out_shardings=out_shardings,
                     donate_argnums=(0,) if donate_state else ())

    def run(state, batch, key):
      with jax.set_mesh(self.mesh):
        return jitted(state, batch, key)

    run.jitted = jitted
    run.lower = lambda *a: _in_mesh(self.mesh, jitted.lower, *a)
    # In the step's own mesh context, the trace of its first dispatch is reused.
    run.trace = lambda *a: _in_mesh(self.mesh, jitted.trace, *a)
    return run


def _in_mesh(mesh: Mesh, method: Callable, *args: Any) -> Any:
  with jax.set_mesh(mesh):
    return method(*args)

