"""Model FLOPs of paxlike's model families, device peaks, and MFU.

Each model family answers `model_flops_per_step(specs)` from the formulas
here (paxlike.models.base). Decoder-only LM, model FLOPs per token (PaLM's
definition, rematerialisation excluded):

    6 * N  +  6 * L * S * D_attn

where N counts every weight matrix a token passes through (embedding/softmax
table included, since the shared table is a real matmul for the logits; a
gated FFN's third matrix included; a separate input table and a trainable
position table excluded, being gathers; norms and biases excluded), L is the
layer count, S the sequence length and
D_attn = heads x dims_per_head. The attention term is 12·L·S·D_attn halved
for the causal mask: on average each query attends to S/2 keys, which is what
the work actually needs (MaxText's convention; Levanter does not halve).
The factor 6 is 2 (multiply-add) x 3 (forward + two backward matmuls).
Encoder-decoder (T5): see enc_dec_flops_per_example; the same 6 x weights
plus attention, counted per encoder and per decoder position.

MFU = model FLOPs per step x steps/s / devices / peak FLOP/s per device.
HFU uses the compiled step's hardware FLOPs instead (see HardwareFlops:
XLA's cost analysis, corrected for loop bodies it counts once; remat
included). The peak comes from --peak_tflops_per_device, the table below,
or on a CPU a matmul calibration (resolve_peak).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from paxlike.errors import counted

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
  """A decoder-only LM's shape, as its FLOPs and parameter count need it."""

  num_layers: int
  model_dims: int
  hidden_dims: int
  num_heads: int
  dims_per_head: int
  vocab_size: int  # the real vocabulary (a table padded for the mesh is counted at this size)
  seq_len: int
  gated: bool = False  # USE_GATED_ACTIVATION: a third [model, hidden] FFN matrix
  separate_embedding: bool = False  # SEPARATE_EMBEDDING: a second [vocab, model] table
  use_bias: bool = False  # USE_BIAS: q/k/v and output projection biases
  position_table_len: int = 0  # TRAINABLE_POSITION_EMB: TRAINABLE_PE_MAX_SEQ_LEN rows
  norms_per_sublayer: int = 1  # 2 for NORM_POLICY 'primer_hybrid'
  softmax_bias: bool = True  # Pax's softmax adds a [vocab] bias (off in Pax's GPT-3)
  per_dim_scale: bool = True  # Pax's [dims_per_head] query scale per layer (off in GPT-3)
  num_kv_heads: int | None = None  # grouped-query attention: k and v have these heads
  ffn_bias: bool = True  # praxis's TransformerFeedForward.has_bias
  norm_bias: bool = True  # False for RmsNorm (a scale only)
  adapter_params: int = 0  # USE_LORA: lora_adapter_params; the other weights are frozen
  # Mixture of experts: moe_layers of the layers have num_experts experts of moe_hidden_dims
  # (2 or 3 bias-free matrices: moe_gated) and a [model, experts] router; a token runs
  # through 2 experts (top-2 routing).
  moe_layers: int = 0
  num_experts: int = 0
  moe_hidden_dims: int = 0
  moe_gated: bool = False
  relpos_buckets: int = 0  # a relative position bias per layer: [buckets, heads] (GLaM)


def ffn_matrices(d: LmDims) -> int:
  return 3 if d.gated else 2


def _kv_heads(d: LmDims) -> int:
  return d.num_kv_heads or d.num_heads


def _expert_matrices(d: LmDims) -> int:
  """One expert's weights."""
  return (3 if d.moe_gated else 2) * d.model_dims * d.moe_hidden_dims


