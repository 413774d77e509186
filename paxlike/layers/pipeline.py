"""Pipeline parallelism inside one SPMD program (Pax's PipelinedTransformer).

The layers are stacked [circular_repeat, stages, ...] (per stage, the
layers_per_stage layers scanned as `repeat` [L, ...] or unrolled as
`x_layers_j`), the stage axis sharded over the mesh's 'stage' axis. Every
iteration, each stage runs its layers (jax.vmap over stages, one program) on
the activation it holds, then the activations shift one stage on (jnp.roll
over the stage axis: a collective permute between stage devices).

Schedule (GPipe when circular_repeat R = 1, circular otherwise): with S
stages and M microbatches, stage s at iteration t works on k = t - s, that is
microbatch k mod M in its pass k // M over the stages; a microbatch leaves the
last stage into an io buffer of M slots, where stage 0 picks it up again for
its next pass (so the circular schedule needs M >= S). M x R + S - 1
iterations in all, of which S - 1 are each stage's bubble. The backward pass
is autodiff of the loop: all forwards, then all backwards.

A scanned stack whose layers alternate between structures (mixture-of-experts
and dense feed-forwards) scans blocks of p layers: `repeat` holds `layer_j`
[N / p, ...] for j < p, logical layer k x p + j at index k of `layer_j`.

Logical layer l = (r x S + s) x L + j lives in repeat r, stage s, slot j:
to_layers / from_layers convert any layout (scanned, unrolled, pipelined with
any S and R) to the logical list and back, which is how a checkpoint moves
between layouts.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from paxlike.errors import UserError, counted

STAGE_AXIS = "stage"  # the logical (and mesh) axis of the stage dimension
REPEAT_AXIS = "circular_repeat"  # the logical axis of the circular repeats (not sharded)
PIPELINE_PARAM = "pipeline"  # the stack's parameter holding [R, S, ...] stage weights


@dataclasses.dataclass(frozen=True)
class Layout:
  """How a stack of num_layers layers is stored.

  num_stages None: not pipelined (scanned `repeat` [N, ...] with
  use_repeated_layer, else `x_layers_i`); otherwise [R, S, ...] under
  `pipeline`, each stage's layers scanned or unrolled by use_repeated_layer.
  """

  num_layers: int
  use_repeated_layer: bool
  num_stages: int | None = None
  circular_repeat: int = 1

  @property
  def lead_dims(self) -> int:
    """How many leading dims of a stacked leaf index its layers: [layers] scanned,
    [repeats, stages] pipelined (and [.., L] when each stage is scanned)."""
    return (0 if self.num_stages is None else 2) + int(self.use_repeated_layer)

  @property
  def layers_per_stage(self) -> int:
    if self.num_stages is None:
      return self.num_layers
    return self.num_layers // (self.num_stages * self.circular_repeat)

  def stage_policy(self, checkpoint_policy: str) -> str:
    """The remat policy of the layers inside a pipeline stage, as Pax sets it.

    The pipeline's iteration is rematerialised by checkpoint_policy (pipeline.run)
    either way. A scanned stage (Pax's StackedTransformerRepeated, which takes
    CHECKPOINT_POLICY too) also rematerialises each of its layers by it, so an
    iteration's backward pass holds one layer's activations at a time rather
    than every layer's of the stage (their scores included), for one more
    forward pass of each layer; an unrolled stage (Pax's StackedTransformer)
    saves everything within the iteration.
    """
    return checkpoint_policy if self.use_repeated_layer else "SAVE_EVERYTHING"

  def describe(self) -> str:
    inner = "scanned" if self.use_repeated_layer else "unrolled"
    if self.num_stages is None:
      return f"{self.num_layers} layers, {inner}"
    text = f"{self.num_stages} stages x {counted(self.layers_per_stage, 'layer')} ({inner})"
    if self.circular_repeat > 1:
      text += f", circular repeat {self.circular_repeat}"
    return text


@dataclasses.dataclass(frozen=True)
class StackForm:
  """How a model's stored trees (parameters, optimizer slots) hold its layer stack, for
  paxlike.relayout, which reads stacks as `transformer` subtrees ({'repeat'},
  {'x_layers_i'} or {'pipeline'}). This one: they already are (the LM). A model that
  keeps its layers elsewhere returns a subclass from its stack_form()."""

  def to(self, tree: Any) -> Any:
    """tree with its layers as `transformer` subtrees."""
    return tree

  def back(self, tree: Any) -> Any:
    """to's inverse."""
    return tree

  def name(self, name: str) -> str:
    """A parameter or slot name as `to` names it."""
    return name


class PipelinedModel:
  """layout / check_batch / unpipelined of a model with Pax's pipeline fields (num_layers,
  use_repeated_layer, num_stages, circular_repeat, num_microbatches, microbatch_size,
  stream_io): the LM's and the Llama family's. Mixed in before BaseModel."""

  def layout(self) -> Layout:
    return Layout(self.num_layers, self.use_repeated_layer, self.num_stages,
                  self.circular_repeat)

  def check_batch(self, rows: int) -> None:
    if self.num_stages is not None:
      check_batch(rows, self.num_stages, self.num_microbatches, self.microbatch_size,
                  self.circular_repeat, stream_io=self.stream_io)

  def unpipelined(self) -> Any:
    """The same model without a pipeline (its layers scanned); its parameters are these
    restacked (the model's restack_params)."""
    if self.num_stages is None:
      return self
    return self._twin(use_repeated_layer=True)

  def for_decoding(self) -> Any:
    """The model decoding runs: unpipelined, its layers unrolled (BaseModel.for_decoding)."""
    if self.num_stages is None and not self.use_repeated_layer:
      return self
    return self._twin(use_repeated_layer=False)

  def _twin(self, use_repeated_layer: bool) -> Any:
    return self.clone(num_stages=None, circular_repeat=1, num_microbatches=None,
                      microbatch_size=None, stream_io=False,
                      use_repeated_layer=use_repeated_layer, parent=None)


def bubble_fraction(num_stages: int, num_microbatches: int, circular_repeat: int = 1) -> float:
  """The share of each stage's iterations spent idle: (S-1) / (M x R + S - 1)."""
  s, m, r = num_stages, num_microbatches, circular_repeat
  return (s - 1) / (m * r + s - 1)


def iterations(num_stages: int, num_microbatches: int, circular_repeat: int = 1) -> int:
  return num_microbatches * circular_repeat + num_stages - 1


def microbatch_sizes(batch: int, num_microbatches: int | None,
                     microbatch_size: int | None) -> tuple[int, int]:
  """(M, microbatch size) from one of them, by praxis's rule: the other is batch / it."""
  if num_microbatches is None:
    return batch // microbatch_size, microbatch_size
  return num_microbatches, batch // num_microbatches


def check_batch(rows: int, num_stages: int, num_microbatches: int | None,
                microbatch_size: int | None, circular_repeat: int,
                stream_io: bool = False) -> None:
  """One line when the microbatches do not split a step's `rows` rows (Pax's names), or
  (stream_io) do not split over the stages, as praxis's stream buffer [stages, M / stages]
  needs."""
  m, size = num_microbatches, microbatch_size
  if m is not None and rows % m:
    raise UserError(f"NUM_MICROBATCHES={m} does not divide the batch of {rows} rows.")
  if size is not None and rows % size:
    raise UserError(f"MICROBATCH_SIZE={size} does not divide the batch of {rows} rows.")
  if m is not None and size is not None and m * size != rows:
    raise UserError(f"NUM_MICROBATCHES x MICROBATCH_SIZE = {m} x {size} = {m * size} is not "
                    f"the batch of {rows} rows; set only one of them.")
  count = m if m is not None else rows // size
  makes = f"the batch of {rows} rows makes {counted(count, 'microbatch', 'microbatches')}"
  if circular_repeat > 1 and count < num_stages:
    raise UserError(f"{makes}, fewer than NUM_STAGES={num_stages}: the circular schedule "
                    f"(CIRCULAR_REPEAT={circular_repeat}) needs at least one microbatch per "
                    "stage.")
  if stream_io and count % num_stages:
    raise UserError(f"STREAM_IO=True splits the microbatches evenly over the stages (praxis's "
                    f"stream buffer is [stages, microbatches / stages]), but {makes} on "
                    f"NUM_STAGES={num_stages}; make the count a multiple of {num_stages} or "
                    "drop STREAM_IO.")


# ------------------------------------------------------------ the schedule


def split(x: jax.Array, m: int) -> jax.Array:
  """[B, ...] -> [M, B/M, ...]; microbatch i holds rows i, i + M, ... so that the
  rows of every microbatch stay spread over the batch's data shards."""
  return jnp.swapaxes(x.reshape(x.shape[0] // m, m, *x.shape[1:]), 0, 1)


def merge(x: jax.Array) -> jax.Array:
  """split's inverse: [M, B/M, ...] -> [B, ...]."""
  return jnp.swapaxes(x, 0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def constrain(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
  """nn.with_logical_constraint, leaving replicated any dim its mesh axes do not divide
  (a microbatch of fewer rows than batch shards, say)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  spec = nn.logical_to_mesh_axes(names)
  if spec is None:
    return x
  kept = []
  for dim, axes in zip(x.shape, spec, strict=True):
    group = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    size = int(np.prod([mesh.shape[a] for a in group])) if group else 1
    kept.append(axes if size and dim % size == 0 else None)
  return jax.lax.with_sharding_constraint(x, jax.sharding.PartitionSpec(*kept))


def _select_repeat(leaf: jax.Array, rep: jax.Array) -> jax.Array:
  """[R, S, ...] weights -> [S, ...]: stage s's weights of repeat rep[s].

  A chain of selects, local to each stage's devices (a gather over the sharded
  stage axis could make XLA move weights between stages).
  """
  out = leaf[0]
  for r in range(1, leaf.shape[0]):
    pick = (rep == r).reshape((-1,) + (1,) * (out.ndim - 1))
    out = jnp.where(pick, leaf[r], out)
  return out


def run(stage_fn: Any, weights: Any, x: jax.Array, *, num_stages: int, num_microbatches: int,
        circular_repeat: int, policy: Any, remat: bool, stream_io: bool,
        segment_ids: jax.Array | None = None, positions: jax.Array | None = None,
        rng: jax.Array | None = None, empty_record: Any = None) -> tuple[jax.Array, Any]:
  """Runs x [B, T, D] through the pipeline; returns ([B, T, D], the records' mean).

  stage_fn(weights_s, h [mb, T, D], segment_ids_s, positions_s, rng_s) -> (h, record):
  one stage's layers, and a tree of float scalars shaped like empty_record (the
  mixture-of-experts layers' routing record; None: {}, no record); weights: a tree of
  [R, S, ...] leaves. The records of the iterations that carry a microbatch (not the
  bubble's) are summed and divided by M: per layer, the mean over the microbatches, as one
  unpipelined call over the batch gives it.
  """
  s_count, m, r_count = num_stages, num_microbatches, circular_repeat
  xs = split(x, m)  # [M, mb, T, D]
  io_axes = (STAGE_AXIS if stream_io else None, "batch", "length", "activation_embed")
  io = constrain(xs, io_axes)
  seg = None if segment_ids is None else split(segment_ids, m)
  pos_shared = positions is not None and positions.shape[0] == 1
  pos = None if positions is None or pos_shared else split(positions, m)
  stages = jnp.arange(s_count)

  def compute(state, t):
    """Every stage's layers on the activation it holds: the rematerialised part."""
    k = t - stages  # [S]: each stage's place in the schedule
    mb_index = jnp.remainder(k, m)
    rep = jnp.clip(k // m, 0, r_count - 1)
    w = jax.tree.map(lambda leaf: _select_repeat(leaf, rep), weights)
    seg_s = None if seg is None else jnp.take(seg, mb_index, axis=0)
    if pos is not None:
      pos_s = jnp.take(pos, mb_index, axis=0)
    elif pos_shared:
      pos_s = jnp.broadcast_to(positions[None], (s_count, *positions.shape))
    else:
      pos_s = None
    rngs = None if rng is None else jax.random.split(jax.random.fold_in(rng, t), s_count)
    return jax.vmap(stage_fn, spmd_axis_name=STAGE_AXIS)(w, state, seg_s, pos_s, rngs)

  if remat:
    # Only the iteration's input activations are saved for the backward pass (one
    # microbatch per stage per iteration); the io buffer stays outside the remat, so
    # the backward pass does not keep a copy of it for every iteration.
    compute = jax.checkpoint(compute, policy=policy, prevent_cse=False)

  def body(carry, t):
    state, io, total = carry
    state = state.at[0].set(jax.lax.dynamic_index_in_dim(io, jnp.remainder(t, m), 0, False))
    state = constrain(state, (STAGE_AXIS, "batch", "length", "activation_embed"))
    out, records = compute(state, t)
    working = ((t - stages) >= 0) & ((t - stages) < m * r_count)  # [S]: not in the bubble
    total = jax.tree.map(lambda a, r: a + jnp.sum(jnp.where(working, r, 0.0)), total, records)
    last_k = t - (s_count - 1)
    valid = (last_k >= 0) & (last_k < m * r_count)
    slot = jnp.remainder(last_k, m)
    kept = jax.lax.dynamic_index_in_dim(io, slot, 0, False)
    io = jax.lax.dynamic_update_index_in_dim(io, jnp.where(valid, out[-1], kept), slot, 0)
    io = constrain(io, io_axes)
    return (jnp.roll(out, 1, axis=0), io, total), None  # stage s + 1 takes what s made

  state = jnp.zeros((s_count, *xs.shape[1:]), xs.dtype)
  total = jax.tree.map(jnp.zeros_like, {} if empty_record is None else empty_record)
  (_, io, total), _ = jax.lax.scan(body, (state, io, total),
                                   jnp.arange(iterations(s_count, m, r_count)))
  return merge(io), jax.tree.map(lambda a: a / m, total)


def stacked(module: nn.Module, layout: Layout, x: jax.Array, *, init_stage: Any,
            apply_stage: Any, num_microbatches: int | None, microbatch_size: int | None,
            policy: Any, remat: bool, stream_io: bool, segment_ids: jax.Array | None = None,
            positions: jax.Array | None = None, rng: jax.Array | None = None,
            empty_record: Any = None) -> tuple[jax.Array, Any]:
  """A pipelined layer stack inside `module`'s compact call: its `pipeline` parameter and
  the schedule (run) over x [B, T, D]; returns (y, record) as run does.

  init_stage(rng, sample [1, T, D]) -> one stage's params tree (boxed, with its
  logical names); apply_stage(weights, h, segment_ids, positions, rng) -> (h, record):
  one stage's layers (run's stage_fn). The parameter stacks R x S stage inits on
  [circular_repeat, stage] axes. empty_record: the record's zeros (None: {}), what
  initialising returns and what run sums into.
  """
  s, r = layout.num_stages, layout.circular_repeat

  def init(key: jax.Array) -> Any:
    sample = jnp.zeros((1, *x.shape[1:]), x.dtype)
    tree = jax.vmap(lambda k: init_stage(k, sample))(jax.random.split(key, r * s))

    def lead(leaf: Any) -> Any:
      boxed = isinstance(leaf, nn.meta.AxisMetadata)
      value = leaf.value if boxed else leaf  # .value: unbox() would constrain its old names
      value = value.reshape(r, s, *value.shape[1:])
      if boxed:
        return leaf.replace(value=value, names=(REPEAT_AXIS, STAGE_AXIS, *leaf.names))
      return value

    return jax.tree.map(lead, tree, is_leaf=lambda v: isinstance(v, nn.meta.AxisMetadata))

  weights = module.param(PIPELINE_PARAM, init)
  if module.is_initializing():  # the weights are made; init needs no schedule (one row)
    return x, {} if empty_record is None else empty_record
  m, _ = microbatch_sizes(x.shape[0], num_microbatches, microbatch_size)
  if m < 1 or x.shape[0] % m:
    m = math.gcd(x.shape[0], max(m, 1))  # a batch the train-time check did not see (eval)
  check_batch(x.shape[0], s, m, None, r)
  return run(apply_stage, weights, x, num_stages=s, num_microbatches=m, circular_repeat=r,
             policy=policy, remat=remat, stream_io=stream_io, segment_ids=segment_ids,
             positions=positions, rng=rng, empty_record=empty_record)


# --------------------------------------------------------- layout changes

UNROLLED = re.compile(r"x_layers_(\d+)$")  # an unrolled stack's layer keys
BLOCK = re.compile(r"layer_(\d+)$")  # a scanned block's layer keys (see the module docstring)


def _block_size(repeat: Any) -> int:
  """How many layers each scanned step holds: p for a block of `layer_j`, else 1."""
  if isinstance(repeat, dict) and repeat and all(BLOCK.match(k) for k in repeat):
    return len(repeat)
  return 1


def _structure_period(layers: list[Any]) -> int:
  """The shortest p (dividing the count) with every layer shaped like layer i mod p."""
  shapes = [jax.tree.structure(t) for t in layers]
  n = len(shapes)
  return next(p for p in range(1, n + 1)
              if n % p == 0 and all(shapes[i] == shapes[i % p] for i in range(n)))
LAYER_KEY = re.compile(r"layers_(\d+)$")  # an unrolled layer's key in a stored tree


def _is_box(x: Any) -> bool:
  return isinstance(x, nn.meta.AxisMetadata)


def _value(x: Any) -> Any:
  return x.unbox() if _is_box(x) else x


def to_layers(stack: dict[str, Any], layout: Layout) -> list[dict[str, Any]]:
  """The per-layer trees, in logical order, of a stack module's subtree.

  stack: the module's subtree (params, or an optimizer slot mirroring them)
  as a dict: {'repeat': ...}, {'x_layers_0': ..., ...} or {'pipeline': ...}.
  Leaves are arrays (numpy or jax); only leading layer dims are taken apart.
  """
  n = layout.num_layers
  if layout.num_stages is None:
    if layout.use_repeated_layer:
      tree = stack["repeat"]
      p = _block_size(tree)
      if p > 1:
        return [jax.tree.map(lambda a, k=k: a[k], tree[f"layer_{j}"])
                for k in range(n // p) for j in range(p)]
      return [jax.tree.map(lambda a, i=i: a[i], tree) for i in range(n)]
    return [stack[f"x_layers_{i}"] for i in range(n)]
  s, r, per = layout.num_stages, layout.circular_repeat, layout.layers_per_stage
  tree = stack[PIPELINE_PARAM]
  out = []
  for i in range(n):
    rep, rest = divmod(i, s * per)
    stage, j = divmod(rest, per)
    if layout.use_repeated_layer:
      out.append(jax.tree.map(lambda a, rep=rep, stage=stage, j=j: a[rep, stage, j],
                              tree["repeat"]))
    else:
      out.append(jax.tree.map(lambda a, rep=rep, stage=stage: a[rep, stage],
                              tree[f"x_layers_{j}"]))
  del r
  return out


def _stack(trees: list[Any], xp: Any) -> Any:
  return jax.tree.map(lambda *leaves: xp.stack(leaves), *trees)


def from_layers(layers: list[dict[str, Any]], layout: Layout) -> dict[str, Any]:
  """to_layers' inverse: the stack's subtree in `layout` (numpy or jax leaves)."""
  leaves = jax.tree.leaves(layers[0])
  xp = jnp if leaves and isinstance(leaves[0], jax.Array) else np
  if len(layers) != layout.num_layers:
    raise ValueError(f"{len(layers)} layers for a layout of {layout.num_layers}")
  if layout.num_stages is None:
    if layout.use_repeated_layer:
      p = _structure_period(layers)
      if p > 1:
        return {"repeat": {f"layer_{j}": _stack(layers[j::p], xp) for j in range(p)}}
      return {"repeat": _stack(layers, xp)}
    return {f"x_layers_{i}": t for i, t in enumerate(layers)}
  s, r, per = layout.num_stages, layout.circular_repeat, layout.layers_per_stage

  def grid(j: int) -> Any:  # [R, S] of slot j's layers
    return _stack([_stack([layers[(rep * s + st) * per + j] for st in range(s)], xp)
                   for rep in range(r)], xp)

  if layout.use_repeated_layer:
    # [R, S, L, ...]: slot j's grid stacked on a third axis.
    per_slot = [grid(j) for j in range(per)]
    return {PIPELINE_PARAM: {"repeat": jax.tree.map(lambda *a: xp.stack(a, axis=2),
                                                     *per_slot)}}
  return {PIPELINE_PARAM: {f"x_layers_{j}": grid(j) for j in range(per)}}


def _stored_count(stack: dict[str, Any]) -> int | None:
  """How many layers a stored stack subtree holds, read off its keys and shapes."""
  def first(tree: Any) -> Any:
    leaves = jax.tree.leaves(tree, is_leaf=_is_box)
    return _value(leaves[0]) if leaves else None

  if PIPELINE_PARAM in stack:
    inner = stack[PIPELINE_PARAM]
    if not isinstance(inner, dict):
      return None
    if "repeat" in inner:
      leaf = first(inner["repeat"])
      return None if leaf is None or len(leaf.shape) < 3 else int(np.prod(leaf.shape[:3]))
    per = sum(1 for k in inner if UNROLLED.match(k))
    leaf = first(inner)
    return None if leaf is None or len(leaf.shape) < 2 else int(np.prod(leaf.shape[:2])) * per
  if "repeat" in stack:
    leaf = first(stack["repeat"])
    if leaf is None or not leaf.shape:
      return None
    return int(leaf.shape[0]) * _block_size(stack["repeat"])
  return sum(1 for k in stack if UNROLLED.match(k)) or None


def layout_of(stack: dict[str, Any], num_layers: int | None = None) -> Layout:
  """The layout a stored stack subtree has (its keys and leading dims); num_layers None
  reads the layer count off the shapes too."""
  if num_layers is None:
    num_layers = _stored_count(stack)
    if not num_layers:
      raise ValueError(f"not a layer stack: keys {sorted(stack)}")
  if PIPELINE_PARAM in stack:
    inner = stack[PIPELINE_PARAM]
    repeated = "repeat" in inner
    leaf = _value(jax.tree.leaves(inner, is_leaf=_is_box)[0])
    r, s = int(leaf.shape[0]), int(leaf.shape[1])
    return Layout(num_layers, repeated, s, r)
  if "repeat" in stack:
    return Layout(num_layers, True)
  if any(UNROLLED.match(k) for k in stack):
    return Layout(num_layers, False)
  raise ValueError(f"not a layer stack: keys {sorted(stack)}")


def restack(stack: dict[str, Any], num_layers: int, target: Layout) -> dict[str, Any]:
  """A stack subtree (any layout) in the target layout; unchanged when already there."""
  source = layout_of(stack, num_layers)
  if source == target:
    return stack
  return from_layers(to_layers(stack, source), target)


def to_stack(params: dict[str, Any]) -> dict[str, Any]:
  """A params tree's layers stored as run_layers names them (the Llama family's, and each
  T5 stack's) as a stack subtree: `layers` scanned -> {'repeat'}, `layers_i` ->
  {'x_layers_i'}, `layers/pipeline` as it is. Leaves may be boxed, numpy or jax."""
  layers = params.get("layers")
  if isinstance(layers, dict) and PIPELINE_PARAM in layers:
    stack = layers
  elif layers is not None:
    stack = {"repeat": layers}
  else:
    stack = {f"x_{k}": v for k, v in params.items() if LAYER_KEY.match(k)}
  return stack


def from_stack(stack: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
  """to_stack's inverse: params with its layers replaced by `stack`'s."""
  out = {k: v for k, v in params.items() if k != "layers" and not LAYER_KEY.match(k)}
  if PIPELINE_PARAM in stack:
    out["layers"] = stack
  elif "repeat" in stack:
    out["layers"] = stack["repeat"]
  else:
    out.update({k[2:]: v for k, v in stack.items()})
  return out
