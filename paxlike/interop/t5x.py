"""T5X checkpoints as initial weights: `INIT_FROM = "t5x:DIR"` (or `--init_from=t5x:DIR`).

DIR is a T5X `checkpoint_<step>` folder, the `checkpoint` file in one, or a
T5X model_dir, whose newest `checkpoint_<step>` is read (`t5x:DIR@STEP`
picks one). Both of T5X's formats are read:

  - T5X's own (its Checkpointer, versions 2 and 3; the released T5X
    checkpoints): `checkpoint` is msgpack (flax.serialization) of
    {"version": 3, "optimizer": {"target": <params>, "state": <optimizer
    state>}}; each parameter is either inline in it (an array) or a
    TensorStore spec (zarr, gzip) whose kvstore path is relative to the
    folder (`target.encoder.layers_0.attention.query.kernel`); a checkpoint
    written to GCS names a `gcs` kvstore with a placeholder bucket and is
    read here from its local copy, as T5X reads it.
  - Orbax's (T5X's train.py default, `use_orbax=True`): `checkpoint_<step>/
    state/` is an Orbax PyTree checkpoint of the same {"target", "state"}
    tree; each parameter is restored alone when it is placed.

T5X's T5 1.1 / Flan-T5 parameter names are paxlike's T5 names
(`encoder/layers_0/attention/query/kernel`, `decoder/logits_dense/kernel`,
...), so INIT_FROM_RULES written for T5X's assignment_map read the same.
Layouts differ in three places: T5X keeps attention kernels 2-D ([embed,
heads * d_kv] for query/key/value, [heads * d_kv, embed] for out) where
paxlike splits the heads, and its relative-position table is [heads,
buckets] where paxlike's is [buckets, heads]. The optimizer state is not
read (T5X's fine-tuning default, and its slots have no paxlike layout).

Like a Hugging Face import, every name and shape is checked from the
msgpack and the arrays' metadata before anything is placed, and each
tensor is read when its parameter is placed (paxlike.interop.hf_files).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Any

import numpy as np
from flax import traverse_util

from paxlike.errors import UserError
from paxlike.interop.hf_files import lazy_tree, open_array

FILE = "checkpoint"  # the legacy format's msgpack
STATE = "state"  # the Orbax format's item folder (T5X's _STATE_KEY)
STEP_DIR = re.compile(r"checkpoint_(\d+)$")
_TF_MAGIC = b"model_checkpoint_path"
_ORBAX_FILE = "_METADATA"

# paxlike's T5 conversions (paxlike.interop.hf kinds) -> T5X's layout of the same tensor.
_HEADS_IN, _HEADS_OUT = "heads_in", "heads_out"


def _checkpoint_in(folder: str) -> str | None:
  """The legacy `checkpoint` file or the Orbax `state` folder of a step folder, or None."""
  if os.path.isfile(os.path.join(folder, FILE)):
    return os.path.join(folder, FILE)
  if os.path.isfile(os.path.join(folder, STATE, _ORBAX_FILE)):
    return os.path.join(folder, STATE)
  if os.path.basename(folder) == STATE and os.path.isfile(os.path.join(folder, _ORBAX_FILE)):
    return folder
  return None


def find(path: str, step: int | None) -> str:
  """What a t5x: source names: the legacy `checkpoint` file, or an Orbax `state` folder.

  path is that file, a step folder (either format) or a model_dir (its newest
  step, or `step`).

  Raises:
    UserError: nothing there, no checkpoint_<step> folder, or no such step.
  """
  if os.path.isfile(path):
    if step is not None:
      raise UserError(f"t5x:{path}@{step} names a checkpoint file and a step; give the file, "
                      "or its model_dir with @STEP.")
    return path
  if not os.path.isdir(path):
    raise UserError(f"t5x:{path}: no such file or directory.")
  if step is None and (found := _checkpoint_in(path)) is not None:
    return found
  steps = sorted(int(m[1]) for n in os.listdir(path) if (m := STEP_DIR.match(n))
                 and _checkpoint_in(os.path.join(path, n)) is not None)
  if not steps:
    raise UserError(f"t5x:{path} is neither a T5X checkpoint folder (it has no `{FILE}` file "
                    f"and no Orbax `{STATE}` folder) nor a model_dir with checkpoint_<step> "
                    "folders.")
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise UserError(f"t5x:{path} has no checkpoint for step {step}; available: {steps}.")
  return _checkpoint_in(os.path.join(path, f"checkpoint_{step}"))


def read_target(location: str) -> dict[str, Any]:
  """{"encoder/layers_0/...": leaf} of a checkpoint's parameters, nothing read yet but the
  legacy msgpack: a leaf is an array (inline), an absolute TensorStore spec, or an
  _OrbaxLeaf.

  Raises:
    UserError: not a T5X checkpoint (a TensorFlow one, say), or no `target` in it.
  """
  if os.path.isdir(location):
    return _orbax_target(location)
  from flax import serialization

  with open(location, "rb") as f:
    raw = f.read()
  if raw.startswith(_TF_MAGIC):
    raise UserError(f"{location} is a TensorFlow checkpoint index (T5X's T5X_TF type), not a "
                    "T5X checkpoint; convert it with T5X first.")
  try:
    contents = serialization.msgpack_restore(raw)
  except Exception as e:  # msgpack raises several types for bytes that are not its own
    raise UserError(f"{location} is not a T5X checkpoint: not msgpack ({type(e).__name__}).") \
        from None
  if not isinstance(contents, dict):
    raise UserError(f"{location} is not a T5X checkpoint: its msgpack holds no dict.")
  state = contents.get("optimizer", contents)
  target = state.get("target") if isinstance(state, dict) else None
  if not isinstance(target, dict):
    raise UserError(f"{location} holds no `target` parameters; keys: {sorted(contents)[:5]}.")
  folder = os.path.dirname(location)
  flat = traverse_util.flatten_dict(target, is_leaf=lambda _, value: _is_spec(value))
  return {"/".join(path): _local_spec(leaf, folder) if _is_spec(leaf) else np.asarray(leaf)
          for path, leaf in flat.items() if leaf is not None}


@dataclasses.dataclass(frozen=True)
class _OrbaxLeaf:
  """One parameter of an Orbax-format checkpoint, restored alone when read."""

  state_dir: str
  keys: tuple[str, ...]  # its path in the stored tree ("target", ...)
  shape: tuple[int, ...]
  dtype: Any

  def read(self) -> np.ndarray:
    import orbax.checkpoint as ocp

    item: Any = np.empty(self.shape, self.dtype)
    args: Any = ocp.RestoreArgs(restore_type=np.ndarray)
    for key in reversed(self.keys):
      item, args = {key: item}, {key: args}
    restored = ocp.PyTreeCheckpointer().restore(
        self.state_dir, args=ocp.args.PyTreeRestore(item=item, restore_args=args,
                                                    partial_restore=True))
    for key in self.keys:
      restored = restored[key]
    return np.asarray(restored)


def _orbax_target(state_dir: str) -> dict[str, Any]:
  """The `target` leaves of T5X's Orbax format (`checkpoint_<step>/state`), from metadata."""
  import orbax.checkpoint as ocp
  from etils import epath

  try:
    tree = ocp.StandardCheckpointHandler().metadata(epath.Path(state_dir)).tree
  except Exception as e:  # noqa: BLE001 - orbax raises many kinds for a damaged folder
    raise UserError(f"cannot read the Orbax checkpoint metadata in {state_dir} ({e}).") from None
  target = tree.get("target") if isinstance(tree, dict) else None
  if not isinstance(target, dict):
    keys = sorted(tree)[:5] if isinstance(tree, dict) else type(tree).__name__
    hint = "; a paxlike job's checkpoint is read with paxlike:DIR" if "params" in keys else ""
    raise UserError(f"the Orbax checkpoint in {state_dir} holds no `target` parameters (keys: "
                    f"{keys}){hint}.")
  return {"/".join(path): _OrbaxLeaf(state_dir, ("target", *path), tuple(m.shape), m.dtype)
          for path, m in traverse_util.flatten_dict(target).items() if m is not None}


