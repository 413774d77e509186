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

Two families are read. Pax's LM (praxis's TransformerLm, the LM templates'
LanguageModel), by the names paxlike's parameters mirror:

  lm.softmax.logits_ffn.linear.w [D, V] / .bias.b -> softmax/embedding [V, D] / softmax/bias
  lm.embedding_lookup.emb_var, lm.position_emb.emb_var -> embedding/..., position_emb/...
  lm.final_ln.scale / .bias                  -> final_norm/scale / bias
  lm.transformer.x_layers_<i>. ...           (or .repeat.sub.x_layers_0. ..., stacked [L, ...])
    layer_norm, ff_layer.layer_norm          -> pre_attn_norm, pre_ffn_norm
    self_attention.query/key/value.w, .b     -> attention/query/... (same [D, N, H])
    self_attention.combined_qkv.w [3, D, N, H] -> attention/qkv/w [D, 3, N, H]
    self_attention.per_dim_scale.per_dim_scale -> attention/per_dim_scale
    self_attention.post.w [D, N, H] / .b     -> attention/post [N, H, D] / post_bias
    ff_layer.ffn_layer1(_gate)/ffn_layer2 .linear.w, .bias.b -> ffn/ffn1(_gate)/ffn2 w, b

praxis's LayerNorm keeps `scale - 1` (direct_scale=False), so 1 is added;
its RmsNorm keeps the scale itself. Pre-norm dense stacks are read;
experts, relative position biases and other norm policies are refused in
one line. Either family is read into any of paxlike's layouts (unrolled,
scanned, pipelined); Pax's own pipelined stacks (lm.transformer.pipeline.*)
are refused by name.

And Pax's LLaMA (paxml's GPU `BaseLLaMA`; saxml's converter writes the same
names), into paxlike's Llama family:

  lm.embedding_lookup.emb_var [V, D]          -> embed_tokens
  lm.softmax.logits_ffn.linear.w [D, V]       -> lm_head/w
  lm.final_ln.scale                           -> norm/scale
  lm.transformer.x_layers_<i>. ... (or repeat.sub.x_layers_0. ...)
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
same attention.

Every name and shape is checked from the arrays' metadata before anything
is read, and a variable the model has no place for is an error; each array
is read when its parameter is placed (a stacked one a layer at a time).
Parameters Pax's model lacks (LoRA adapters, FP8 scales) are left to
INIT_FROM_RULES.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Any

import numpy as np

from paxlike.errors import UserError
from paxlike.interop.hf_files import flat_names, lazy_tree, open_array

PARAMS = "mdl_vars.params."  # Pax's prefix of the model's variables
STATE = "state"  # Pax's item folder in a checkpoint_<step> (checkpoint_paths.STATE_ITEM_NAME)
STEP_DIR = re.compile(r"checkpoint_(\d+)$")
_ARRAY_FILES = (".zarray", "zarr.json")  # zarr (v2), zarr3
_OCDBT = "manifest.ocdbt"

# kinds: how a Pax array becomes a paxlike one (_convert).
COPY, ROPE, POST, TABLE_T, QKV, SCALE_PLUS_1 = "copy", "rope", "post", "table_t", "qkv", "+1"


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


def _arrays(state_dir: str) -> dict[str, dict[str, Any]]:
  """{dotted name: TensorStore spec} of every array of a checkpoint's item folder."""
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
      if leaf in _ARRAY_FILES:
        out[name] = {"driver": "zarr" if leaf == ".zarray" else "zarr3",
                     "kvstore": {"driver": "ocdbt", "base": base, "path": name + "/"}}
    return out
  out = {}
  for name in sorted(os.listdir(state_dir)):
    folder = os.path.join(state_dir, name)
    leaf = _array_file(folder)
    if leaf:
      out[name] = {"driver": "zarr" if leaf == ".zarray" else "zarr3",
                   "kvstore": {"driver": "file", "path": folder}}
  return out