def matmul_params(d: LmDims) -> int:
  """Weights a token's matmuls touch: per layer QKV + output + the FFN's (in an MoE layer:
  the router's and its two experts'), plus the softmax."""
  attn = (2 * d.num_heads + 2 * _kv_heads(d)) * d.model_dims * d.dims_per_head
  ffn = ffn_matrices(d) * d.model_dims * d.hidden_dims
  moe = d.model_dims * d.num_experts + 2 * _expert_matrices(d)
  dense = d.num_layers - d.moe_layers
  return d.num_layers * attn + dense * ffn + d.moe_layers * moe + d.vocab_size * d.model_dims


def param_count(d: LmDims) -> int:
  """Every parameter of the LM at its real vocabulary size (Pax's count).

  Per layer: q, k, v, output (4 x model x heads x dim), their biases with
  use_bias (3 x heads x dim + model); the FFN's matrices (2 or 3 x model x
  hidden) and biases (1 or 2 x hidden, + model); LayerNorms with scale and bias
  (2 x model each; two per layer, four with primer_hybrid); the per-dim query
  scale (dims_per_head). Then the final LayerNorm, the softmax table
  (vocab x model) and its bias (vocab), a separate input table, and a
  trainable position table (position_table_len x model). A relative position
  bias adds relpos_buckets x heads per layer. An MoE layer has,
  instead of the FFN, a [model, experts] router and experts x its bias-free
  matrices.
  """
  m, a = d.model_dims, d.num_heads * d.dims_per_head
  kv = _kv_heads(d) * d.dims_per_head
  attn = (2 * m * (a + kv) + ((a + 2 * kv + m) if d.use_bias else 0)
          + (d.dims_per_head if d.per_dim_scale else 0) + d.relpos_buckets * d.num_heads)
  ffn = ffn_matrices(d) * m * d.hidden_dims
  if d.ffn_bias:
    ffn += (ffn_matrices(d) - 1) * d.hidden_dims + m
  moe = m * d.num_experts + d.num_experts * _expert_matrices(d)  # router and experts
  per_norm = 2 * m if d.norm_bias else m
  norms = 2 * d.norms_per_sublayer * per_norm
  tables = ((2 if d.separate_embedding else 1) * d.vocab_size * m + d.position_table_len * m
            + (d.vocab_size if d.softmax_bias else 0))
  return (d.num_layers * (attn + norms) + (d.num_layers - d.moe_layers) * ffn
          + d.moe_layers * moe + per_norm + tables)


def model_flops_per_token(d: LmDims, causal_halving: bool = True) -> float:
  attn = 12 * d.num_layers * d.seq_len * d.num_heads * d.dims_per_head
  if causal_halving:
    attn //= 2
  return weight_flops(matmul_params(d), d.adapter_params) + attn


def weight_flops(weights: int, adapter_params: int = 0) -> float:
  """The weights' matmul FLOPs, forward and backward, of a token (or of an example, with
  weights and adapter_params summed over its positions).

  6 per weight: its product, the input's gradient and its own gradient. With
  LoRA adapters (adapter_params > 0, USE_LORA) every other weight is frozen
  and needs no gradient of its own: 4 per frozen weight, and 6 per adapter
  weight (paxlike.layers.linear.lora_output applies the two factors in turn).
  """
  if adapter_params:
    return 4.0 * weights + 6.0 * adapter_params
  return 6.0 * weights


def lora_adapter_params(rank: int, target_layers: str, model_dims: int, q_width: int,
                        kv_width: int, hidden_dims: int, ffn_matrices: int,
                        combine_qkv: bool = False) -> int:
  """One layer's adapter weights: rank x (in + out) per adapted projection.

  'attention' adapts q, k, v (or the combined qkv) and the output projection
  (widths q_width = heads x dim, kv_width = kv heads x dim); 'mlp' the
  feed-forward's ffn_matrices [model, hidden] projections; 'all' both.
  """
  total = 0
  if target_layers in ("all", "attention"):
    qkv = ([model_dims + q_width + 2 * kv_width] if combine_qkv
           else [model_dims + q_width, model_dims + kv_width, model_dims + kv_width])
    total += sum(qkv) + q_width + model_dims
  if target_layers in ("all", "mlp"):
    total += ffn_matrices * (model_dims + hidden_dims)
  return rank * total


