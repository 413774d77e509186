"""Hugging Face Llama / Mistral / Qwen2 directories <-> paxlike.models.llama.LlamaModel.

paxlike.interop.hf dispatches here by config["model_type"] ("llama",
"mistral", "qwen2"). The config checks compare every field that changes the
computation with the experiment's hyperparameter (a mismatch is one
UserError naming both); fields paxlike does not model (a rope type other
than default/llama3, sliding-window attention, an o_proj or MLP bias, an
activation other than SiLU, partial rotary) are refused by name.

Rotary parameters are read from transformers 5's `rope_parameters` or from
the older `rope_theta` + `rope_scaling`; exports write the older form, which
both read.

Tensors are read one at a time (safetensors opens files lazily) and written
into the layer row of a preallocated stacked array, so the import holds the
model once (float32) plus the tensor being read.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from paxlike.errors import UserError

MODEL_TYPES = ("llama", "mistral", "qwen2")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen2": "Qwen2ForCausalLM"}
ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


# ------------------------------------------------------------------ config


def _rope(config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
  """(rope_theta, the scaling dict or None for plain RoPE) from either config form."""
  params = config.get("rope_parameters")
  if isinstance(params, dict) and params:
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    scaling = params
  else:
    theta = config.get("rope_theta", 10000.0)
    scaling = config.get("rope_scaling")
  if not scaling:
    return float(theta), None
  kind = scaling.get("rope_type", scaling.get("type", "default"))
  if kind == "default":
    return float(theta), None
  if kind != "llama3":
    raise UserError(f"rope_scaling rope_type={kind!r} is not supported; paxlike models "
                    "default and llama3 rotary embeddings only.")
  return float(theta), {"rope_type": "llama3", **{k: scaling[k] for k in ROPE_KEYS}}


def _unsupported(config: dict[str, Any], where: str) -> None:
  """Refuses, by name, config fields that change the computation in ways paxlike lacks."""
  model_type = config.get("model_type")
  sliding = None
  if model_type == "mistral":
    sliding = config.get("sliding_window", 4096)  # MistralConfig's default
  elif model_type == "qwen2" and config.get("use_sliding_window", False):
    sliding = config.get("sliding_window", 4096)
  if sliding is None and "sliding_attention" in (config.get("layer_types") or []):
    sliding = config.get("sliding_window", "set")
  if sliding is not None:
    raise UserError(f"{where} has sliding_window={sliding!r}; paxlike has no sliding-window "
                    "attention, so this checkpoint cannot be imported.")
  problems = []
  if config.get("hidden_act", "silu") != "silu":
    problems.append(f"hidden_act={config['hidden_act']!r} (paxlike's MLP is SwiGLU: 'silu')")
  if model_type != "qwen2" and config.get("attention_bias", False):
    problems.append("attention_bias=true (a bias on o_proj too; only q/k/v biases are modelled)")
  if config.get("mlp_bias", False):
    problems.append("mlp_bias=true")
  if config.get("partial_rotary_factor", 1.0) != 1.0:
    problems.append(f"partial_rotary_factor={config['partial_rotary_factor']}")
  if config.get("attention_dropout", 0.0):
    problems.append(f"attention_dropout={config['attention_dropout']}")
  if problems:
    raise UserError(f"{where} has {problems[0]}, which paxlike does not model; this "
                    "checkpoint cannot be imported.")


def normalized(config: dict[str, Any], where: str = "config.json") -> dict[str, Any]:
  """The fields that fix the computation, as transformers reads them (defaults filled in)."""
  model_type = config.get("model_type")
  if model_type not in MODEL_TYPES:
    raise UserError(f"{where} has model_type={model_type!r}; the Llama family imports "
                    f"{', '.join(MODEL_TYPES)}.")
  _unsupported(config, where)
  theta, scaling = _rope(config)
  heads = config.get("num_attention_heads", 32)
  hidden = config.get("hidden_size", 4096)
  return {
      "hidden_size": hidden,
      "intermediate_size": config.get("intermediate_size", 11008),
      "num_hidden_layers": config.get("num_hidden_layers", 32),
      "num_attention_heads": heads,
      "num_key_value_heads": config.get("num_key_value_heads") or heads,
      "head_dim": config.get("head_dim") or hidden // heads,
      "vocab_size": config.get("vocab_size", 32000),
      "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
      "rms_norm_eps": config.get("rms_norm_eps", 1e-6),
      "rope_theta": theta,
      "rope_scaling": scaling,
      "qkv_bias": model_type == "qwen2",
  }


# config field -> the experiment hyperparameter it must equal.
HPARAMS = {
    "hidden_size": "MODEL_DIMS", "intermediate_size": "HIDDEN_DIMS",
    "num_hidden_layers": "NUM_LAYERS", "num_attention_heads": "NUM_HEADS",
    "num_key_value_heads": "NUM_KV_HEADS", "head_dim": "DIMS_PER_HEAD",
    "vocab_size": "VOCAB_SIZE", "tie_word_embeddings": "TIE_EMBEDDINGS",
    "rms_norm_eps": "NORM_EPSILON", "rope_theta": "ROPE_THETA", "rope_scaling": "ROPE_SCALING",
    "qkv_bias": "QKV_BIAS",
}


def model_config(model: Any) -> dict[str, Any]:
  """config.json for the model: Qwen2ForCausalLM with q/k/v biases, else LlamaForCausalLM."""
  model_type = "qwen2" if model.qkv_bias else "llama"
  config: dict[str, Any] = {
      "architectures": [ARCHITECTURES[model_type]],
      "model_type": model_type,
      "hidden_size": model.model_dims,
      "intermediate_size": model.hidden_dims,
      "num_hidden_layers": model.num_layers,
      "num_attention_heads": model.num_heads,
      "num_key_value_heads": model.num_kv_heads,
      "head_dim": model.head_dim,
      "vocab_size": model.vocab_size,
      "tie_word_embeddings": model.tie_embeddings,
      "rms_norm_eps": model.norm_epsilon,
      "rope_theta": model.rope_theta,
      "rope_scaling": dict(model.rope_scaling) if model.rope_scaling else None,
      "max_position_embeddings": model.max_seq_len,
      "hidden_act": "silu",
      "attention_dropout": 0.0,
      "initializer_range": 0.02,
      "bos_token_id": None,
      "eos_token_id": model.eos_id,
      "pad_token_id": model.pad_id,
      "use_cache": True,
  }
  if model_type == "llama":
    config.update(attention_bias=False, mlp_bias=False)
  else:
    config.update(use_sliding_window=False, sliding_window=None)
  return config


def _same(a: Any, b: Any) -> bool:
  from paxlike.interop.hf_files import same

  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
  return same(a, b)


def check_config(hf_config: dict[str, Any], model: Any) -> None:
  """Raises UserError when the checkpoint's architecture differs from the experiment's."""
  directory = getattr(hf_config, "directory", "")
  where = f"config.json of {directory}" if directory else "config.json"
  theirs = normalized(hf_config, where)
  ours = normalized(model_config(model))
  for field, hparam in HPARAMS.items():
    if not _same(theirs[field], ours[field]):
      raise UserError(f"{where} has {field}={theirs[field]!r} but the experiment has "
                      f"{hparam}={ours[field]!r}; set {hparam}={theirs[field]!r} or use a "
                      "checkpoint of this model's shape.")


# ----------------------------------------------------------------- tensors


def name_map(model: Any) -> list[tuple[str, tuple[str, ...], int | None, str, tuple[int, ...]]]:
  """Every HF tensor: (hf name, paxlike path, layer or None, kind, paxlike shape of one layer).

  kinds: copy; linear ([out, in] -> [in, out]); heads_in ([heads*h, d] -> [d, heads, h]);
  heads_out ([d, heads*h] -> [heads, h, d]); bias ([heads*h] -> [heads, h]).
  """
  d, f, n, kv, h, v = (model.model_dims, model.hidden_dims, model.num_heads, model.num_kv_heads,
                       model.head_dim, model.vocab_size)
  out = [("model.embed_tokens.weight", ("embed_tokens",), None, "copy", (v, d))]
  per_layer = [
      ("input_layernorm.weight", "input_layernorm/scale", "copy", (d,)),
      ("self_attn.q_proj.weight", "self_attn/q_proj/w", "heads_in", (d, n, h)),
      ("self_attn.k_proj.weight", "self_attn/k_proj/w", "heads_in", (d, kv, h)),
      ("self_attn.v_proj.weight", "self_attn/v_proj/w", "heads_in", (d, kv, h)),
      ("self_attn.o_proj.weight", "self_attn/o_proj/w", "heads_out", (n, h, d)),
      ("post_attention_layernorm.weight", "post_attention_layernorm/scale", "copy", (d,)),
      ("mlp.gate_proj.weight", "mlp/gate_proj/w", "linear", (d, f)),
      ("mlp.up_proj.weight", "mlp/up_proj/w", "linear", (d, f)),
      ("mlp.down_proj.weight", "mlp/down_proj/w", "linear", (f, d)),
  ]
  if model.qkv_bias:
    per_layer += [(f"self_attn.{p}_proj.bias", f"self_attn/{p}_proj/b", "bias", (heads, h))
                  for p, heads in (("q", n), ("k", kv), ("v", kv))]
  for i in range(model.num_layers):
    layer = "layers" if model.use_repeated_layer else f"layers_{i}"
    for hf, path, kind, shape in per_layer:
      out.append((f"model.layers.{i}.{hf}", (layer, *path.split("/")), i, kind, shape))
  out.append(("model.norm.weight", ("norm", "scale"), None, "copy", (d,)))
  if not model.tie_embeddings:
    out.append(("lm_head.weight", ("lm_head", "w"), None, "linear", (d, v)))
  return out


def _to_paxlike(kind: str, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  if kind in ("copy", "bias"):
    return x.reshape(shape)
  if kind == "linear":
    return x.T
  if kind == "heads_in":
    return x.T.reshape(shape)
  return x.T.reshape(shape)  # heads_out: [d, n*h] -> [n*h, d] -> [n, h, d]


def _to_torch(kind: str, x: np.ndarray) -> np.ndarray:
  if kind == "copy":
    return x
  if kind == "bias":
    return x.reshape(-1)
  if kind in ("linear",):
    return x.T
  if kind == "heads_in":
    return x.reshape(x.shape[0], -1).T
  return x.reshape(-1, x.shape[-1]).T


def _torch_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  if kind == "copy":
    return shape
  if kind == "bias":
    return (int(np.prod(shape)),)
  if kind == "linear":
    return shape[::-1]
  if kind == "heads_in":
    return (shape[1] * shape[2], shape[0])
  return (shape[2], shape[0] * shape[1])


def lazy_params(directory: str, model: Any, ckpt: Any) -> dict[str, Any]:
  """The model's params tree of LazyParams (paxlike.interop.hf.lazy_params for this family).

  Args:
    directory: the save_pretrained directory (for messages).
    model: the experiment's LlamaModel (config already checked).
    ckpt: paxlike.interop.hf's open checkpoint (tensors by name, read lazily).
  """
  from paxlike.interop.hf_files import lazy_tree

  entries = []
  used = set()
  for hf_name, path, layer, kind, shape in name_map(model):
    if hf_name not in ckpt:
      raise UserError(f"the checkpoint in {directory} has no tensor {hf_name}; it is not a "
                      "complete checkpoint of this shape (re-save it with save_pretrained).")
    want, got = _torch_shape(kind, shape), ckpt.shape(hf_name)
    if got != want:
      raise UserError(f"the checkpoint in {directory} has {hf_name} of shape {list(got)} but "
                      f"this model needs {list(want)}; use a checkpoint of the experiment's "
                      "shape.")
    used.add(hf_name)
    reader = functools.partial(_read, ckpt, hf_name, kind, shape)
    entries.append((path, layer if model.use_repeated_layer else None, reader, shape))
  if model.tie_embeddings and "lm_head.weight" in ckpt:
    if not np.array_equal(ckpt.get("lm_head.weight"), ckpt.get("model.embed_tokens.weight")):
      raise UserError(f"the checkpoint in {directory} has an lm_head.weight that differs from "
                      "model.embed_tokens.weight but the experiment has TIE_EMBEDDINGS=True; "
                      "set TIE_EMBEDDINGS=False for a checkpoint with its own output layer.")
    used.add("lm_head.weight")
  unknown = sorted(n for n in set(ckpt.names) - used if not n.endswith("rotary_emb.inv_freq"))
  if unknown:
    raise UserError(f"the checkpoint in {directory} has tensors this model has no place for "
                    f"({', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}); check "
                    "that config.json describes the weights, or use a matching checkpoint.")
  return lazy_tree(entries)


def _read(ckpt: Any, name: str, kind: str, shape: tuple[int, ...]) -> np.ndarray:
  return np.ascontiguousarray(_to_paxlike(kind, ckpt.get(name), shape))


def export_params(params: Any, model: Any, directory: str, positions: int | None = None
                  ) -> None:
  """Writes config.json + model.safetensors that AutoModelForCausalLM.from_pretrained loads.

  positions: the source checkpoint's max_position_embeddings, kept when it is more than
  the model's MAX_SEQ_LEN (a fine-tune on short rows does not shorten Llama 3's context).
  """
  from paxlike.interop.hf_files import get_path as _get
  from paxlike.interop.hf_files import write_directory

  config = model_config(model)
  if isinstance(positions, int) and positions > config["max_position_embeddings"]:
    config["max_position_embeddings"] = positions
  tensors: dict[str, np.ndarray] = {}
  for hf_name, path, layer, kind, _ in name_map(model):
    value = np.asarray(_get(params, path), dtype=np.float32)
    if model.use_repeated_layer and layer is not None:
      value = value[layer]
    tensors[hf_name] = np.ascontiguousarray(_to_torch(kind, value))
  write_directory(directory, config, tensors)
