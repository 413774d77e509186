"""Linear projections, the feed-forward block and layer normalisation."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from paxlike.layers.platform import lowering_platform

Dtype = Any

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu,
    "gelu": jax.nn.gelu,
    "silu": jax.nn.silu,
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
    "none": lambda x: x,
}


def project(x: jax.Array, w: jax.Array, in_dims: int = 1) -> jax.Array:
  """x's last `in_dims` axes contracted with w's first ones: every dense layer's product.

  On a CPU under jaxlib 0.11 or later, with a bfloat16 or float16 x, w's
  gradient (x contracted with the output's gradient over the batch and time
  axes) is accumulated as float32 (`preferred_element_type`) and rounded once
  to w's dtype, as the plain gradient is. Left to itself, XLA's CPU compiler
  there keeps these products in bfloat16 outside its fast (YNNPACK) matmuls:
  in a scanned bfloat16 MLP's gradient on a 2-core CPU they took 2x the step
  under jaxlib 0.12 and about 6x under 0.11, and FlanT5Small's bfloat16
  train step (batch 4, `python -m benchmarks.cpu_projection` on a quiet
  machine) went from 12.1 s to 8.9 s (0.74x) under 0.12. jaxlib 0.10 keeps
  them fast itself (8.3 s), and this way its step was 1.06x slower, so it
  keeps the plain product, as do float32 and other platforms.
  """
  if (x.dtype in (jnp.bfloat16, jnp.float16) and lowering_platform() == "cpu"
      and _jaxlib_version() >= (0, 11)):
    return _project_cpu(x, w, in_dims)
  return _dot(x, w, in_dims)


@functools.cache
def _jaxlib_version() -> tuple[int, ...]:
  import jaxlib

  return tuple(int(p) for p in jaxlib.__version__.split(".")[:2])


def _dot(x: jax.Array, w: jax.Array, in_dims: int) -> jax.Array:
  contract = (tuple(range(x.ndim - in_dims, x.ndim)), tuple(range(in_dims)))
  return jax.lax.dot_general(x, w, (contract, ((), ())))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _project_cpu(x: jax.Array, w: jax.Array, in_dims: int) -> jax.Array:
  return _dot(x, w, in_dims)


def _project_cpu_fwd(x: jax.Array, w: jax.Array, in_dims: int
                     ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  return _dot(x, w, in_dims), (x, w)


def _project_cpu_bwd(in_dims: int, res: tuple[jax.Array, jax.Array], g: jax.Array
                     ) -> tuple[jax.Array, jax.Array]:
  x, w = res
  rows = x.ndim - in_dims  # x's batch and time axes, g's too
  dx = jax.lax.dot_general(g, w, ((tuple(range(rows, g.ndim)), tuple(range(in_dims, w.ndim))),
                                  ((), ())))
  dw = jax.lax.dot_general(x, g, ((tuple(range(rows)), tuple(range(rows))), ((), ())),
                           preferred_element_type=jnp.float32)
  return dx, dw.astype(w.dtype)


_project_cpu.defvjp(_project_cpu_fwd, _project_cpu_bwd)


# Pax's USE_FP8 (praxis's Fp8EinsumOp): each projection's input and kernel quantised to
# float8_e4m3 and its output's gradient to float8_e5m2, each scaled by the largest
# magnitude it had over the last AMAX_HISTORY steps (delayed scaling, flax's fp8_ops).
# The scales and histories are parameters under the projection's `fp8` scope whose
# "gradient" is their next value: the train step writes it over them (FP8_META), the
# optimizer never sees them. XLA fuses the quantise-dequantise pairs into FP8 matmuls on
# GPUs that have them (H100); elsewhere the step computes in x's dtype on the quantised
# values.
AMAX_HISTORY = 1024
# Scopes: `fp8` and `post_fp8` (a projection's), `wi_fp8`, `wi_gate_fp8`, `wo_fp8` (the
# experts' einsums, paxlike.layers.moe).
FP8_META = r"(.*/)?([a-z]+_)*fp8/(input|kernel|output_grad)_(scale|amax_history)"


class Fp8Meta(nn.Module):
  """One projection's delayed-scaling state: a scale and an amax history for each of its
  input, its kernel and its output's gradient."""

  @nn.compact
  def __call__(self) -> dict[str, tuple[jax.Array, jax.Array]]:
    def param(name: str, init: Any, size: int) -> jax.Array:
      return self.param(name, nn.with_logical_partitioning(init, (None,)), (size,), jnp.float32)

    return {which: (param(f"{which}_scale", nn.initializers.ones, 1),
                    param(f"{which}_amax_history", nn.initializers.zeros, AMAX_HISTORY))
            for which in ("input", "kernel", "output_grad")}