def _is_spec(x: Any) -> bool:
  return isinstance(x, dict) and "driver" in x and "kvstore" in x


def _local_spec(spec: dict[str, Any], folder: str) -> dict[str, Any]:
  """A spec whose array lies in `folder`: T5X's relative path (file, gfile or GCS) made
  absolute, as T5X's restore does."""
  spec = dict(spec)
  kvstore = dict(spec.get("kvstore") or {})
  relative = kvstore.get("path") or spec.pop("path", None)
  spec.pop("path", None)
  if kvstore.get("driver") not in ("file", "gfile", "gcs") or not relative:
    raise UserError(f"a TensorStore spec in {folder} has kvstore {kvstore}; paxlike reads "
                    "T5X's file, gfile and GCS array paths.")
  spec["kvstore"] = {"driver": "file", "path": os.path.join(folder, relative)}
  # As T5X's restore: the array's own .zarray fixes chunks and compression.
  spec["metadata"] = {k: v for k, v in (spec.get("metadata") or {}).items()
                      if k not in ("chunks", "compressor")}
  return spec


def _shape(leaf: Any) -> tuple[int, ...]:
  if not isinstance(leaf, dict):
    return tuple(leaf.shape)  # an inline array or an _OrbaxLeaf
  shape = (leaf.get("metadata") or {}).get("shape")
  if shape is None:
    shape = _open(leaf).shape
  if isinstance(shape, dict):  # a list that flax's state-dict conversion keyed by index
    shape = [shape[k] for k in sorted(shape, key=int)]
  return tuple(int(s) for s in shape)


