"""The paxlike Llama family's train step, hand-written in plain JAX + optax.

No flax, no fiddle, no paxlike: the yardstick benchmarks/train_step.py
measures paxlike.models.llama.LlamaModel against. The same math:

- a [vocab, embed] embedding gathered without scaling; tied logits use it,
  untied ones an [embed, vocab] head;
- pre-norm layers with RMSNorm in float32 (times the scale in the compute dtype);
- rotary positions (rotate-half; Llama 3.1's llama3 frequency scaling),
  computed in float32;
- grouped-query attention written as one grouped einsum (query heads
  [kv_heads, group], no repeated K/V), optional q/k/v biases, the query
  scaled by head_dim**-0.5 before the logit matmul, logits and softmax in
  float32;
- a SwiGLU MLP, a final RMSNorm, weighted cross-entropy in float32;
- remat with the same policy, `lax.scan` over stacked layers when repeated;
- clip by global norm + adamw or adafactor with Pax's schedules (reference_lm's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.ad_checkpoint import checkpoint_name

from benchmarks.reference_lm import REMAT_POLICIES, constrain, lr_schedule, optimizer
from paxlike.layers.llama import rope_inv_freq

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class LlamaRefConfig:
  """Everything the reference step depends on (model, remat, optimizer)."""

  vocab_size: int
  model_dims: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  hidden_dims: int
  tie_embeddings: bool = False
  rope_theta: float = 10000.0
  rope_scaling: Any = None
  norm_epsilon: float = 1e-5
  qkv_bias: bool = False
  dtype: Any = jnp.float32
  use_repeated_layer: bool = True
  checkpoint_policy: str = "SAVE_NOTHING"
  learning_rate: float = 1e-3
  schedule: str = "constant"
  warmup_steps: int = 0
  decay_start: int = 0
  decay_end: int = 0
  min_ratio: float = 0.1
  beta1: float = 0.9
  beta2: float = 0.99
  epsilon: float = 1e-6
  optimizer: str = "adam"  # "adam" (optax.adamw) or "adafactor" (optax.adafactor)
  weight_decay: float = 0.0
  clip_gradient_norm_to_value: float = 0.0
  mesh: Any = None
  activation_specs: Any = None


def _layer_from_paxlike(p: Params, bias: bool) -> Params:
  att, mlp = p["self_attn"], p["mlp"]
  out = {"attn_norm": p["input_layernorm"]["scale"], "mlp_norm":
         p["post_attention_layernorm"]["scale"],
         "wq": att["q_proj"]["w"], "wk": att["k_proj"]["w"], "wv": att["v_proj"]["w"],
         "wo": att["o_proj"]["w"], "w_gate": mlp["gate_proj"]["w"],
         "w_up": mlp["up_proj"]["w"], "w_down": mlp["down_proj"]["w"]}
  if bias:
    out.update(bq=att["q_proj"]["b"], bk=att["k_proj"]["b"], bv=att["v_proj"]["b"])
  return out


def params_from_paxlike(cfg: LlamaRefConfig, params: Params) -> Params:
  """LlamaModel's parameter tree -> this module's (any tree of that structure)."""
  if cfg.use_repeated_layer:
    layers = _layer_from_paxlike(params["layers"], cfg.qkv_bias)
  else:
    layers = [_layer_from_paxlike(params[f"layers_{i}"], cfg.qkv_bias)
              for i in range(cfg.num_layers)]
  out = {"embedding": params["embed_tokens"], "layers": layers,
         "final_norm": params["norm"]["scale"]}
  if not cfg.tie_embeddings:
    out["head"] = params["lm_head"]["w"]
  return out


def rms_norm(x: jax.Array, scale: jax.Array, cfg: LlamaRefConfig) -> jax.Array:
  xf = x.astype(jnp.float32)
  y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + cfg.norm_epsilon)
  return y.astype(cfg.dtype) * scale.astype(cfg.dtype)


def rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  xf = x.astype(jnp.float32)
  half = x.shape[-1] // 2
  return (xf * cos + jnp.concatenate([-xf[..., half:], xf[..., :half]], -1) * sin).astype(x.dtype)


def layer(cfg: LlamaRefConfig, x: jax.Array, p: Params, cos: jax.Array,
          sin: jax.Array) -> jax.Array:
  dt, kv, g = cfg.dtype, cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads
  b, t, _ = x.shape
  h = rms_norm(x, p["attn_norm"], cfg)
  q = jnp.einsum("btd,dnh->btnh", h, p["wq"].astype(dt))
  k = jnp.einsum("btd,dkh->btkh", h, p["wk"].astype(dt))
  v = jnp.einsum("btd,dkh->btkh", h, p["wv"].astype(dt))
  if cfg.qkv_bias:
    q, k, v = q + p["bq"].astype(dt), k + p["bk"].astype(dt), v + p["bv"].astype(dt)
  q, k = rope(q, cos, sin), rope(k, cos, sin)
  q = (q * jnp.asarray(cfg.head_dim ** -0.5, dt)).reshape(b, t, kv, g, cfg.head_dim)
  logits = jnp.einsum("btkgh,bskh->bkgts", q, k, preferred_element_type=jnp.float32)
  causal = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
  logits = jnp.where(causal, logits, -0.7 * jnp.finfo(jnp.float32).max)
  probs = jax.nn.softmax(logits, axis=-1).astype(dt)
  context = jnp.einsum("bkgts,bskh->btkgh", probs, v).reshape(b, t, cfg.num_heads, -1)
  context = checkpoint_name(constrain(cfg, context, "heads"), "context")
  out = checkpoint_name(jnp.einsum("btnh,nhd->btd", context, p["wo"].astype(dt)), "out_proj")
  x = constrain(cfg, x + out, "embed")
  h = rms_norm(x, p["mlp_norm"], cfg)
  gate = jnp.einsum("btd,df->btf", h, p["w_gate"].astype(dt))
  up = jnp.einsum("btd,df->btf", h, p["w_up"].astype(dt))
  h1 = checkpoint_name(constrain(cfg, jax.nn.silu(gate) * up, "mlp"), "ffn1")
  y = jnp.einsum("btf,fd->btd", h1, p["w_down"].astype(dt))
  return constrain(cfg, x + checkpoint_name(y, "ffn2"), "embed")


def forward(cfg: LlamaRefConfig, params: Params, ids: jax.Array) -> jax.Array:
  """ids [batch, length] -> logits [batch, length, vocab] in float32."""
  dt = cfg.dtype
  x = constrain(cfg, jnp.take(params["embedding"], ids, axis=0).astype(dt), "embed")
  inv = jnp.asarray(rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling))
  freqs = jnp.arange(ids.shape[1], dtype=jnp.float32)[:, None] * inv
  angles = jnp.concatenate([freqs, freqs], -1)[None, :, None, :]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  body = lambda x, p: layer(cfg, x, p, cos, sin)
  policy = REMAT_POLICIES[cfg.checkpoint_policy]
  remat = cfg.checkpoint_policy != "SAVE_EVERYTHING"
  if cfg.use_repeated_layer:
    if remat:
      body = jax.checkpoint(body, policy=policy, prevent_cse=False)
    x, _ = jax.lax.scan(lambda c, p: (body(c, p), None), x, params["layers"])
  else:
    if remat:
      body = jax.checkpoint(body, policy=policy, prevent_cse=True)
    for p in params["layers"]:
      x = body(x, p)
  x = rms_norm(x, params["final_norm"], cfg)
  if cfg.tie_embeddings:
    logits = jnp.einsum("btd,vd->btv", x, params["embedding"].astype(dt))
  else:
    logits = jnp.einsum("btd,dv->btv", x, params["head"].astype(dt))
  return constrain(cfg, logits, "vocab").astype(jnp.float32)


def loss_and_metrics(cfg: LlamaRefConfig, params: Params,
                     batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
  logits = forward(cfg, params, batch["ids"])
  labels, weights = batch["labels"], batch["weights"].astype(jnp.float32)
  xent = (jax.nn.logsumexp(logits, axis=-1)
          - jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0])
  total = jnp.maximum(jnp.sum(weights), 1e-8)
  loss = jnp.sum(xent * weights) / total
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return loss, {"loss": loss, "accuracy": jnp.sum(correct * weights) / total}


def init_state(cfg: LlamaRefConfig, params: Params) -> dict[str, Any]:
  return {"step": jnp.zeros((), jnp.int32), "params": params,
          "opt_state": optimizer(cfg).init(params)}


def make_train_step(cfg: LlamaRefConfig) -> Callable:
  """jit((state, batch) -> (state, metrics)), the state donated."""
  tx, schedule = optimizer(cfg), lr_schedule(cfg)

  def train_step(state: dict[str, Any], batch: dict[str, jax.Array]):
    (_, metrics), grads = jax.value_and_grad(
        lambda p: loss_and_metrics(cfg, p, batch), has_aux=True)(state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    metrics["grad_norm"] = optax.global_norm(grads)
    metrics["learning_rate"] = jnp.asarray(schedule(state["step"]), jnp.float32)
    return {"step": state["step"] + 1, "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state}, metrics

  return jax.jit(train_step, donate_argnums=(0,))