def read_params(state_dir: str) -> dict[str, dict[str, Any]]:
  """{"lm.embedding_lookup.emb_var": TensorStore spec} of a checkpoint's model variables
  (Pax's mdl_vars.params.*), nothing read yet.

  Raises:
    UserError: no such variables (a paxlike checkpoint is named as one).
  """
  arrays = _arrays(state_dir)
  out = {n[len(PARAMS):]: spec for n, spec in arrays.items() if n.startswith(PARAMS)}
  if not out:
    hint = ("; it is a paxlike checkpoint: read it with paxlike:DIR"
            if any(n.startswith("params.") for n in arrays) else "")
    raise UserError(f"the checkpoint in {state_dir} holds no Pax model variables "
                    f"({PARAMS}* arrays){hint}.")
  return out


def _open(spec: dict[str, Any]) -> Any:
  return open_array(spec, "Pax")


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
  elif kind == TABLE_T:  # the softmax's [D, V] -> the table [V, D]
    x = x.T
  elif kind == QKV:  # [3, D, N, H] -> [D, 3, N, H]
    x = np.transpose(x, (1, 0, 2, 3))
  elif kind == SCALE_PLUS_1:  # praxis's LayerNorm keeps scale - 1 (direct_scale=False)
    x = x + 1.0
  return np.ascontiguousarray(x.reshape(shape))


def _pax_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  """The Pax shape of (one layer of) a paxlike parameter of `shape`."""
  if kind == POST:
    return (shape[2], shape[0], shape[1])
  if kind == TABLE_T:
    return shape[::-1]
  if kind == QKV:
    return (shape[1], shape[0], *shape[2:])
  return shape


def _read(spec: dict[str, Any], index: tuple[int, ...], kind: str, shape: tuple[int, ...]
          ) -> np.ndarray:
  """One parameter (of one layer) as float32 in paxlike's layout: the array at `index`."""
  store = _open(spec)
  x = np.asarray((store[index] if index else store).read().result(), np.float32)
  return _convert(kind, x, shape)


@dataclasses.dataclass(frozen=True)
class Entry:
  """Where one paxlike parameter (of one layer) comes from in a Pax checkpoint."""

  pax: str  # the variable's name, after mdl_vars.params.
  index: tuple[int, ...]  # into the variable: its layer in a repeated stack, its q/k/v
  ours: tuple[str, ...]  # the paxlike parameter's path
  layer: int | None  # its layer, when paxlike stacks the layers (a scanned model)
  kind: str  # how the array becomes paxlike's (_convert)
  shape: tuple[int, ...]  # paxlike's shape of it (one layer's when stacked)
  pax_shape: tuple[int, ...]  # the whole Pax variable's shape


def _layer_name(i: int, sub: str, repeated: bool, num_layers: int, one: tuple[int, ...]
                ) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
  """(Pax name, index, whole shape) of layer i's variable `sub` (shape `one` per layer)."""
  if repeated:  # praxis's StackedTransformerRepeated: one stacked layer, [L, ...]
    return f"lm.transformer.repeat.sub.x_layers_0.{sub}", (i,), (num_layers, *one)
  return f"lm.transformer.x_layers_{i}.{sub}", (), one


def llama_entries(model: Any, repeated: bool, combined: bool) -> list[Entry]:
  """Every Pax LLaMA variable (saxml's names) as paxlike's Llama parameters. repeated: Pax's
  stacked layers (repeat.sub); combined: one combined_qkv array, read at 0, 1, 2."""
  d, f, n, kv, h, v = (model.model_dims, model.hidden_dims, model.num_heads, model.num_kv_heads,
                       model.head_dim, model.vocab_size)
  out = [Entry("lm.embedding_lookup.emb_var", (), ("embed_tokens",), None, COPY, (v, d), (v, d)),
         Entry("lm.softmax.logits_ffn.linear.w", (), ("lm_head", "w"), None, COPY, (d, v),
               (d, v))]
  out.append(Entry("lm.final_ln.scale", (), ("norm", "scale"), None, COPY, (d,), (d,)))
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
    for sub, index, path, kind, shape in per_layer:
      one = _pax_shape(kind, shape)
      if index:  # combined_qkv: [3, D, N, H]
        one = (3, *one)
      name, at, whole = _layer_name(i, sub, repeated, model.num_layers, one)
      out.append(Entry(name, at + index, (layer, *path.split("/")), i, kind, shape, whole))
  return out


