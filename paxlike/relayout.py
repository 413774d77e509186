"""A checkpoint read into another layer layout (NUM_STAGES, CIRCULAR_REPEAT, USE_REPEATED_LAYER).

A model with layer layouts (`model.layout()`, a paxlike.layers.pipeline.Layout)
keeps its layers in one stack subtree, `transformer` (the LM; a model that keeps
them elsewhere, the Llama family, says how through its stack_form()), stored scanned
(`repeat` [N, ...]), unrolled (`x_layers_i`) or pipelined (`pipeline`
[R, S, ...]). A checkpoint's layout is read off its own tree
(pipeline.layout_of on the stored metadata); when it differs from this run's
and holds as many layers, the state is read as stored (host arrays), every
stack is restacked (the parameters, and each optimizer slot whose tree mirrors
the parameters', e.g. Adam's mu and nu), and the result is placed with this
run's shardings. Any other difference stays a one-line refusal.

An optimizer slot restacks exactly when it is per layer: a floating-point
array whose leading layer dims are its parameter's, in the stored layout and,
restacked, in this run's. Adam's moments always are. Adafactor's factored
second moment of a layer's 1-D parameter averages over the stacked layer dim,
its quantized momentum (int8, with one scale per column over the first dim)
is neither; such slots start from zeros, as a fresh optimizer state does, and
one warning says how many.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from paxlike import checkpoints as ckpt_lib
from paxlike import log as logging
from paxlike.layers import pipeline

STACK = "transformer"  # the key of a layer stack subtree (language_model.restack_tree's)


def _stacks(tree: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], dict[str, Any]]:
  """{path: subtree} of every layer stack reachable through dicts."""
  out = {}
  if isinstance(tree, dict):
    for key, value in tree.items():
      if key == STACK and isinstance(value, dict):
        out[(*prefix, key)] = value
      else:
        out.update(_stacks(value, (*prefix, key)))
  return out


def stored_layout(stack: dict[str, Any]) -> pipeline.Layout | None:
  """The layout of a stored stack subtree, its layer count read off its shapes; None when
  the subtree is no layer stack."""
  try:
    return pipeline.layout_of(stack)
  except (ValueError, IndexError):
    return None


def _get(tree: Any, path: tuple[str, ...]) -> Any:
  for key in path:
    if not isinstance(tree, dict) or key not in tree:
      return None
    tree = tree[key]
  return tree


def _names(tree: Any, prefix: tuple[str, ...]) -> tuple[list[tuple[str, Any]], Any]:
  """[(name, leaf)] with None leaves kept, and the treedef to rebuild the tree."""
  flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)
  named = [("/".join((*prefix, *(ckpt_lib.path_name((k,)) for k in path))), leaf)
           for path, leaf in flat]
  return named, treedef


@dataclasses.dataclass(frozen=True)
class Restack:
  """A stored state's layer stacks, from `source` to `target` (the stacks at `paths` of
  the parameters; the optimizer slots mirroring them follow)."""

  source: pipeline.Layout
  target: pipeline.Layout
  paths: tuple[tuple[str, ...], ...]
  # How the model's stored trees hold the stack (model.stack_form(); the LM's: as is).
  form: pipeline.StackForm = dataclasses.field(default_factory=pipeline.StackForm)

  def describe(self) -> str:
    return f"from {self.source.describe()} to {self.target.describe()}"

  def apply(self, stored: Any, abstract: Any) -> tuple[Any, list[str]]:
    """stored (the state as the checkpoint holds it: dicts and lists of numpy or traced
    arrays) with its stacks in the target layout.

    Args:
      stored: the stored state tree.
      abstract: this run's abstract state (the slots that start from zeros take its shapes).

    Returns:
      (the restacked tree, the names of the slot arrays that start from zeros).
    """
    want = {self.form.name(k): v for k, v in ckpt_lib.flat(abstract).items()}
    stored = self.form.to(stored)
    params = stored["params"]
    param_stacks = {p: _get(params, p) for p in self.paths}
    fresh: list[str] = []

    def visit(node: Any, prefix: tuple[str, ...]) -> Any:
      if isinstance(node, list | tuple):
        return type(node)(visit(v, (*prefix, str(i))) for i, v in enumerate(node))
      if not isinstance(node, dict):
        return node
      out, done = dict(node), set()
      for path, pstack in param_stacks.items():
        sub = _get(node, path)
        if sub is None or jax.tree.structure(sub) != jax.tree.structure(pstack):
          continue  # no stack here, or one that does not mirror the parameters'
        new = self._slot(sub, pstack, (*prefix, *path), want, fresh, exact=node is params)
        parent = out
        for key in path[:-1]:
          parent[key] = dict(parent[key])
          parent = parent[key]
        parent[path[-1]] = new
        done.add(path)
      return {k: v if (k,) in done else visit(v, (*prefix, k)) for k, v in out.items()}

    return self.form.back(visit(stored, ())), fresh

  def _slot(self, slot: Any, pstack: Any, prefix: tuple[str, ...], want: dict[str, Any],
            fresh: list[str], exact: bool) -> Any:
    """One stack subtree (the parameters' or a slot's) in the target layout."""
    lead = self.source.lead_dims

    def per_layer(s: Any, p: Any) -> bool:
      return exact or (len(s.shape) >= lead and tuple(s.shape[:lead]) == tuple(p.shape[:lead])
                       and jnp.issubdtype(s.dtype, jnp.floating))

    masked = jax.tree.map(lambda s, p: s if per_layer(s, p) else None, slot, pstack)
    out = pipeline.from_layers(pipeline.to_layers(masked, self.source), self.target)
    named, treedef = _names(out, prefix)
    leaves = []
    for name, leaf in named:
      w = want.get(name)
      fits = leaf is not None and (w is None or (
          tuple(leaf.shape) == tuple(w.shape) and np.dtype(leaf.dtype) == np.dtype(w.dtype)))
      if exact or fits:
        leaves.append(leaf)
      elif w is not None:
        leaves.append(np.zeros(w.shape, w.dtype))
        if int(np.prod(w.shape)) > 1:  # a size-1 slot is a placeholder (Adafactor's)
          fresh.append(name)
      else:
        leaves.append(None)
    return jax.tree.unflatten(treedef, leaves)

  def abstract_of(self, stored: Any, abstract: Any) -> Any:
    """The stored metadata (ShapeDtypeStructs) as apply() would leave it; nothing is read."""
    return jax.eval_shape(lambda tree: self.apply(tree, abstract)[0], stored)

  def read(self, checkpointer: ckpt_lib.Checkpointer, step: int,
           abstract: Any) -> tuple[Any, dict[str, Any]]:
    """One step read as stored, restacked, in abstract's structure (host arrays), and its
    input position; the caller places it with its shardings."""
    stored, input_state = checkpointer.restore_host(step)
    tree, fresh = self.apply(stored, abstract)
    flat = ckpt_lib.flat(tree)
    state = jax.tree.unflatten(jax.tree.structure(abstract),
                               [flat[name] for name in ckpt_lib.flat(abstract)])
    self.log(f"checkpoint step {step} in {checkpointer.directory}", fresh)
    return state, input_state

  def log(self, what: str, fresh: list[str]) -> None:
    logging.info("restacked the layers of %s %s", what, self.describe())
    if fresh:
      logging.warning("%d optimizer slot arrays of the layer stack have no per-layer form "
                      "(factored or quantized statistics, e.g. %s) and start from zeros",
                      len(fresh), fresh[0])


def change(stored: Any, model: Any) -> Restack | str | None:
  """How a stored state's layer stacks differ from model's layout.

  Returns:
    None: nothing to restack (the same layout, a model without layouts, or a
    checkpoint without a layer stack); a Restack; or, when the stacks cannot hold
    the same layers, the problem in words.
  """
  target = model.layout()
  if target is None or not isinstance(stored, dict):
    return None
  form = model.stack_form()
  params = form.to(stored).get("params")
  if not isinstance(params, dict):
    return None
  stacks = _stacks(params)
  layouts = {stored_layout(s) for s in stacks.values()}
  if len(layouts) != 1 or None in layouts:
    return None
  source = layouts.pop()
  if source == target:
    return None
  if source.num_layers != target.num_layers:
    return (f"its layer stack holds {source.num_layers} layers ({source.describe()}) but "
            f"this run's holds {target.num_layers}")
  return Restack(source, target, tuple(stacks), form)


def compare(stored: Any, abstract: Any, model: Any) -> tuple[Restack | None, str | None]:
  """(the Restack a read needs or None, the first difference left after it or None)."""
  plan = change(stored, model)
  if isinstance(plan, str):
    return None, plan
  if plan is not None:
    stored = plan.abstract_of(stored, abstract)
  return plan, ckpt_lib.first_mismatch(abstract, stored)
