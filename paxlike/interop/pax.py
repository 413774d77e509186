"""Pax checkpoints as initial weights: `INIT_FROM = "pax:DIR"`, or Pax's CHECKPOINT_RESTORE_PATH.

DIR is what Pax writes and reads back: a job's `checkpoints/` folder (its
newest `checkpoint_<step>`, or `pax:DIR@STEP`), the job_log_dir above it, a
`checkpoint_<step>` folder, or that folder's `state/`. Pax's checkpointer (and
saxml's `convert_llama_ckpt.py`, which Pax's GPU LLaMA README uses) stores
each variable of the train state as its own TensorStore zarr array named by
its path joined with dots: `mdl_vars.params.lm.transformer.x_layers_0.
self_attention.query.w`. Both of its formats are read: one folder per array,
or (`--tensorstore_use_ocdbt`) one OCDBT key-value store holding them all.
Only `mdl_vars.params.*` is read; Pax's optimizer slots have no paxlike
layout, and a run from a Pax checkpoint starts a fresh optimizer, as Pax's
own `init_from_checkpoint_rules` do.

The variables are those of Pax's LLaMA (paxml's GPU `BaseLLaMA`, praxis's
TransformerLm with RMSNorm, gated SiLU feed-forward and rotary positions;
saxml's converter writes the same names), read into paxlike's Llama family:

  lm.embedding_lookup.emb_var [V, D]          -> embed_tokens
  lm.softmax.logits_ffn.linear.w [D, V]       -> lm_head/w (the table, tied)
  lm.final_ln.scale                           -> norm/scale
  lm.transformer.x_layers_<i>. ...            (or .repeat.sub.x_layers_0. ..., stacked [L, ...])
    layer_norm.scale                          -> input_layernorm/scale
    self_attention.query.w [D, N, H]          -> self_attn/q_proj/w
    self_attention.key.w / value.w [D, K, H]  -> self_attn/k_proj/w, v_proj/w
    self_attention.combined_qkv.w [3, D, N, H] (q, k, v)
    self_attention.post.w [D, N, H]           -> self_attn/o_proj/w [N, H, D]
    ff_layer.layer_norm.scale                 -> post_attention_layernorm/scale
    ff_layer.ffn_layer1_gate.linear.w [D, F]  -> mlp/gate_proj/w
    ff_layer.ffn_layer1.linear.w [D, F]       -> mlp/up_proj/w
    ff_layer.ffn_layer2.linear.w [F, D]       -> mlp/down_proj/w

Pax's LLaMA rotates query and key dims in adjacent pairs (saxml's
LLaMARotaryEmbedding, Meta's layout); paxlike's Llama, as Hugging Face's,
rotates dim i with dim i + H/2. Each head's query and key columns are
reordered (even dims first, then odd) as they are read, which gives the
same attention. Every name and shape is checked from the arrays' metadata
before anything is read; each array is read when its parameter is placed
(a stacked one a layer at a time).
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

import numpy as np

from paxlike.errors import UserError
from paxlike.interop.hf_files import lazy_tree

PARAMS = "mdl_vars.params."  # Pax's prefix of the model's variables
STATE = "state"  # Pax's item folder in a checkpoint_<step> (checkpoint_paths.STATE_ITEM_NAME)
STEP_DIR = re.compile(r"checkpoint_(\d+)$")
_ARRAY_FILES = (".zarray", "zarr.json")  # zarr (v2), zarr3
_OCDBT = "manifest.ocdbt"

# kinds: how a Pax array becomes a paxlike one (_convert).
COPY, ROPE, POST = "copy", "rope", "post"


def _holds_arrays(folder: str) -> bool:
  if os.path.isfile(os.path.join(folder, _OCDBT)):
    return True
  try:
    names = os.listdir(folder)
  except OSError:
    return False
  return any(n.startswith(PARAMS) and _array_file(os.path.join(folder, n)) for n in names)


def _array_file(folder: str) -> str | None:
  for name in _ARRAY_FILES:
    if os.path.isfile(os.path.join(folder, name)):
      return name
  return None


def find(path: str, step: int | None) -> str:
  """The folder holding a Pax checkpoint's arrays (a checkpoint's `state/`, or the step
  folder itself in Pax's oldest layout) that `pax:path[@step]` names.

  Raises:
    UserError: nothing there, no checkpoint_<step> folder, or no such step.
  """
  if not os.path.isdir(path):
    raise UserError(f"pax:{path}: no such folder; give a Pax job's checkpoints/ folder or one "
                    "of its checkpoint_<step> folders.")
  step_match = STEP_DIR.search(os.path.basename(os.path.normpath(path)))
  if step_match is None and os.path.basename(os.path.normpath(path)) != STATE:
    parent = path
    if os.path.isdir(os.path.join(path, "checkpoints")):
      parent = os.path.join(path, "checkpoints")
    steps = {int(m.group(1)): os.path.join(parent, n) for n in os.listdir(parent)
             if (m := STEP_DIR.fullmatch(n)) and os.path.isdir(os.path.join(parent, n))}
    if steps:
      if step is None:
        path = steps[max(steps)]
      elif step in steps:
        path = steps[step]
      else:
        raise UserError(f"pax:{parent}@{step}: no checkpoint_{step:08d}; steps there: "
                        f"{sorted(steps)}.")
    elif step is not None:
      raise UserError(f"pax:{path}@{step}: {path} holds no checkpoint_<step> folders.")
  elif step is not None:
    raise UserError(f"pax:{path}@{step} names a checkpoint folder and a step; give the folder, "
                    "or its checkpoints/ folder with @STEP.")
  for folder in (os.path.join(path, STATE), path):
    if _holds_arrays(folder):
      return folder
  raise UserError(f"pax:{path}: no Pax checkpoint arrays ({PARAMS}* TensorStore arrays, in "
                  f"{STATE}/ or beside it) there; is it a Pax checkpoint_<step> folder?")


def read_params(state_dir: str) -> dict[str, dict[str, Any]]:
  """{"lm.embedding_lookup.emb_var": TensorStore spec} of a checkpoint's model variables,
  nothing read yet."""
  if os.path.isfile(os.path.join(state_dir, _OCDBT)):
    import tensorstore as ts

    base = "file://" + os.path.abspath(state_dir) + "/"
    try:
      keys = ts.KvStore.open({"driver": "ocdbt", "base": base}).result().list().result()
    except (ValueError, RuntimeError) as e:
      raise UserError(f"cannot read the OCDBT store in {state_dir} ({e}).") from None
    out = {}
    for key in (k.decode() for k in keys):
      name, _, leaf = key.rpartition("/")
      if leaf in _ARRAY_FILES and name.startswith(PARAMS):
        out[name[len(PARAMS):]] = {
            "driver": "zarr" if leaf == ".zarray" else "zarr3",
            "kvstore": {"driver": "ocdbt", "base": base, "path": name + "/"}}
    return out
  out = {}
  for name in sorted(os.listdir(state_dir)):
    folder = os.path.join(state_dir, name)
    leaf = _array_file(folder) if name.startswith(PARAMS) else None
    if leaf:
      out[name[len(PARAMS):]] = {"driver": "zarr" if leaf == ".zarray" else "zarr3",
                                 "kvstore": {"driver": "file", "path": folder}}
  return out


def _open(spec: dict[str, Any]) -> Any:
  import tensorstore as ts

  try:
    return ts.open(spec, read=True).result()
  except (ValueError, RuntimeError) as e:
    raise UserError(f"cannot open the Pax array {spec['kvstore']['path']} ({e}); copy the "
                    "whole checkpoint folder.") from None


def _shape(spec: dict[str, Any]) -> tuple[int, ...]:
  return tuple(int(s) for s in _open(spec).shape)


def rope_order(head_dim: int) -> np.ndarray:
  """A head's dims reordered from rotation in adjacent pairs to rotation of i with i + H/2."""
  return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def _convert(kind: str, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  if kind == ROPE:  # [D, N, H]: each head's dims, pairs -> halves
    x = x[..., rope_order(x.shape[-1])]
  elif kind == POST:  # [D, N, H] -> [N, H, D]
    x = np.transpose(x, (1, 2, 0))
  elif kind == "table_t":  # a tied model's table from the softmax's [D, V]
    x = x.T
  return np.ascontiguousarray(x.reshape(shape))


def _read(spec: dict[str, Any], index: tuple[int, ...], kind: str, shape: tuple[int, ...]
          ) -> np.ndarray:
  """One parameter (of one layer) as float32 in paxlike's layout: the array at `index`."""
  store = _open(spec)
  x = np.asarray((store[index] if index else store).read().result(), np.float32)
  return _convert(kind, x, shape)


def llama_name_map(model: Any, repeated: bool, combined: bool
                   ) -> list[tuple[str, tuple[int, ...], tuple[str, ...], int | None, str,
                                   tuple[int, ...]]]:
  """Every Pax LLaMA variable: (Pax name, index into it, paxlike path, layer or None, kind,
  paxlike shape of one layer). repeated: Pax's stacked layers (repeat.sub); combined: one
  combined_qkv array, whose entries are the same Pax name at 0, 1, 2."""
  d, f, n, kv, h, v = (model.model_dims, model.hidden_dims, model.num_heads, model.num_kv_heads,
                       model.head_dim, model.vocab_size)
  out = []
  if model.tie_embeddings:
    out.append(("lm.softmax.logits_ffn.linear.w", (), ("embed_tokens",), None, "table_t",
                (v, d)))
  else:
    out += [("lm.embedding_lookup.emb_var", (), ("embed_tokens",), None, COPY, (v, d)),
            ("lm.softmax.logits_ffn.linear.w", (), ("lm_head", "w"), None, COPY, (d, v))]
  out.append(("lm.final_ln.scale", (), ("norm", "scale"), None, COPY, (d,)))
  per_layer: list[tuple[str, tuple[int, ...], str, str, tuple[int, ...]]] = [
      ("layer_norm.scale", (), "input_layernorm/scale", COPY, (d,))]
  if combined:
    per_layer += [("self_attention.combined_qkv.w", (j,), f"self_attn/{p}_proj/w",
                   ROPE if p != "v" else COPY, (d, n, h)) for j, p in enumerate("qkv")]
  else:
    per_layer += [("self_attention.query.w", (), "self_attn/q_proj/w", ROPE, (d, n, h)),
                  ("self_attention.key.w", (), "self_attn/k_proj/w", ROPE, (d, kv, h)),
                  ("self_attention.value.w", (), "self_attn/v_proj/w", COPY, (d, kv, h))]
  per_layer += [
      ("self_attention.post.w", (), "self_attn/o_proj/w", POST, (n, h, d)),
      ("ff_layer.layer_norm.scale", (), "post_attention_layernorm/scale", COPY, (d,)),
      ("ff_layer.ffn_layer1_gate.linear.w", (), "mlp/gate_proj/w", COPY, (d, f)),
      ("ff_layer.ffn_layer1.linear.w", (), "mlp/up_proj/w", COPY, (d, f)),
      ("ff_layer.ffn_layer2.linear.w", (), "mlp/down_proj/w", COPY, (f, d)),
  ]
  for i in range(model.num_layers):
    layer = "layers" if model.use_repeated_layer else f"layers_{i}"
    for pax, index, path, kind, shape in per_layer:
      name = (f"lm.transformer.repeat.sub.x_layers_0.{pax}" if repeated
              else f"lm.transformer.x_layers_{i}.{pax}")
      out.append((name, ((i,) if repeated else ()) + index, (layer, *path.split("/")), i,
                  kind, shape))
  return out


def _pax_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  """The Pax shape of (one layer of) a paxlike parameter of `shape`."""
  if kind == POST:
    return (shape[2], shape[0], shape[1])
  if kind == "table_t":
    return shape[::-1]
  return shape


def lazy_params(path: str, step: int | None, model: Any) -> dict[str, Any]:
  """The model's params tree of LazyParams, checked now against the Pax checkpoint.

  Raises:
    UserError: not a Llama-family model, not a Pax checkpoint, a missing
      variable, a shape that differs, or variables the model has no place for.
  """
  from paxlike.models.llama import LlamaModel

  if not isinstance(model, LlamaModel):
    raise UserError(f"pax:{path}: Pax checkpoints are read into Llama-family experiments (Pax's "
                    f"LLaMA, e.g. BaseLLaMA); this experiment's model is a "
                    f"{type(model).__name__}.")
  if model.qkv_bias:
    raise UserError(f"pax:{path}: Pax's LLaMA has no query/key/value biases; this experiment "
                    "has QKV_BIAS set.")
  where = find(path, step)
  source = read_params(where)
  if not source:
    raise UserError(f"the Pax checkpoint in {where} holds no {PARAMS}* arrays.")
  repeated = any(n.startswith("lm.transformer.repeat.") for n in source)
  combined = any(n.endswith("self_attention.combined_qkv.w") for n in source)
  if combined and model.num_kv_heads != model.num_heads:
    raise UserError(f"the Pax checkpoint in {where} has combined q/k/v projections (one key and "
                    f"value head per query head) but this experiment has NUM_KV_HEADS="
                    f"{model.num_kv_heads} for {model.num_heads} heads.")
  entries, used, checked = [], set(), set()
  for name, index, ours, layer, kind, shape in llama_name_map(model, repeated, combined):
    if name not in source:
      raise UserError(f"the Pax checkpoint in {where} has no variable {PARAMS}{name}; it is not "
                      "a checkpoint of this experiment's LLaMA (layers, heads, tied table).")
    if name not in checked:
      want = _pax_shape(kind, shape)
      if repeated and layer is not None:
        want = (model.num_layers, *want)
      if name.endswith("combined_qkv.w"):
        want = (want[0], 3, *want[1:]) if repeated else (3, *want)
      got = _shape(source[name])
      if got != want:
        raise UserError(f"the Pax checkpoint in {where} has {name} of shape {list(got)} but this "
                        f"model needs {list(want)}; use a checkpoint of the experiment's shape.")
      checked.add(name)
    used.add(name)
    reader = functools.partial(_read, source[name], index, kind, shape)
    entries.append((ours, layer if model.use_repeated_layer else None, reader, shape))
  unknown = sorted(set(source) - used)
  if unknown:
    raise UserError(f"the Pax checkpoint in {where} has variables this model has no place for "
                    f"({', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}); use a "
                    "checkpoint of the experiment's shape.")
  return lazy_tree(entries)
