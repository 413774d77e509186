"""Hugging Face checkpoints in and out: config.json + safetensors <-> paxlike parameters.

A `save_pretrained` directory holds config.json and either model.safetensors
or shards `model-0000k-of-0000n.safetensors` listed in
model.safetensors.index.json. Only the safetensors library and numpy are
used (no torch): tensors are read by name, converted to float32 and laid
out as the model's parameter tree (torch's Linear stores [out, in]; paxlike
kernels are [in, ...out]).

Supported families, by config["model_type"]: "t5" (T5, T5 v1.1, Flan-T5) ->
paxlike.models.t5.T5Model; "llama", "mistral", "qwen2" ->
paxlike.models.llama.LlamaModel (paxlike.interop.hf_llama, dispatched by the
model's own config).

transformers >= 5 note: its T5Config always sets tie_word_embeddings=True and
keeps the original T5's tied-head scaling under `scale_decoder_outputs`, so
"tied" is read from scale_decoder_outputs when present, else from
tie_word_embeddings (default True, as transformers reads old configs). A
Flan-T5-shaped model made by transformers 5 therefore saves no lm_head.weight;
its head is the shared table, unscaled, which imports as an untied
logits_dense equal to the embedding.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from paxlike.errors import UserError
from paxlike.interop.hf_files import CONFIG, INDEX, SINGLE, lazy_tree, materialize, write_directory
from paxlike.interop.hf_files import get_path as _get
from paxlike.interop.hf_files import same as _same

# Checkpoint tensors that carry nothing the model lacks: aliases of shared.weight,
# and a relative bias old T5 checkpoints kept on the (bias-free) cross-attention.
IGNORED = frozenset({
    "encoder.embed_tokens.weight",
    "decoder.embed_tokens.weight",
    "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",
})

# config.json field -> (experiment hyperparameter, transformers' default when absent).
T5_FIELDS: dict[str, tuple[str, Any]] = {
    "d_model": ("MODEL_DIMS", 512),
    "d_ff": ("HIDDEN_DIMS", 2048),
    "num_heads": ("NUM_HEADS", 8),
    "d_kv": ("DIMS_PER_HEAD", 64),
    "num_layers": ("NUM_ENCODER_LAYERS", 6),
    "num_decoder_layers": ("NUM_DECODER_LAYERS", None),  # None: num_layers
    "vocab_size": ("VOCAB_SIZE", 32128),
    "feed_forward_proj": ("ACTIVATION", "relu"),
    "tie_word_embeddings": ("TIE_EMBEDDINGS", True),
    "relative_attention_num_buckets": ("RELATIVE_ATTENTION_NUM_BUCKETS", 32),
    "relative_attention_max_distance": ("RELATIVE_ATTENTION_MAX_DISTANCE", 128),
    "layer_norm_epsilon": ("LAYERNORM_EPSILON", 1e-6),
}

# ------------------------------------------------------------------ config


class HfConfig(dict):
  """config.json's fields, plus the directory it came from (for messages)."""

  directory: str = ""


def read_config(directory: str) -> dict[str, Any]:
  """config.json of a save_pretrained directory.

  Raises:
    UserError: the directory or its config.json is missing or not JSON.
  """
  if not os.path.isdir(directory):
    raise UserError(f"the Hugging Face directory {directory} does not exist; pass a directory "
                    "written by save_pretrained (config.json + model.safetensors).")
  path = os.path.join(directory, CONFIG)
  if not os.path.isfile(path):
    raise UserError(f"{directory} has no {CONFIG}; pass a directory written by "
                    "save_pretrained (config.json + model.safetensors).")
  try:
    with open(path) as f:
      config = json.load(f)
  except (OSError, ValueError) as e:
    raise UserError(f"{path} is not readable JSON ({e}); re-download or re-save the "
                    "checkpoint.") from e
  if not isinstance(config, dict):
    raise UserError(f"{path} holds no JSON object; re-download or re-save the checkpoint.")
  out = HfConfig(config)
  out.directory = directory
  return out