def model_flops_per_step(d: LmDims, global_batch: int, causal_halving: bool = True) -> float:
  return model_flops_per_token(d, causal_halving) * global_batch * d.seq_len


@dataclasses.dataclass(frozen=True)
class EncDecDims:
  """An encoder-decoder Transformer (T5) for its model FLOPs."""

  num_encoder_layers: int
  num_decoder_layers: int
  model_dims: int
  hidden_dims: int
  num_heads: int
  dims_per_head: int
  vocab_size: int
  input_len: int  # encoder positions per example
  target_len: int  # decoder positions per example
  gated: bool = True  # gated FFN (wi_0, wi_1, wo): three matrices instead of two
  lora_rank: int = 0  # USE_LORA: adapters of this rank; the other weights are frozen
  lora_target_layers: str = "all"


def enc_dec_flops_per_example(d: EncDecDims) -> float:
  """Model FLOPs of one (input, target) example, forward and backward.

  With A = heads x dims_per_head, F = FFN matrices x model_dims x hidden_dims,
  S input and T target positions:

      6 * [ S * (L_enc * (4*d*A + F) + L_dec * 2*d*A)     encoder; cross-attention k, v
          + T * (L_dec * (4*d*A + 2*d*A + F) + d*V) ]     decoder self q,k,v,o; cross q,o;
                                                          FFN; output projection
      + 12 * L_enc * S*S * A                              bidirectional self-attention
      +  6 * L_dec * T*T * A                              causal self-attention (halved)
      + 12 * L_dec * T*S * A                              cross-attention

  The token embedding is a gather, not a matmul, so it is not counted; a
  tied output projection is counted once, as the matmul it is. LoRA runs
  count their weights as weight_flops does.
  """
  a = d.num_heads * d.dims_per_head
  f = (3 if d.gated else 2) * d.model_dims * d.hidden_dims
  s, t = d.input_len, d.target_len
  weights = (s * (d.num_encoder_layers * (4 * d.model_dims * a + f)
                  + d.num_decoder_layers * 2 * d.model_dims * a)
             + t * (d.num_decoder_layers * (6 * d.model_dims * a + f)
                    + d.model_dims * d.vocab_size))
  attention = (12 * d.num_encoder_layers * s * s * a + 6 * d.num_decoder_layers * t * t * a
               + 12 * d.num_decoder_layers * t * s * a)
  return weight_flops(weights, _enc_dec_adapters(d, s, t)) + attention


def _enc_dec_adapters(d: EncDecDims, s: int, t: int) -> int:
  """The adapter weights an example's positions pass through (LoRA; 0 without): per
  encoder position its layers' and the decoder's cross-attention k and v adapters, per
  decoder position its self-attention's, cross q and out, and feed-forward's."""
  if not d.lora_rank:
    return 0
  attn = d.lora_target_layers in ("all", "attention")
  mlp = d.lora_target_layers in ("all", "mlp")
  proj = d.lora_rank * (d.model_dims + d.num_heads * d.dims_per_head) if attn else 0
  ffn = d.lora_rank * (3 if d.gated else 2) * (d.model_dims + d.hidden_dims) if mlp else 0
  return (s * (d.num_encoder_layers * (4 * proj + ffn) + d.num_decoder_layers * 2 * proj)
          + t * d.num_decoder_layers * (6 * proj + ffn))


def enc_dec_flops_per_step(d: EncDecDims, global_batch: int) -> float:
  return enc_dec_flops_per_example(d) * global_batch