# Pax's TransformerLm: paxlike LanguageModel path -> (praxis variable under lm., kind); the
# layers' (under transformer/x_layers_<i>/ or transformer/repeat/) in _LM_LAYER.
_LM_TOP = {
    "softmax/embedding": ("softmax.logits_ffn.linear.w", TABLE_T),
    "softmax/bias": ("softmax.logits_ffn.bias.b", COPY),
    "embedding/embedding": ("embedding_lookup.emb_var", COPY),
    "position_emb/embedding": ("position_emb.emb_var", COPY),
    "final_norm/scale": ("final_ln.scale", SCALE_PLUS_1),
    "final_norm/bias": ("final_ln.bias", COPY),
}
_LM_LAYER = {
    "pre_attn_norm/scale": ("layer_norm.scale", SCALE_PLUS_1),
    "pre_attn_norm/bias": ("layer_norm.bias", COPY),
    "attention/qkv/w": ("self_attention.combined_qkv.w", QKV),
    "attention/qkv/b": ("self_attention.combined_qkv.b", COPY),
    "attention/per_dim_scale": ("self_attention.per_dim_scale.per_dim_scale", COPY),
    "attention/post": ("self_attention.post.w", POST),
    "attention/post_bias": ("self_attention.post.b", COPY),
    "pre_ffn_norm/scale": ("ff_layer.layer_norm.scale", SCALE_PLUS_1),
    "pre_ffn_norm/bias": ("ff_layer.layer_norm.bias", COPY),
    **{f"attention/{p}/{w}": (f"self_attention.{p}.{w}", COPY)
       for p in ("query", "key", "value") for w in ("w", "b")},
    **{f"ffn/{p}/{ours}": (f"ff_layer.{q}.{theirs}", COPY)
       for p, q in (("ffn1", "ffn_layer1"), ("ffn1_gate", "ffn_layer1_gate"),
                    ("ffn2", "ffn_layer2"))
       for ours, theirs in (("w", "linear.w"), ("b", "bias.b"))},
}


def lm_entries(model: Any, target: dict[str, Any], repeated: bool) -> list[Entry]:
  """Pax's TransformerLm variables as the LanguageModel's parameters `target` (name -> leaf
  with .shape). Parameters praxis's model has no variable for (LoRA adapters, FP8 scales)
  are left out: INIT_FROM_RULES decide them."""
  rms = model.norm_type == "rmsnorm"  # praxis's RmsNorm keeps its scale direct
  out = []
  for name, leaf in target.items():
    parts, shape = tuple(name.split("/")), tuple(leaf.shape)
    if parts[0] != "transformer":
      if name in _LM_TOP:
        pax, kind = _LM_TOP[name]
        kind = COPY if kind == SCALE_PLUS_1 and rms else kind
        out.append(Entry(f"lm.{pax}", (), parts, None, kind, shape, _pax_shape(kind, shape)))
      continue
    stacked = parts[1] == "repeat"
    sub = "/".join(parts[2:])
    if sub not in _LM_LAYER or not (stacked or parts[1].startswith("x_layers_")):
      continue
    pax, kind = _LM_LAYER[sub]
    kind = COPY if kind == SCALE_PLUS_1 and rms else kind
    one = shape[1:] if stacked else shape
    layers = range(shape[0]) if stacked else [int(parts[1][len("x_layers_"):])]
    for i in layers:
      pax_name, index, whole = _layer_name(i, pax, repeated, model.num_layers,
                                           _pax_shape(kind, one))
      out.append(Entry(pax_name, index, parts, i if stacked else None, kind, one, whole))
  return out


