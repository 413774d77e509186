"""Writes T5X checkpoints of a Hugging Face T5 directory, in T5X's two formats (tests only).

The format follows T5X's Checkpointer (t5x/checkpoints.py, version 3): a
`checkpoint` msgpack of {"version": 3, "optimizer": {"target": params,
"state": {"step": ..., "param_states": ...}}}, where a parameter is an
array written inline or the JSON of a TensorStore spec (zarr, gzip, a
kvstore path relative to the folder, '/' replaced by '.'); a checkpoint
saved to GCS names a `gcs` kvstore with a placeholder bucket and the path
beside it. Names and layouts are T5X's T5 1.1 network (t5x/examples/t5),
as transformers' T5X conversion maps them: 2-D kernels [in, out], the
relative-position table [heads, buckets]. The Orbax format (T5X train.py's
default) holds the same {"target", "state"} tree in checkpoint_<step>/state/.
"""

from __future__ import annotations

import os
import re

import numpy as np
from flax import traverse_util

VERSION = 3
# HF T5 tensor -> T5X name (layer i as {i}); every kernel is transposed ([out, in] -> [in, out]).
_LAYER_PARTS = {
    "encoder": {"0.layer_norm": "pre_attention_layer_norm/scale",
                "0.SelfAttention": "attention", "1.layer_norm": "pre_mlp_layer_norm/scale",
                "1.DenseReluDense": "mlp"},
    "decoder": {"0.layer_norm": "pre_self_attention_layer_norm/scale",
                "0.SelfAttention": "self_attention",
                "1.layer_norm": "pre_cross_attention_layer_norm/scale",
                "1.EncDecAttention": "encoder_decoder_attention",
                "2.layer_norm": "pre_mlp_layer_norm/scale", "2.DenseReluDense": "mlp"},
}
_PROJ = {"q": "query", "k": "key", "v": "value", "o": "out"}
_BLOCK = re.compile(r"(encoder|decoder)\.block\.(\d+)\.layer\.(\d)\.(\w+)\.(?:(\w+)\.)?weight$")


def t5x_name(hf: str) -> tuple[str, bool]:
  """(T5X name, whether the tensor is transposed) of one HF T5 tensor."""
  if hf == "shared.weight":
    return "token_embedder/embedding", False
  if hf == "lm_head.weight":
    return "decoder/logits_dense/kernel", True
  if m := re.fullmatch(r"(encoder|decoder)\.final_layer_norm\.weight", hf):
    return f"{m[1]}/{m[1]}_norm/scale", False
  if m := re.fullmatch(r"(encoder|decoder)\.block\.0\.layer\.0\.SelfAttention\."
                       r"relative_attention_bias\.weight", hf):
    return f"{m[1]}/relpos_bias/rel_embedding", True  # [buckets, heads] -> [heads, buckets]
  m = _BLOCK.fullmatch(hf)
  assert m, hf
  stack, layer, sub, module, leaf = m.groups()
  if module == "layer_norm":
    return f"{stack}/layers_{layer}/{_LAYER_PARTS[stack][f'{sub}.layer_norm']}", False
  part = _LAYER_PARTS[stack][f"{sub}.{module}"]
  name = _PROJ[leaf] if module in ("SelfAttention", "EncDecAttention") else leaf
  return f"{stack}/layers_{layer}/{part}/{name}/kernel", True


def _spec(name: str, arr: np.ndarray, gcs: bool) -> dict:
  """T5X's _get_spec: zarr with gzip, the path relative to the checkpoint folder."""
  metadata = {"compressor": {"id": "gzip"}, "shape": list(arr.shape),
              "chunks": [max(1, s // 2) for s in arr.shape]}
  path = "target." + name.replace("/", ".")  # T5X names the array by its state-dict path
  if gcs:
    return {"driver": "zarr", "dtype": arr.dtype.name, "path": path, "metadata": metadata,
            "kvstore": {"driver": "gcs", "bucket": "t5x-dummy-bucket"}}
  return {"driver": "zarr", "dtype": arr.dtype.name, "metadata": metadata,
          "kvstore": {"driver": "file", "path": path}}


def _target(hf_dir: str) -> dict[str, np.ndarray]:
  """{T5X name: array in T5X's layout} of an HF T5 checkpoint."""
  from safetensors.numpy import load_file

  tensors = load_file(os.path.join(hf_dir, "model.safetensors"))
  if "lm_head.weight" not in tensors:
    tensors["lm_head.weight"] = tensors["shared.weight"]
  out = {}
  for hf, value in sorted(tensors.items()):
    name, transpose = t5x_name(hf)
    out[name] = np.ascontiguousarray(value.T if transpose else value).astype(np.float32)
  return out


def write_orbax_from_hf(hf_dir: str, model_dir: str, step: int) -> str:
  """T5X's Orbax format (train.py's default): checkpoint_<step>/state/ is an Orbax PyTree
  checkpoint of {"target": params, "state": {"step", "param_states"}}, as T5X's
  OrbaxCheckpointManagerInterface saves train_state.state_dict(). Returns the step folder."""
  import orbax.checkpoint as ocp

  target = _target(hf_dir)
  folder = os.path.join(model_dir, f"checkpoint_{step}")
  state = {"step": np.int32(step), "param_states": {"token_embedder": {"embedding": {
      "v_row": np.zeros(target["token_embedder/embedding"].shape[0], np.float32)}}}}
  tree = {"target": traverse_util.unflatten_dict(target, sep="/"), "state": state}
  ocp.PyTreeCheckpointer().save(os.path.join(folder, "state"), tree)
  return folder


def write_from_hf(hf_dir: str, model_dir: str, step: int, gcs_stack: str = "decoder") -> str:
  """A T5X model_dir holding checkpoint_<step> of the HF checkpoint's weights.

  Norm scales and the relative-position tables are written inline (small,
  unpartitioned, as T5X writes those of a single-host run); every other
  parameter as a TensorStore array, those of `gcs_stack` with a GCS-style spec
  (a checkpoint copied down from a bucket). Returns the checkpoint folder.
  """
  import tensorstore as ts
  from flax import serialization

  # As T5X registers it: a spec is stored as its JSON (lists stay lists in the msgpack).
  serialization.register_serialization_state(
      ts.Spec, ty_to_state_dict=lambda t: t.to_json(), ty_from_state_dict=lambda t, s: s,
      override=True)
  target = _target(hf_dir)
  folder = os.path.join(model_dir, f"checkpoint_{step}")
  os.makedirs(folder)
  leaves: dict = {}
  for name, arr in target.items():
    if name.endswith("/scale") or name.endswith("rel_embedding"):
      leaves[name] = arr
      continue
    spec = _spec(name, arr, gcs=name.startswith(gcs_stack + "/"))
    local = dict(spec, kvstore={"driver": "file", "path": os.path.join(
        folder, "target." + name.replace("/", "."))})
    local.pop("path", None)
    ts.open(local, create=True, open=True).result().write(arr).result()
    leaves[name] = ts.Spec(spec)
  tree = traverse_util.unflatten_dict(leaves, sep="/")
  # An Adafactor-like optimizer state beside the target: paxlike does not read it.
  state = {"step": np.int32(step),
           "param_states": {"token_embedder": {"embedding": {
               "v_row": np.zeros(target["token_embedder/embedding"].shape[0], np.float32)}}}}
  with open(os.path.join(folder, "checkpoint"), "wb") as f:
    f.write(serialization.to_bytes({"version": VERSION,
                                    "optimizer": {"target": tree, "state": state}}))
  return folder