def fp8_product(module: nn.Module, x: jax.Array, w: jax.Array,
                product: Callable[[jax.Array, jax.Array], jax.Array],
                name: str = "fp8") -> jax.Array:
  """product(x, w) of the FP8-quantised operands, its gradient quantised too, with
  module's Fp8Meta `name` (see FP8_META)."""
  from flax.linen import fp8_ops

  meta = Fp8Meta(name=name, parent=module)()
  dtype = x.dtype
  xq = fp8_ops.in_qdq(dtype, jnp.float8_e4m3fn, x, *meta["input"])
  wq = fp8_ops.in_qdq(dtype, jnp.float8_e4m3fn, w, *meta["kernel"])
  return fp8_ops.out_qdq(dtype, jnp.float8_e5m2, product(xq, wq), *meta["output_grad"])


def fp8_project(module: nn.Module, x: jax.Array, w: jax.Array, in_dims: int = 1,
                name: str = "fp8") -> jax.Array:
  """project(x, w, in_dims) through FP8 (fp8_product)."""
  return fp8_product(module, x, w, lambda a, b: _dot(a, b, in_dims), name)


LORA_TARGETS = ("all", "attention", "mlp")
LORA_PARAM = r"(post_)?lora_[ab]"  # the last part of a LoRA adapter's parameter name
LORA_NAMES = r"(.*/)?" + LORA_PARAM  # the whole name (learner.bprop_variable_inclusion)


def lora_targets(rank: int, target_layers: str) -> tuple[int, int]:
  """(attention's rank, the feed-forward's rank) of Pax's LORA_RANK / LORA_TARGET_LAYERS."""
  if target_layers not in LORA_TARGETS:
    from paxlike.errors import UserError

    raise UserError(f"LORA_TARGET_LAYERS={target_layers!r} is not one of {list(LORA_TARGETS)}.")
  return (rank if target_layers in ("all", "attention") else 0,
          rank if target_layers in ("all", "mlp") else 0)


def lora_output(module: nn.Module, x: jax.Array, w_shape: Sequence[int], in_dims: int,
                rank: int, dtype: Dtype, prefix: str = "") -> jax.Array | None:
  """The low-rank adapter's share of x @ w (Pax's USE_LORA): (x @ lora_a) @ lora_b^T.

  As praxis's LoRA layers: lora_a [w's input size, rank] is drawn as such a
  kernel is, lora_b [w's output size, rank] starts at zero, so a fresh
  adapter leaves the layer's function unchanged; both are replicated, and
  there is no alpha scaling; the layer computes x @ w + this, which is x @
  (w + lora_a @ lora_b^T) (merge_lora). Applied to x through the two thin
  factors, never as a [in, out] product: a frozen w then needs no [in, out]
  gradient, only x's, and the adapter adds 6 x rank x (in + out) FLOPs a
  token. `in_dims` of w's leading dims are its input (2 for a [heads, dim,
  embed] output projection); `prefix` names the pair beside a module's other
  weights. rank 0: None.
  """
  if rank <= 0:
    return None
  fan_in, fan_out = math.prod(w_shape[:in_dims]), math.prod(w_shape[in_dims:])
  a = module.param(prefix + "lora_a", nn.with_logical_partitioning(
      nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal"), (None, None)),
      (fan_in, rank), jnp.float32)
  b = module.param(prefix + "lora_b", nn.with_logical_partitioning(
      nn.initializers.zeros, (None, None)), (fan_out, rank), jnp.float32)
  rows = x.shape[:x.ndim - in_dims]
  h = project(x.reshape(*rows, fan_in).astype(dtype), a.astype(dtype))
  return project(h, b.T.astype(dtype)).reshape(*rows, *w_shape[in_dims:])


def merge_lora(params: Any) -> Any:
  """params with every LoRA adapter folded into its weight and dropped.

  The weight (`w`, T5's `kernel`, or `post` beside `post_lora_a`) becomes w + lora_a @
  lora_b^T in w's shape, the function lora_output adds to it, for any
  leading layer axes (a scanned or pipelined stack's). What exports write:
  the model's function, in the weights of the same model without adapters.
  """
  if not isinstance(params, dict):
    return params
  out = {k: merge_lora(v) for k, v in params.items() if not re.fullmatch(LORA_PARAM, k)}
  for prefix in ("", "post_"):
    if prefix + "lora_a" in params:
      weight = "post" if prefix else next(k for k in ("w", "kernel") if k in out)
      a, b, w = params[prefix + "lora_a"], params[prefix + "lora_b"], out[weight]
      delta = jnp.einsum("...ir,...or->...io", jnp.asarray(a, jnp.float32),
                         jnp.asarray(b, jnp.float32))
      out[weight] = (jnp.asarray(w, jnp.float32) + delta.reshape(w.shape)).astype(w.dtype)
  return out


class Linear(nn.Module):
  """y = x @ w over x's last dim; w's shape is (in, *features). lora_rank > 0: see lora_output."""

  features: Sequence[int]
  axes: Sequence[str]  # logical names of w's dims, input dim first
  dtype: Dtype = jnp.float32
  use_bias: bool = False
  lora_rank: int = 0
  fp8: bool = False  # Pax's USE_FP8: the product in FP8 (fp8_project)

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    features = tuple(self.features)
    w = self.param("w", nn.with_logical_partitioning(
        nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal",
                                         in_axis=0, out_axis=tuple(range(1, 1 + len(features)))),
        tuple(self.axes)), (x.shape[-1], *features), jnp.float32)
    if self.fp8:
      y = fp8_project(self, x.astype(self.dtype), w.astype(self.dtype))
    else:
      y = project(x.astype(self.dtype), w.astype(self.dtype))
    adapted = lora_output(self, x, w.shape, 1, self.lora_rank, self.dtype)
    if adapted is not None:
      y = y + adapted
    if self.use_bias:
      b = self.param("b", nn.with_logical_partitioning(nn.initializers.zeros, tuple(self.axes[1:])),
                     features, jnp.float32)
      y = y + b.astype(self.dtype)
    return y