def lazy_params(path: str, step: int | None, model: Any, target: dict[str, Any] | None = None
                ) -> dict[str, Any]:
  """The model's params tree of LazyParams, checked now against the Pax checkpoint.

  target: the model's parameters (name -> leaf with .shape, paxlike.initial.flat_names of
  its abstract params), which Pax's LM is mapped by; None: traced from the model. A
  pipelined model gets its scanned twin's layers placed into its stages.

  Raises:
    UserError: a model of another family, not a Pax checkpoint, a missing
      variable, a shape that differs, or variables the model has no place for.
  """
  family = model.pax_variables()
  if family == "llama":
    if model.qkv_bias or model.tie_embeddings:
      raise UserError(f"pax:{path}: Pax's LLaMA has separate input and output tables and no "
                      "query/key/value biases; this experiment sets "
                      f"{'QKV_BIAS' if model.qkv_bias else 'TIE_EMBEDDINGS'}.")
  elif family == "lm":
    for unread, why in ((model.num_experts, "mixture-of-experts layers"),
                        (model.relative_bias, "a relative position bias"),
                        (model.norm_policy != "pre", f"NORM_POLICY={model.norm_policy!r}")):
      if unread:
        raise UserError(f"pax:{path}: Pax checkpoints are read into LMs with pre-norm dense "
                        f"layers; this experiment has {why}.")
  else:
    raise UserError(f"pax:{path}: Pax checkpoints are read into Pax's LM (LanguageModel) and "
                    f"Pax's LLaMA (the Llama family); this experiment's model is a "
                    f"{type(model).__name__}.")
  where = find(path, step)
  source = read_params(where)
  if any(n.startswith("lm.transformer.pipeline.") for n in source):
    raise UserError(f"the Pax checkpoint in {where} holds a pipelined stack (lm.transformer."
                    "pipeline.*), which paxlike does not read yet; Pax's per-layer and "
                    "repeated stacks are read, into any of paxlike's layouts.")
  plain = model.unpipelined()
  if plain is not model:  # the scanned twin's layers, placed straight into the stages
    from paxlike.interop.hf_files import lazy_pipeline
    from paxlike.relayout import STACK

    form = model.stack_form()
    staged = form.to(_source_tree(plain, source, where, None))
    return form.back({**staged, STACK: lazy_pipeline(staged[STACK], model.layout())})
  return _source_tree(model, source, where, target)


def _source_tree(model: Any, source: dict[str, Any], where: str,
                 target: dict[str, Any] | None) -> dict[str, Any]:
  """An unpipelined model's LazyParams from the checked source (lazy_params)."""
  repeated = any(n.startswith("lm.transformer.repeat.") for n in source)
  if model.pax_variables() == "llama":
    combined = any(n.endswith("self_attention.combined_qkv.w") for n in source)
    if combined and model.num_kv_heads != model.num_heads:
      raise UserError(f"the Pax checkpoint in {where} has combined q/k/v projections (one key "
                      f"and value head per query head) but this experiment has NUM_KV_HEADS="
                      f"{model.num_kv_heads} for {model.num_heads} heads.")
    entries = llama_entries(model, repeated, combined)
  else:
    if target is None:  # the model's own parameter names and shapes
      import flax.linen as nn
      import jax
      import jax.numpy as jnp

      target = flat_names(nn.meta.unbox(jax.eval_shape(
          lambda: model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))["params"]))
    entries = lm_entries(model, target, repeated)
  return _lazy_tree(entries, source, where, model.use_repeated_layer)


def _lazy_tree(entries: list[Entry], source: dict[str, Any], where: str, stacked: bool
               ) -> dict[str, Any]:
  """LazyParams of `entries`, each variable's name and shape checked first; a variable of
  the checkpoint that no entry reads is an error."""
  checked: set[str] = set()
  lazy = []
  for e in entries:
    if e.pax not in source:
      raise UserError(f"the Pax checkpoint in {where} has no variable {PARAMS}{e.pax}; it is "
                      "not a checkpoint of this experiment's model (layers, heads, biases, "
                      "tied table).")
    if e.pax not in checked:
      got = _shape(source[e.pax])
      if got != e.pax_shape:
        raise UserError(f"the Pax checkpoint in {where} has {e.pax} of shape {list(got)} but "
                        f"this model needs {list(e.pax_shape)}; use a checkpoint of the "
                        "experiment's shape.")
      checked.add(e.pax)
    reader = functools.partial(_read, source[e.pax], e.index, e.kind, e.shape)
    lazy.append((e.ours, e.layer if stacked else None, reader, e.shape))
  unknown = sorted(set(source) - checked)
  if unknown:
    raise UserError(f"the Pax checkpoint in {where} has variables this model has no place for "
                    f"({', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}); use a "
                    "checkpoint of the experiment's shape.")
  return lazy_tree(lazy)