@dataclasses.dataclass(frozen=True)
class LlamaDims:
  """A Llama-family decoder (grouped-query attention, SwiGLU) for its model FLOPs."""

  num_layers: int
  model_dims: int
  hidden_dims: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  vocab_size: int
  seq_len: int
  adapter_params: int = 0  # USE_LORA: lora_adapter_params; the other weights are frozen
  # Mixture of experts: moe_layers of the layers have num_experts experts of moe_hidden_dims
  # (2 or 3 bias-free matrices: moe_gated) and a [model, experts] router; a token runs
  # through 2 experts (top-2 routing).
  moe_layers: int = 0
  num_experts: int = 0
  moe_hidden_dims: int = 0
  moe_gated: bool = False


def llama_flops_per_token(d: LlamaDims) -> float:
  """Model FLOPs per token, forward and backward (the LM's convention, causal halving).

      6 * [ L * (2*d*n*h + 2*d*kv*h + 3*d*F) + d*V ]   q and o; k and v over the KV heads;
                                                       gate, up, down; the output projection
      + 6 * L * S * n*h                                causal attention (QK and PV, halved)

  Grouped-query attention shrinks only the k/v projections: every query head
  still attends over S keys. The embedding is a gather and not counted. LoRA
  runs count their weights as weight_flops does.
  """
  n_h, kv_h = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
  per_layer = 2 * d.model_dims * n_h + 2 * d.model_dims * kv_h + 3 * d.model_dims * d.hidden_dims
  weights = d.num_layers * per_layer + d.model_dims * d.vocab_size
  return weight_flops(weights, d.adapter_params) + 6.0 * d.num_layers * d.seq_len * n_h


def llama_flops_per_step(d: LlamaDims, global_batch: int) -> float:
  return llama_flops_per_token(d) * global_batch * d.seq_len


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


# ------------------------------------------------------------ pipelines


def pipeline_schedule(model: Any, rows: int) -> dict[str, Any] | None:
  """A pipelined model's schedule for a step of `rows` rows, or None without a pipeline.

  Read off the model's layout() (a model whose layout has no stages is not
  pipelined) and its pipeline fields (num_microbatches or microbatch_size,
  stream_io). `rows`: the rows one forward pass gets (the global batch
  over the gradient-accumulation steps). The bubble is each stage's idle
  share of the schedule's iterations, (S-1) / (M x R + S - 1): it is in the
  step time, and so in MFU, which counts model FLOPs only (the same as the
  unpipelined model's), never the idle stages' work.
  """
  layout = model.layout()
  if layout is None or layout.num_stages is None:
    return None
  from paxlike.layers import pipeline
  from paxlike.layers.transformer import rematerialises

  stages = layout.num_stages
  m, size = pipeline.microbatch_sizes(rows, model.num_microbatches, model.microbatch_size)
  r = layout.circular_repeat
  return {"schedule": "circular" if r > 1 else "gpipe", "stages": stages, "microbatches": m,
          "microbatch_size": size, "circular_repeat": r,
          "layers_per_stage": layout.layers_per_stage, "stream_io": bool(model.stream_io),
          "scanned_stage": layout.use_repeated_layer,
          "iteration_remat": rematerialises(model.checkpoint_policy),
          "layer_remat": rematerialises(layout.stage_policy(model.checkpoint_policy)),
          "iterations": pipeline.iterations(stages, m, r),
          "bubble_fraction": pipeline.bubble_fraction(stages, m, r)}


def stages_text(rec: dict[str, Any]) -> str:
  """'S stages x L layers (scanned, each layer rematerialised)' for a pipeline_schedule record."""
  form = "scanned" if rec["scanned_stage"] else "unrolled"
  if rec["layer_remat"]:
    form += ", each layer rematerialised"
  return f"{rec['stages']} stages x {counted(rec['layers_per_stage'], 'layer')} ({form})"


def microbatches_text(rec: dict[str, Any]) -> str:
  """'M microbatches of R rows' for a pipeline_schedule record."""
  return (f"{counted(rec['microbatches'], 'microbatch', 'microbatches')} of "
          f"{counted(rec['microbatch_size'], 'row')}")


