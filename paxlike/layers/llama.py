"""Llama-family layers: RMSNorm, rotary positions (Llama 3.1 scaling), GQA, SwiGLU.

Parameter names follow Hugging Face's LlamaDecoderLayer (input_layernorm,
self_attn/{q,k,v,o}_proj, post_attention_layernorm, mlp/{gate,up,down}_proj)
so paxlike.interop.hf_llama maps checkpoints one to one. Kernels are laid
out [in, ...out] with logical axis names; the mesh rules shard them.

A layer runs in one of three modes (the T5 layers' names): FULL (training,
eval: the whole sequence, positions and segment ids from the batch), PREFILL
(FULL over the prompt buffer, storing each layer's keys/values) and EXTEND
(one new position at `index`, attending to the cached ones). The cache holds
only the num_kv_heads key/value heads; they are repeated to the query heads
inside the attention call only.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from paxlike.errors import UserError
from paxlike.layers.attention import (
  apply_rope,
  cached_attention,
  dot_product_attention,
  use_kv_cache,
)
from paxlike.layers.linear import Linear, lora_output, lora_targets, project
from paxlike.layers.norms import RmsNorm
from paxlike.layers.platform import lowering_platform

Dtype = Any

FULL, PREFILL, EXTEND = "full", "prefill", "extend"
ROPE_TYPES = ("default", "llama3")
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
EMBED_AXES = ("batch", "length", "activation_embed")


def rope_type(rope_scaling: dict[str, Any] | None) -> str:
  """The scaling's rope_type ("default" for None); raises UserError for one paxlike lacks."""
  if not rope_scaling:
    return "default"
  kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
  if kind not in ROPE_TYPES:
    raise UserError(f"rope_scaling rope_type={kind!r} is not supported; paxlike models "
                    f"{', '.join(ROPE_TYPES)} rotary embeddings only.")
  missing = [k for k in LLAMA3_KEYS if kind == "llama3" and k not in rope_scaling]
  if missing:
    raise UserError(f"rope_scaling of rope_type 'llama3' needs {', '.join(missing)}; give "
                    f"all of {', '.join(LLAMA3_KEYS)}.")
  return kind


def rope_inv_freq(head_dim: int, theta: float,
                  rope_scaling: dict[str, Any] | None = None) -> np.ndarray:
  """[head_dim // 2] float32 inverse frequencies, with Llama 3.1's scaling when asked.

  llama3: wavelengths longer than original_max_position_embeddings /
  low_freq_factor are divided by `factor`, those shorter than ... /
  high_freq_factor are kept, and the band between is interpolated smoothly.
  """
  inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32)
                         / head_dim))
  inv = inv.astype(np.float32)
  if rope_type(rope_scaling) == "default":
    return inv
  factor = float(rope_scaling["factor"])
  low, high = float(rope_scaling["low_freq_factor"]), float(rope_scaling["high_freq_factor"])
  old_len = float(rope_scaling["original_max_position_embeddings"])
  wavelen = 2 * math.pi / inv
  scaled = np.where(wavelen > old_len / low, inv / factor, inv)
  smooth = (old_len / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
  return np.where(medium, smoothed, scaled).astype(np.float32)


class GqaAttention(nn.Module):
  """Grouped-query self-attention with rotary positions and an optional KV cache."""

  num_heads: int
  num_kv_heads: int
  head_dim: int
  inv_freq: tuple[float, ...]
  qkv_bias: bool = False
  dtype: Dtype = jnp.float32
  mode: str = FULL
  lora_rank: int = 0  # adapters on q/k/v/o_proj (paxlike.layers.linear.lora_output)

  @nn.compact
  def __call__(self, x: jax.Array, inputs: dict[str, Any]) -> jax.Array:
    n, kv, h = self.num_heads, self.num_kv_heads, self.head_dim
    proj = lambda heads, name: Linear((heads, h), ("embed", "heads", "kv"), self.dtype,
                                      self.qkv_bias, self.lora_rank, name=name)(x)
    # The projections carry Pax's names, which CHECKPOINT_POLICY=SAVE_QKV_OUT_PROJ saves.
    q = checkpoint_name(proj(n, "q_proj"), "query_proj")
    k = checkpoint_name(proj(kv, "k_proj"), "key_proj")
    v = checkpoint_name(proj(kv, "v_proj"), "value_proj")
    inv_freq = np.asarray(self.inv_freq, np.float32)
    q = apply_rope(q, inputs["positions"], inv_freq)
    k = apply_rope(k, inputs["positions"], inv_freq)
    segments = inputs.get("segment_ids")
    if self.mode == EXTEND:
      k, v, mask = use_kv_cache(self, k, v, EXTEND, inputs["index"])
      context = cached_attention(q, k, v, mask=mask, scale=h ** -0.5)
    else:
      if self.mode == PREFILL:
        use_kv_cache(self, k, v, PREFILL)
      if kv != n:  # the attention function takes equal heads: repeat inside this call only
        k, v = jnp.repeat(k, n // kv, axis=2), jnp.repeat(v, n // kv, axis=2)
      context = dot_product_attention(q, k, v, is_causal=True, q_segment_ids=segments,
                                      kv_segment_ids=segments, scale=h ** -0.5)
    context = nn.with_logical_constraint(context, ("batch", "length", "activation_heads", "kv"))
    context = checkpoint_name(context, "context")
    # o_proj's kernel is [heads, head_dim, embed] (HF's [embed, heads * head_dim], transposed).
    out = _HeadsOut(x.shape[-1], self.dtype, self.lora_rank, name="o_proj")(context)
    return checkpoint_name(out, "out_proj")


class _HeadsOut(nn.Module):
  """[B, T, heads, head_dim] -> [B, T, embed] through a [heads, head_dim, embed] kernel."""

  features: int
  dtype: Dtype = jnp.float32
  lora_rank: int = 0

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    w = self.param("w", nn.with_logical_partitioning(
        nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal",
                                         in_axis=(0, 1), out_axis=2),
        ("heads", "kv", "embed")), (*x.shape[-2:], self.features), jnp.float32)
    y = project(x.astype(self.dtype), w.astype(self.dtype), 2)
    adapted = lora_output(self, x, w.shape, 2, self.lora_rank, self.dtype)
    return y if adapted is None else y + adapted


@jax.custom_vjp
def _logits_cpu(x: jax.Array, w: jax.Array) -> jax.Array:
  """x [..., embed] @ w [embed, vocab]; its w-gradient is x^T @ g on x's transpose (VocabHead)."""
  return jax.lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())))


