"""Model FLOPs of the Transformer LM, device peaks, and MFU.

Model FLOPs per token (PaLM's definition, rematerialisation excluded):

    6 * N  +  6 * L * S * D_attn

where N counts every weight matrix a token passes through (embedding/softmax
table included, since the shared table is a real matmul for the logits;
norms and biases excluded), L is the layer count, S the sequence length and
D_attn = heads x dims_per_head. The attention term is 12·L·S·D_attn halved
for the causal mask: on average each query attends to S/2 keys, which is what
the work actually needs (MaxText's convention; Levanter does not halve).
The factor 6 is 2 (multiply-add) x 3 (forward + two backward matmuls).
"""

from __future__ import annotations

import dataclasses

# Peak dense FLOP/s per chip by device kind substring and dtype (vendor figures).
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "TPU v4": {"bfloat16": 275e12, "float32": 275e12 / 2},
    "TPU v5 lite": {"bfloat16": 197e12, "float32": 197e12 / 2},
    "TPU v5e": {"bfloat16": 197e12, "float32": 197e12 / 2},
    "TPU v5p": {"bfloat16": 459e12, "float32": 459e12 / 2},
    "TPU v5": {"bfloat16": 459e12, "float32": 459e12 / 2},
    "TPU v6": {"bfloat16": 918e12, "float32": 918e12 / 2},
    "A100": {"bfloat16": 312e12, "float32": 19.5e12, "tf32": 156e12},
    "H100": {"bfloat16": 989e12, "float32": 67e12, "tf32": 494e12},
    "H200": {"bfloat16": 989e12, "float32": 67e12, "tf32": 494e12},
}


@dataclasses.dataclass(frozen=True)
class LmDims:
  num_layers: int
  model_dims: int
  hidden_dims: int
  num_heads: int
  dims_per_head: int
  vocab_size: int
  seq_len: int


def matmul_params(d: LmDims) -> int:
  """Weights a token's matmuls touch: per layer QKV + output + two FFN, plus the table."""
  attn = 4 * d.model_dims * d.num_heads * d.dims_per_head
  ffn = 2 * d.model_dims * d.hidden_dims
  return d.num_layers * (attn + ffn) + d.vocab_size * d.model_dims


def model_flops_per_token(d: LmDims, causal_halving: bool = True) -> float:
  attn = 12 * d.num_layers * d.seq_len * d.num_heads * d.dims_per_head
  if causal_halving:
    attn //= 2
  return 6 * matmul_params(d) + attn


def model_flops_per_step(d: LmDims, global_batch: int, causal_halving: bool = True) -> float:
  return model_flops_per_token(d, causal_halving) * global_batch * d.seq_len


def peak_flops_per_device(device_kind: str, dtype: str = "bfloat16") -> float | None:
  """The table's peak for a device kind (longest matching key), or None."""
  for key in sorted(PEAK_FLOPS, key=len, reverse=True):
    if key.lower() in device_kind.lower():
      table = PEAK_FLOPS[key]
      return table.get(dtype, table.get("bfloat16"))
  return None


def mfu(model_flops_per_step: float, step_seconds: float, num_devices: int,
        peak_per_device: float) -> float:
  return model_flops_per_step / step_seconds / (num_devices * peak_per_device)
