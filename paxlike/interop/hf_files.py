"""What every Hugging Face family's import/export shares: file names and tree paths."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def write_directory(directory: str, config: dict[str, Any],
                    tensors: dict[str, np.ndarray]) -> None:
  """config.json and model.safetensors, as transformers' from_pretrained reads them (it
  refuses a safetensors file without the format metadata)."""
  import json
  import os

  from safetensors.numpy import save_file

  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, CONFIG), "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
    f.write("\n")
  save_file(tensors, os.path.join(directory, SINGLE), metadata={"format": "pt"})


def same(a: Any, b: Any) -> bool:
  """Config values equal (floats to 1e-9 relative)."""
  if isinstance(a, float) or isinstance(b, float):
    return isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(
        a, b, rel_tol=1e-9)
  return a == b


def flat_names(tree: Any) -> dict[str, Any]:
  """{"a/b/c": leaf} of a nested params tree (model_analysis.txt's names)."""
  import jax

  return {"/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def set_path(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
  """tree[path[0]][path[1]]... = value, creating the dicts on the way."""
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def get_path(tree: Any, path: tuple[str, ...]) -> Any:
  """tree[path[0]][path[1]]..."""
  for key in path:
    tree = tree[key]
  return tree


@dataclasses.dataclass
class LazyParam:
  """One parameter of the model, read from the checkpoint only when asked.

  A stacked (scanned) parameter has one reader per layer, so a block of it
  reads just the layers the block covers: an import holds one checkpoint
  tensor and one block of one parameter on the host at a time.
  """

  shape: tuple[int, ...]  # the paxlike shape ([layers, ...] when stacked)
  readers: list[Callable[[], np.ndarray]]  # float32, paxlike layout; one per layer if stacked
  stacked: bool

  def read(self, index: tuple[slice, ...] | None = None) -> np.ndarray:
    """The parameter (index None) or the block `index` of it, as float32."""
    index = tuple(index) if index is not None else ()
    if not self.stacked:
      return np.ascontiguousarray(self.readers[0]()[index])
    layers = range(self.shape[0])[index[0] if index else slice(None)]
    # Filled a layer at a time: the host holds the block and one layer's tensor,
    # not a list of every layer's slice beside their stack.
    out = None
    for row, i in enumerate(layers):
      piece = self.readers[i]()[index[1:]]
      if out is None:
        out = np.empty((len(layers), *piece.shape), piece.dtype)
      out[row] = piece
      del piece
    return out if out is not None else np.empty((0, *self.shape[1:]), np.float32)


@dataclasses.dataclass
class LazyGrid(LazyParam):
  """A pipelined layer parameter, read from the checkpoint only when asked: its `lead`
  leading dims ([circular_repeat, stage] and, scanned, [layer slot]) index layers, and
  layer_of(position) names the logical layer (paxlike.layers.pipeline's order) whose
  reader fills that position. A block reads only the layers it covers."""

  lead: int
  layer_of: Callable[[tuple[int, ...]], int]

  def read(self, index: tuple[slice, ...] | None = None) -> np.ndarray:
    index = tuple(index) if index is not None else ()
    index = index + (slice(None),) * max(0, self.lead - len(index))
    ranges = [range(n)[i] for n, i in zip(self.shape[:self.lead], index[:self.lead],
                                          strict=True)]
    out = None
    for position in itertools.product(*(range(len(r)) for r in ranges)):
      layer = self.layer_of(tuple(r[p] for r, p in zip(ranges, position, strict=True)))
      piece = self.readers[layer]()[index[self.lead:]]
      if out is None:
        out = np.empty((*(len(r) for r in ranges), *piece.shape), piece.dtype)
      out[position] = piece
      del piece
    if out is None:  # an empty block
      rest = np.empty(self.shape[self.lead:], np.float32)[index[self.lead:]].shape
      out = np.empty((*(len(r) for r in ranges), *rest), np.float32)
    return out


def lazy_pipeline(stack: dict[str, Any], layout: Any) -> dict[str, Any]:
  """A scanned stack of LazyParams ({'repeat': tree}, one reader per layer) as the
  pipelined `layout`'s stack subtree (paxlike.layers.pipeline.from_layers' layout), still
  unread."""
  s, per = layout.num_stages, layout.layers_per_stage
  r = layout.circular_repeat

  def grid(leaf: LazyParam, slot: int | None) -> LazyGrid:
    one = tuple(leaf.shape[1:])
    if slot is None:  # each stage's layers scanned: [R, S, L, ...]
      return LazyGrid((r, s, per, *one), leaf.readers, True, 3,
                      lambda p: (p[0] * s + p[1]) * per + p[2])
    return LazyGrid((r, s, *one), leaf.readers, True, 2,
                    lambda p, j=slot: (p[0] * s + p[1]) * per + j)

  def each(tree: Any, slot: int | None) -> Any:
    if isinstance(tree, LazyParam):
      return grid(tree, slot)
    return {k: each(v, slot) for k, v in tree.items()}

  if layout.use_repeated_layer:
    return {"pipeline": {"repeat": each(stack["repeat"], None)}}
  return {"pipeline": {f"x_layers_{j}": each(stack["repeat"], j) for j in range(per)}}


def open_array(spec: dict[str, Any], what: str) -> Any:
  """A TensorStore array of a T5X or Pax checkpoint, open for reading; one UserError line
  naming `what` ("T5X", "Pax") and the array's path if it cannot be opened."""
  import tensorstore as ts

  from paxlike.errors import UserError

  try:
    return ts.open(spec, read=True).result()
  except (ValueError, RuntimeError) as e:
    raise UserError(f"cannot open the {what} array {spec['kvstore']['path']} ({e}); copy the "
                    "whole checkpoint folder.") from None


def lazy_tree(entries: Iterable[tuple[tuple[str, ...], int | None, Callable[[], np.ndarray],
                                      tuple[int, ...]]]) -> dict[str, Any]:
  """The params tree of LazyParams from (path, layer or None, reader, shape of one layer).

  Entries with a layer index share their path: they become one stacked
  parameter, its rows in layer order.
  """
  grouped: dict[tuple[str, ...], list[tuple[int | None, Callable[[], np.ndarray],
                                            tuple[int, ...]]]] = {}
  for path, layer, reader, shape in entries:
    grouped.setdefault(path, []).append((layer, reader, shape))
  tree: dict[str, Any] = {}
  for path, items in grouped.items():
    if items[0][0] is None:
      param = LazyParam(tuple(items[0][2]), [items[0][1]], stacked=False)
    else:
      items.sort(key=lambda item: item[0])
      param = LazyParam((len(items), *items[0][2]), [r for _, r, _ in items], stacked=True)
    set_path(tree, path, param)
  return tree


def materialize(tree: Any) -> Any:
  """A tree of LazyParams read whole: the model's tree of float32 numpy arrays."""
  if isinstance(tree, LazyParam):
    return tree.read()
  return {k: materialize(v) for k, v in tree.items()}