def _logits_cpu_fwd(x: jax.Array, w: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  return _logits_cpu(x, w), (x, w)


def _logits_cpu_bwd(res: tuple[jax.Array, jax.Array], g: jax.Array
                    ) -> tuple[jax.Array, jax.Array]:
  x, w = res
  dx = jax.lax.dot_general(g, w, (((g.ndim - 1,), (1,)), ((), ())))
  x_t = jax.lax.optimization_barrier(x.reshape(-1, x.shape[-1]).T)  # [embed, tokens]
  return dx, x_t @ g.reshape(-1, g.shape[-1])


_logits_cpu.defvjp(_logits_cpu_fwd, _logits_cpu_bwd)


class VocabHead(nn.Module):
  """[B, T, embed] -> [B, T, vocab] logits through an [embed, vocab] kernel `w` (lm_head).

  The kernel keeps Linear's layout, initializer and name (HF's lm_head.weight,
  transposed), and the logits are Linear's product. On a CPU the kernel's
  gradient is x^T @ g with x's transpose [embed, tokens] made first (x is the
  small operand): left to itself, XLA's CPU compiler copies the [tokens,
  vocab] logit gradient g transposed and multiplies two transposed operands,
  outside its fast matmul path. On a loaded 2-core CPU at the shape of
  `python -m benchmarks.llama_step` (D512, V8192, 2048 tokens, float32) the
  head's forward and backward took 1.68 CPU s that way, 0.93 s this way (the
  Pax LM's [vocab, embed] table: 1.34 s), and the whole Llama step went from
  about 1.08x the Pax LM's to about 1.0x. The same sums, in another order;
  GPUs and TPUs transpose inside the matmul and keep the plain gradient.
  """

  vocab_size: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    w = self.param("w", nn.with_logical_partitioning(
        nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=0,
                                         out_axis=(1,)),
        ("embed", "vocab")), (x.shape[-1], self.vocab_size), jnp.float32).astype(self.dtype)
    x = x.astype(self.dtype)
    if lowering_platform() == "cpu":
      return _logits_cpu(x, w)
    return jax.lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())))


class SwiGlu(nn.Module):
  """down(silu(gate(x)) * up(x))."""

  hidden_dims: int
  dtype: Dtype = jnp.float32
  lora_rank: int = 0  # adapters on gate/up/down_proj

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    r = self.lora_rank
    gate = Linear((self.hidden_dims,), ("embed", "mlp"), self.dtype, lora_rank=r,
                  name="gate_proj")(x)
    up = Linear((self.hidden_dims,), ("embed", "mlp"), self.dtype, lora_rank=r, name="up_proj")(x)
    h = jax.nn.silu(gate) * up
    h = nn.with_logical_constraint(h, ("batch", "length", "activation_mlp"))
    h = checkpoint_name(h, "ffn1")
    y = Linear((x.shape[-1],), ("mlp", "embed"), self.dtype, lora_rank=r, name="down_proj")(h)
    return checkpoint_name(y, "ffn2")


class LlamaDecoderLayer(nn.Module):
  """x + attn(norm(x)), then x + mlp(norm(x)); returns (x, None) for nn.scan."""

  num_heads: int
  num_kv_heads: int
  head_dim: int
  hidden_dims: int
  inv_freq: tuple[float, ...]
  qkv_bias: bool = False
  norm_epsilon: float = 1e-5
  dtype: Dtype = jnp.float32
  mode: str = FULL
  lora_rank: int = 0  # Pax's LORA_RANK / LORA_TARGET_LAYERS (USE_LORA)
  lora_target_layers: str = "all"

  @nn.compact
  def __call__(self, x: jax.Array, inputs: dict[str, Any]) -> tuple[jax.Array, None]:
    atten_rank, mlp_rank = lora_targets(self.lora_rank, self.lora_target_layers)
    h = RmsNorm(self.norm_epsilon, self.dtype, name="input_layernorm")(x)
    x = x + GqaAttention(self.num_heads, self.num_kv_heads, self.head_dim, self.inv_freq,
                         self.qkv_bias, self.dtype, self.mode, atten_rank,
                         name="self_attn")(h, inputs)
    x = nn.with_logical_constraint(x, EMBED_AXES)
    h = RmsNorm(self.norm_epsilon, self.dtype, name="post_attention_layernorm")(x)
    x = x + SwiGlu(self.hidden_dims, self.dtype, mlp_rank, name="mlp")(h)
    return nn.with_logical_constraint(x, EMBED_AXES), None