def schedule_name(rec: dict[str, Any]) -> str:
  """A pipeline_schedule record's schedule: "GPipe" or "circular (repeat R)"."""
  return "GPipe" if rec["schedule"] == "gpipe" else f"circular (repeat {rec['circular_repeat']})"


def describe_pipeline(rec: dict[str, Any]) -> str:
  """One line for a pipeline_schedule record: the schedule, its bubble, and what MFU counts."""
  return (f"pipeline: {schedule_name(rec)}, {stages_text(rec)}, "
          f"{microbatches_text(rec)}, "
          f"{rec['iterations']} iterations, bubble {100 * rec['bubble_fraction']:.1f}%"
          f"{', stream_io' if rec['stream_io'] else ''}; MFU counts model FLOPs only, so the "
          "bubble is included in it (shows as lower MFU), not hidden")


# ---------------------------------------------------------- hardware FLOPs


def _sub_jaxprs(eqn: Any) -> list[Any]:
  out = []
  for value in eqn.params.values():
    for v in value if isinstance(value, tuple | list) else (value,):
      if hasattr(v, "eqns"):
        out.append(v)
      elif hasattr(v, "jaxpr") and hasattr(v.jaxpr, "eqns"):
        out.append(v.jaxpr)
  return out


def jaxpr_matmul_flops(jaxpr: Any, unroll_loops: bool = True) -> float:
  """2 x multiply-adds of every dot_general in a (closed) jaxpr, globally.

  Scan bodies count `length` times (once with unroll_loops=False, which is
  what XLA's cost analysis does with a while loop); a shard_map (or pmap)
  body once per shard; cond its most expensive branch; while loops, whose
  trip count is unknown here, once.
  """
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      (lhs_contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      out = eqn.outvars[0].aval.shape
      total += 2.0 * math.prod(out) * math.prod(lhs[i] for i in lhs_contract)
      continue
    subs = [jaxpr_matmul_flops(s, unroll_loops) for s in _sub_jaxprs(eqn)]
    if not subs:
      continue
    if name == "cond":
      total += max(subs)
      continue
    times = 1
    if name == "scan" and unroll_loops:
      times = eqn.params["length"]
    elif name == "xla_pmap":
      times = eqn.params["axis_size"]
    elif name == "shard_map":  # the body is one shard's program (pmap is built on it)
      mesh = eqn.params["mesh"]
      axes = (eqn.params.get("newly_manual_axes") or eqn.params.get("manual_axes")
              or mesh.axis_names)
      times = math.prod(dict(mesh.shape)[a] for a in axes)
    total += times * sum(subs)
  return total


@dataclasses.dataclass(frozen=True)
class HardwareFlops:
  """FLOPs one train step makes the devices do, all devices together.

  XLA's cost analysis of the compiled (per-device) step, times the device
  count, counts a while loop's body once, so a scanned layer stack is
  counted as one layer; `loop_correction` adds the matmul FLOPs of the other
  iterations, counted from the step's jaxpr. Rematerialised forward passes
  are included: these are hardware FLOPs (HFU), not model FLOPs (MFU).
  """

  xla_flops: float  # cost_analysis()["flops"] x devices
  loop_correction: float  # (trips - 1) x loop-body matmul FLOPs
  jaxpr_matmul_flops: float  # every matmul of the step, loops unrolled

  @property
  def total(self) -> float:
    return self.xla_flops + self.loop_correction


def hardware_flops(step_fn: Any, args: tuple, num_devices: int,
                   compiled: Any = None) -> HardwareFlops | None:
  """The compiled step's FLOPs per step (see HardwareFlops), or None if unavailable.

  Args:
    step_fn: a partitioner's compiled step (with .jitted and .lower; SPMD's has .trace).
    args: (state, batch, key) of the right shapes and shardings.
    num_devices: devices the step runs on.
    compiled: the compiled executable when the caller has it; otherwise
      step_fn.lower(*args).compile(), which after the first jit dispatch is
      JAX's cached executable, not a second compilation.
  """
  import jax

  try:
    if compiled is None:
      compiled = step_fn.lower(*args).compile()
    cost = compiled.cost_analysis()
  except Exception:  # noqa: BLE001  (no cost analysis on this backend)
    return None
  if isinstance(cost, list | tuple):
    cost = cost[0] if cost else None
  if not cost or "flops" not in cost:
    return None
  # An SPMD step (.trace) is traced in its mesh context, which reuses the trace of its
  # first dispatch; make_jaxpr outside that context would trace the whole step again.
  jaxpr = (step_fn.trace(*args).jaxpr if hasattr(step_fn, "trace")
           else jax.make_jaxpr(getattr(step_fn, "jitted", step_fn))(*args))
  unrolled = jaxpr_matmul_flops(jaxpr)
  once = jaxpr_matmul_flops(jaxpr, unroll_loops=False)
  return HardwareFlops(float(cost["flops"]) * num_devices, unrolled - once, unrolled)


# -------------------------------------------------------------------- peaks


def calibrate_peak_flops(devices: list[Any], dtype: str = "float32", n: int = 512,
                         repeats: int = 8) -> float:
  """Peak FLOP/s of one device, measured with all of `devices` multiplying at once.

  Fake CPU devices share the host's cores, so each device's peak is what it
  reaches while the others work too: a [devices, n, n] batched matmul, one
  matrix per device, best of `repeats`.
  """
  import time

  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  sharding = NamedSharding(Mesh(np.asarray(devices), ("d",)), PartitionSpec("d"))
  a = jax.device_put(jnp.ones((len(devices), n, n), jnp.dtype(dtype)), sharding)
  matmul = jax.jit(lambda x: jnp.einsum("bij,bjk->bik", x, x), out_shardings=sharding)
  matmul(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    matmul(a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2.0 * n ** 3 / best


def resolve_peak(devices: list[Any], dtype: str, override_tflops: float | None = None
                 ) -> tuple[float | None, str]:
  """Peak FLOP/s per device and where it came from.

  Order: --peak_tflops_per_device; the table for the device kind; on a CPU
  (no honest table entry), a matmul calibration; otherwise none (no MFU).
  """
  from paxlike import log as logging

  kind = devices[0].device_kind
  if override_tflops:
    peak, source = override_tflops * 1e12, "--peak_tflops_per_device"
  elif peak_flops_per_device(kind, dtype):
    peak, source = peak_flops_per_device(kind, dtype), f"table: {kind} {dtype}"
  elif devices[0].platform == "cpu":
    peak = calibrate_peak_flops(devices, dtype)
    source = f"calibrated: {len(devices)}-device {dtype} matmul on {kind}"
  else:
    peak, source = None, f"no table entry for {kind!r}; pass --peak_tflops_per_device"
  logging.info("peak per device for MFU: %s (%s)",
               f"{peak / 1e12:.4g} TFLOP/s" if peak else "none", source)
  return peak, source


def measure_step(step_fn: Any, args: tuple, num_devices: int, may_compile: bool = True
                 ) -> HardwareFlops | None:
  """hardware_flops() for the trainer, logged; None (and a line saying why) when unavailable.

  may_compile=False (auto PGLE on a GPU): not measured, since the step's
  `.lower().compile()` would then be a second, ahead-of-time compilation
  beside the one JAX recompiles with the profile.
  """
  from paxlike import log as logging

  if not may_compile:
    logging.info("hfu: not measured under --pgle=auto (the cost analysis would need an "
                 "ahead-of-time compile beside the jit-dispatched step)")
    return None
  hw = hardware_flops(step_fn, args, num_devices)
  if hw is None:
    logging.info("hfu: this backend gives no cost analysis for the compiled step")
    return None
  logging.info("hardware FLOPs per step %.4g (XLA cost analysis %.4g + loop correction %.4g)",
               hw.total, hw.xla_flops, hw.loop_correction)
  return hw