class LayerNorm(nn.Module):
  """Layer normalisation computed in float32, with scale and bias."""

  epsilon: float = 1e-6
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    d = x.shape[-1]
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                       (d,), jnp.float32)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                      (d,), jnp.float32)
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + self.epsilon) * scale + bias
    return y.astype(self.dtype)


def dropout_active(module: nn.Module, rate: float) -> bool:
  """Dropout runs only for a positive rate and when the caller passed a 'dropout' rng."""
  return rate > 0.0 and module.has_rng("dropout")


class FeedForward(nn.Module):
  """Two projections with an activation between: embed -> hidden -> embed.

  use_gated_activation (Pax's USE_GATED_ACTIVATION): the hidden layer is
  act(x @ ffn1_gate + b) * (x @ ffn1 + b), a third [embed, hidden] matrix.
  dropout_rate drops hidden activations while training (Pax's relu dropout).
  """

  hidden_dims: int
  activation: str = "relu"
  dtype: Dtype = jnp.float32
  use_gated_activation: bool = False
  dropout_rate: float = 0.0
  has_bias: bool = True  # praxis's TransformerFeedForward.has_bias
  lora_rank: int = 0  # each projection's LoRA adapter (lora_output)
  fp8: bool = False  # each projection in FP8 (Linear.fp8)

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    d = x.shape[-1]
    bias, r, f = self.has_bias, self.lora_rank, self.fp8
    h = Linear((self.hidden_dims,), ("embed", "mlp"), self.dtype, use_bias=bias, lora_rank=r,
               fp8=f, name="ffn1")(x)
    if self.use_gated_activation:
      gate = Linear((self.hidden_dims,), ("embed", "mlp"), self.dtype, use_bias=bias,
                    lora_rank=r, fp8=f, name="ffn1_gate")(x)
      h = ACTIVATIONS[self.activation](gate) * h
    else:
      h = ACTIVATIONS[self.activation](h)
    h = nn.Dropout(self.dropout_rate)(h, deterministic=not dropout_active(self, self.dropout_rate))
    h = nn.with_logical_constraint(h, ("batch", "length", "activation_mlp"))
    h = checkpoint_name(h, "ffn1")
    y = Linear((d,), ("mlp", "embed"), self.dtype, use_bias=bias, lora_rank=r, fp8=f,
               name="ffn2")(h)
    return checkpoint_name(y, "ffn2")