def _open(spec: dict[str, Any]) -> Any:
  return open_array(spec, "T5X")


def _read(leaf: Any, kind: str, shape: tuple[int, ...]) -> np.ndarray:
  """One tensor as float32 in paxlike's layout."""
  if isinstance(leaf, _OrbaxLeaf):
    x = leaf.read()
  elif isinstance(leaf, dict):
    x = _open(leaf).read().result()
  else:
    x = np.asarray(leaf)
  x = np.asarray(x).astype(np.float32, copy=False)
  if kind == "rel":
    x = x.T
  return np.ascontiguousarray(x.reshape(shape))


def _t5x_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  """The T5X shape of a paxlike parameter of `shape`."""
  if kind == _HEADS_IN:
    return (shape[0], shape[1] * shape[2])
  if kind == _HEADS_OUT:
    return (shape[0] * shape[1], shape[2])
  if kind == "rel":
    return shape[::-1]
  return shape


def lazy_params(path: str, step: int | None, model: Any) -> dict[str, Any]:
  """The model's params tree of LazyParams, checked now against the T5X checkpoint.

  Raises:
    UserError: not a T5 model, not a T5X checkpoint, a missing tensor, a shape
      that differs, or tensors the model has no place for.
  """
  from paxlike.interop import hf

  try:
    model_type = model.hf_config().get("model_type")  # T5X's T5 is Hugging Face's "t5"
  except UserError:  # a family with no checkpoint layout (Pax's LM)
    model_type = None
  if model_type != "t5":
    raise UserError(f"t5x:{path}: T5X checkpoints are read into T5 experiments (FlanT5*, "
                    f"T5*); this experiment's model is a {type(model).__name__}.")
  location = find(path, step)
  source = read_target(location)
  where = location if os.path.isdir(location) else os.path.dirname(location)
  entries, used = [], set()
  for _, ours, layer, kind in hf.t5_name_map(model):
    name = "/".join(f"layers_{layer}" if p == "layers" and model.use_repeated_layer else p
                    for p in ours)
    if ours[-1] == "rel_embedding":
      kind = "rel"
    shape = hf.t5_param_shape(model, ours)
    if name not in source:
      hint = (" (T5X's logits_via_embedding=True model: set TIE_EMBEDDINGS=True)"
              if name == "decoder/logits_dense/kernel" else "")
      raise UserError(f"the T5X checkpoint in {where} has no parameter {name}{hint}; it is not "
                      "a checkpoint of this experiment's shape.")
    want, got = _t5x_shape(kind, shape), _shape(source[name])
    if got != want:
      raise UserError(f"the T5X checkpoint in {where} has {name} of shape {list(got)} but this "
                      f"model needs {list(want)}; use a checkpoint of the experiment's shape.")
    used.add(name)
    reader = functools.partial(_read, source[name], kind, shape)
    entries.append((ours, layer if model.use_repeated_layer else None, reader, shape))
  unknown = sorted(set(source) - used)
  if unknown:
    hint = (" (a head of its own: set TIE_EMBEDDINGS=False)"
            if "decoder/logits_dense/kernel" in unknown else "")
    raise UserError(f"the T5X checkpoint in {where} has parameters this model has no place for "
                    f"({', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}){hint}; "
                    "use a checkpoint of the experiment's shape.")
  return lazy_tree(entries)