def t5_config_value(config: dict[str, Any], field: str) -> Any:
  """A T5 config field as transformers reads it (defaults filled in, 'tied' resolved)."""
  if field == "tie_word_embeddings" and "scale_decoder_outputs" in config:
    return bool(config["scale_decoder_outputs"])
  if field == "num_decoder_layers" and config.get("num_decoder_layers") is None:
    return t5_config_value(config, "num_layers")
  return config.get(field, T5_FIELDS[field][1])


def _model_type(config: dict[str, Any], where: str) -> str:
  model_type = config.get("model_type")
  if model_type != "t5":
    raise UserError(f"{where} has model_type={model_type!r}; paxlike imports only 't5' "
                    "(T5, T5 v1.1, Flan-T5) checkpoints.")
  return model_type


def _is_llama(config: dict[str, Any]) -> bool:
  return config.get("model_type") in ("llama", "mistral", "qwen2")


def check_config(hf_config: dict[str, Any], model: Any) -> None:
  """Raises UserError when the checkpoint's architecture differs from the experiment's.

  Args:
    hf_config: the checkpoint's config.json (read_config; a plain dict works too).
    model: the experiment's model (its hf_config() is the reference).
  """
  ours = model.hf_config()
  if _is_llama(ours):
    from paxlike.interop import hf_llama

    hf_llama.check_config(hf_config, model)
    return
  directory = getattr(hf_config, "directory", "")
  where = f"config.json of {directory}" if directory else "config.json"
  _model_type(hf_config, where)
  for field, (hparam, _) in T5_FIELDS.items():
    theirs, mine = t5_config_value(hf_config, field), t5_config_value(ours, field)
    if not _same(theirs, mine):
      raise UserError(f"{where} has {field}={theirs!r} but the experiment has "
                      f"{hparam}={mine!r}; set {hparam}={theirs!r} or use a checkpoint "
                      "of this model's shape.")
  start = hf_config.get("decoder_start_token_id", 0)
  if start != ours["decoder_start_token_id"]:
    raise UserError(f"{where} has decoder_start_token_id={start!r}, and paxlike's T5 starts "
                    f"decoding at {ours['decoder_start_token_id']} (as T5X and the published "
                    "T5 checkpoints do); use a checkpoint that starts there.")


# ----------------------------------------------------------------- tensors


class _Checkpoint:
  """The tensors of a save_pretrained directory, single file or sharded, by name."""

  def __init__(self, directory: str):
    from safetensors import safe_open

    self.directory = directory
    index = os.path.join(directory, INDEX)
    if os.path.isfile(index):
      try:
        with open(index) as f:
          weight_map = json.load(f)["weight_map"]
      except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{index} is not a safetensors index with a weight_map ({e}); "
                        "re-download or re-save the checkpoint.") from e
      files = sorted(set(weight_map.values()))
    elif os.path.isfile(os.path.join(directory, SINGLE)):
      files, weight_map = [SINGLE], None
    else:
      raise UserError(f"{directory} has neither {SINGLE} nor {INDEX}; save the model with "
                      "save_pretrained(..., safe_serialization=True).")
    self.names: dict[str, str] = {}  # tensor name -> file
    self._headers: dict[str, tuple[int, dict[str, Any]]] = {}
    self.handles: dict[str, Any] = {}
    for name in files:
      path = os.path.join(directory, name)
      try:
        handle = safe_open(path, framework="numpy")
      except Exception as e:  # safetensors raises its own error types and OSError
        raise UserError(f"cannot read the safetensors file {path} ({e}); re-download or "
                        "re-save the checkpoint.") from e
      self.handles[name] = handle
      for key in handle.keys():
        self.names[key] = name
    if weight_map is not None:
      missing = sorted(k for k, f in weight_map.items() if self.names.get(k) != f)
      if missing:
        raise UserError(f"{INDEX} of {directory} lists {missing[0]} in {weight_map[missing[0]]}, "
                        "which does not hold it; re-download the checkpoint's shards.")

  def __contains__(self, name: str) -> bool:
    return name in self.names

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self.handles[self.names[name]].get_slice(name).get_shape())

  def get(self, name: str) -> np.ndarray:
    """The tensor as float32, read with plain file reads.

    Not through safetensors' memory map: its pages would stay in this
    process's memory for as long as the map is open, so reading a whole
    checkpoint through it would hold the whole checkpoint. numpy has no
    bfloat16: ml_dtypes reads those bytes.
    """
    file = self.names[name]
    path = os.path.join(self.directory, file)
    data_start, entries = self._header(path)
    entry = entries[name]
    dtype = _FLOAT_DTYPES.get(entry["dtype"])
    if dtype is None:  # not a float tensor: safetensors converts it
      return np.asarray(self.handles[file].get_tensor(name), dtype=np.float32)
    start, end = entry["data_offsets"]
    out = np.empty(entry["shape"], dtype)
    with open(path, "rb") as f:
      f.seek(data_start + start)
      if f.readinto(out.reshape(-1).view(np.uint8)) != end - start:
        raise UserError(f"{path} ends inside tensor {name}; re-download the checkpoint.")
    return out.astype(np.float32, copy=False)

  def _header(self, path: str) -> tuple[int, dict[str, Any]]:
    """(where the data starts, the header's entries) of one safetensors file, read once."""
    if path not in self._headers:
      with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        self._headers[path] = (8 + size, json.loads(f.read(size)))
    return self._headers[path]


def _float_dtypes() -> dict[str, Any]:
  import ml_dtypes

  return {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
          "F64": np.dtype(np.float64), "BF16": np.dtype(ml_dtypes.bfloat16)}


_FLOAT_DTYPES = _float_dtypes()


# ------------------------------------------------------------ T5 name map

# Conversions between a torch tensor and a paxlike parameter, by kind.
#   copy: same layout (norm scales, the embedding, the relative bias table)
#   linear: torch Linear [out, in] -> kernel [in, out]
#   heads_in: q/k/v [heads*d_kv, d] -> [d, heads, d_kv]
#   heads_out: o [d, heads*d_kv] -> [heads, d_kv, d]


def _to_paxlike(kind: str, x: np.ndarray, heads: int) -> np.ndarray:
  if kind == "copy":
    return x
  if kind == "linear":
    return x.T
  if kind == "heads_in":
    return x.T.reshape(x.shape[1], heads, x.shape[0] // heads)
  if kind == "heads_out":
    return x.T.reshape(heads, x.shape[1] // heads, x.shape[0])
  raise ValueError(kind)


def _to_torch(kind: str, x: np.ndarray) -> np.ndarray:
  if kind == "copy":
    return x
  if kind == "linear":
    return x.T
  if kind == "heads_in":
    return x.reshape(x.shape[0], -1).T
  if kind == "heads_out":
    return x.reshape(-1, x.shape[-1]).T
  raise ValueError(kind)


def _attention(prefix: str, ours: str) -> Iterator[tuple[str, str, str]]:
  for hf, name, kind in (("q", "query", "heads_in"), ("k", "key", "heads_in"),
                         ("v", "value", "heads_in"), ("o", "out", "heads_out")):
    yield f"{prefix}.{hf}.weight", f"{ours}/{name}/kernel", kind


def _mlp(prefix: str, activation: str) -> Iterator[tuple[str, str, str]]:
  names = ("wi_0", "wi_1", "wo") if activation.startswith("gated") else ("wi", "wo")
  for name in names:
    yield f"{prefix}.DenseReluDense.{name}.weight", f"mlp/{name}/kernel", "linear"


def _t5_layer_entries(model: Any, stack: str) -> Iterator[tuple[str, str, str]]:
  """(hf name with {i} for the block, path inside one layer, kind) for a stack's layers."""
  block = f"{stack}.block.{{i}}.layer"
  if stack == "encoder":
    yield f"{block}.0.layer_norm.weight", "pre_attention_layer_norm/scale", "copy"
    yield from _attention(f"{block}.0.SelfAttention", "attention")
    yield f"{block}.1.layer_norm.weight", "pre_mlp_layer_norm/scale", "copy"
    yield from _mlp(f"{block}.1", model.activation)
  else:
    yield f"{block}.0.layer_norm.weight", "pre_self_attention_layer_norm/scale", "copy"
    yield from _attention(f"{block}.0.SelfAttention", "self_attention")
    yield f"{block}.1.layer_norm.weight", "pre_cross_attention_layer_norm/scale", "copy"
    yield from _attention(f"{block}.1.EncDecAttention", "encoder_decoder_attention")
    yield f"{block}.2.layer_norm.weight", "pre_mlp_layer_norm/scale", "copy"
    yield from _mlp(f"{block}.2", model.activation)


def t5_name_map(model: Any) -> list[tuple[str, tuple[str, ...], int | None, str]]:
  """Every HF tensor of the model: (hf name, paxlike path, layer index or None, kind).

  The path names the unscanned layout (`layers_{i}`); with use_repeated_layer
  the layer index selects a row of the stacked `layers` parameter instead.
  """
  out = [("shared.weight", ("token_embedder", "embedding"), None, "copy")]
  for stack, num_layers, norm in (("encoder", model.num_encoder_layers, "encoder_norm"),
                                  ("decoder", model.num_decoder_layers, "decoder_norm")):
    out.append((f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                (stack, "relpos_bias", "rel_embedding"), None, "copy"))
    for i in range(num_layers):
      layer = "layers" if model.use_repeated_layer else f"layers_{i}"
      for hf, path, kind in _t5_layer_entries(model, stack):
        out.append((hf.format(i=i), (stack, layer, *path.split("/")), i, kind))
    out.append((f"{stack}.final_layer_norm.weight", (stack, norm, "scale"), None, "copy"))
  if not model.tie_embeddings:
    out.append(("lm_head.weight", ("decoder", "logits_dense", "kernel"), None, "linear"))
  return out


def _torch_shape(kind: str, value_shape: tuple[int, ...]) -> tuple[int, ...]:
  """The torch shape a paxlike parameter of shape value_shape exports to."""
  if kind == "copy":
    return value_shape
  if kind == "linear":
    return value_shape[::-1]
  if kind == "heads_in":
    return (value_shape[1] * value_shape[2], value_shape[0])
  return (value_shape[2], value_shape[0] * value_shape[1])


def t5_param_shape(model: Any, path: tuple[str, ...]) -> tuple[int, ...]:
  """The shape of one (unstacked) paxlike parameter, from the last names of its path."""
  d, f, n, h, v = (model.model_dims, model.hidden_dims, model.num_heads, model.dim_per_head,
                   model.vocab_size)
  shapes = {"embedding": (v, d), "rel_embedding": (model.relative_attention_num_buckets, n),
            "scale": (d,), "query": (d, n, h), "key": (d, n, h), "value": (d, n, h),
            "out": (n, h, d), "wi_0": (d, f), "wi_1": (d, f), "wi": (d, f), "wo": (f, d),
            "logits_dense": (d, v)}
  return shapes[path[-1]] if path[-1] in shapes else shapes[path[-2]]


def import_params(directory: str, model: Any) -> dict[str, Any]:
  """The checkpoint's parameters as the model's tree of float32 numpy arrays.

  Raises:
    UserError: as lazy_params.
  """
  return materialize(lazy_params(directory, model))


def lazy_params(directory: str, model: Any) -> dict[str, Any]:
  """The model's params tree of LazyParams: checked now, each tensor read when asked.

  Names, shapes and the tie are checked here, from the files' headers (and
  the two tables a tied model compares), so a bad checkpoint fails before a
  parameter is placed anywhere.

  Raises:
    UserError: missing directory/config/files, an architecture that differs
      from the model's, a missing tensor, a shape that differs, or tensors
      the model has no place for.
  """
  check_config(read_config(directory), model)
  ckpt = _Checkpoint(directory)
  if _is_llama(model.hf_config()):
    from paxlike.interop import hf_llama

    plain = model.unpipelined()
    tree = hf_llama.lazy_params(directory, plain, ckpt)
    if plain is model:
      return tree
    # A pipelined model: the scanned twin's layers, placed straight into the stages (the
    # model's stack form puts its layers where relayout reads stacks, and back).
    from paxlike.interop.hf_files import lazy_pipeline
    from paxlike.relayout import STACK

    form = model.stack_form()
    staged = form.to(tree)
    return form.back({**staged, STACK: lazy_pipeline(staged[STACK], model.layout())})
  entries = []
  used = set()
  for hf_name, path, layer, kind in t5_name_map(model):
    source = hf_name
    if hf_name == "lm_head.weight" and hf_name not in ckpt:
      # transformers 5 saves a Flan-T5-shaped model's head as the shared table only.
      source = "shared.weight"
    if source not in ckpt:
      raise UserError(f"the checkpoint in {directory} has no tensor {hf_name}; it is not a "
                      "complete T5 checkpoint of this shape (re-save it with save_pretrained).")
    shape = t5_param_shape(model, path)
    got = ckpt.shape(source)
    if got != _torch_shape(kind, shape):
      raise UserError(f"the checkpoint in {directory} has {source} of shape {list(got)} but "
                      f"this model needs {list(_torch_shape(kind, shape))}; use a checkpoint "
                      "of the experiment's shape.")
    used.add(source)
    reader = functools.partial(_read_t5, ckpt, source, kind, model.num_heads)
    entries.append((path, layer if model.use_repeated_layer else None, reader, shape))
  if model.tie_embeddings and "lm_head.weight" in ckpt:
    # A tied model has no head of its own; a distinct lm_head would be silently dropped.
    if not np.array_equal(ckpt.get("lm_head.weight"), ckpt.get("shared.weight")):
      raise UserError(f"the checkpoint in {directory} has an lm_head.weight that differs from "
                      "shared.weight but the experiment has TIE_EMBEDDINGS=True; set "
                      "TIE_EMBEDDINGS=False for a checkpoint with its own output layer.")
    used.add("lm_head.weight")
  unknown = sorted(set(ckpt.names) - used - IGNORED)
  if unknown:
    raise UserError(f"the checkpoint in {directory} has tensors this model has no place for "
                    f"({', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}); check "
                    "that config.json describes the weights, or use a matching checkpoint.")
  return lazy_tree(entries)


def _read_t5(ckpt: _Checkpoint, name: str, kind: str, heads: int) -> np.ndarray:
  return np.ascontiguousarray(_to_paxlike(kind, ckpt.get(name), heads))


def export_params(params: Any, model: Any, directory: str, positions: int | None = None
                  ) -> None:
  """Writes config.json + model.safetensors that T5ForConditionalGeneration.from_pretrained loads.

  Args:
    params: the model's parameter tree (arrays on the host, scanned or not).
    model: the model (its hf_config() becomes config.json).
    directory: a new or empty directory.
    positions: a Llama-family source's max_position_embeddings, kept (hf_llama).

  Raises:
    UserError: directory exists and is not empty, or the model has no HF layout.
  """

  config = model.hf_config()
  if os.path.exists(directory) and (not os.path.isdir(directory) or os.listdir(directory)):
    raise UserError(f"{directory} already exists and is not empty; exports never overwrite: "
                    "remove it or choose another directory.")
  if _is_llama(config):
    from paxlike.interop import hf_llama

    hf_llama.export_params(params, model, directory, positions)
    return
  tensors: dict[str, np.ndarray] = {}
  for hf_name, path, layer, kind in t5_name_map(model):
    value = np.asarray(_get(params, path), dtype=np.float32)
    if model.use_repeated_layer and layer is not None:
      value = value[layer]
    tensors[hf_name] = np.ascontiguousarray(_to_torch(kind, value))
  write_directory(directory, config, tensors)
