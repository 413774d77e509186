"""The paxlike Transformer LM's train step, hand-written in plain JAX + optax.

No flax, no fiddle, no paxlike: parameters are a dict of arrays, the forward
pass is a handful of einsums, and the step is one `jax.jit` with donation.
This is the yardstick benchmarks/train_step.py measures paxlike against, so
it does the same math as paxlike.models.language_model.LanguageModel:

- one [vocab, embed] table: embeds ids scaled by sqrt(embed), scores logits;
- sinusoidal positions added to the embeddings;
- pre-LN layers (LayerNorm in float32 with scale and bias), causal attention
  with separate q/k/v [embed, heads, dim] and output [heads, dim, embed]
  weights, the query scaled by Pax's learned per-dim scale
  (softplus(theta) / (softplus(0) sqrt(dim))) or by 1/sqrt(dim), softmax in
  float32, a relu FFN with biases;
- a final LayerNorm, tied logits plus Pax's [vocab] softmax bias (when the
  model has it), weighted cross-entropy in float32;
- Pax's tanh caps on the attention and output logits when the model has them;
- remat with the same policy, `lax.scan` over stacked layers when repeated;
- clip by global norm + adamw (or optax's adafactor) with Pax's learning-rate schedules.

On a device mesh the caller places parameters and batch; `activation_specs`
pins the activations' shardings with `jax.lax.with_sharding_constraint` at
the points where paxlike's layers constrain theirs, as a hand-written SPMD
program would (without them, propagation may pick a worse layout).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.ad_checkpoint import checkpoint_name

Params = dict[str, Any]

REMAT_POLICIES: dict[str, Any] = {
    "SAVE_NOTHING": jax.checkpoint_policies.nothing_saveable,
    "SAVE_EVERYTHING": None,  # no remat at all
    "SAVE_DOT_WITH_NO_BATCH_DIM": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "SAVE_DOT_FOR_MLPERF_200B": jax.checkpoint_policies.save_only_these_names(
        "ffn1", "context", "out_proj"),
    "SAVE_CONTEXT_AND_OUT_PROJ": jax.checkpoint_policies.save_only_these_names(
        "context", "out_proj"),
}

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu, "gelu": jax.nn.gelu, "silu": jax.nn.silu,
}


@dataclasses.dataclass(frozen=True)
class RefConfig:
  """Everything the reference step depends on (model, remat, optimizer)."""

  vocab_size: int
  model_dims: int
  num_layers: int
  num_heads: int
  dim_per_head: int
  hidden_dims: int
  dtype: Any = jnp.float32
  activation: str = "relu"
  use_repeated_layer: bool = True
  checkpoint_policy: str = "SAVE_NOTHING"
  # Pax's logit caps, cap * tanh(x / cap) when positive: attention and output logits.
  atten_logit_cap: float = 0.0
  softmax_cap_logits: float = 0.0
  # Pax's defaults: a [vocab] bias on the logits; a learned [dim] query scale per layer.
  softmax_bias: bool = True
  per_dim_scale: bool = True
  # Optimizer: clip by global norm (0 = off), then adamw or adafactor.
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
  # SPMD: a jax.sharding.Mesh and PartitionSpecs of the activations, by kind:
  # "embed" [b, t, d], "heads" [b, t, n, h], "mlp" [b, t, f], "vocab" [b, t, v].
  mesh: Any = None
  activation_specs: Any = None


def constrain(cfg: RefConfig, x: jax.Array, kind: str) -> jax.Array:
  if cfg.mesh is None or not cfg.activation_specs:
    return x
  return jax.lax.with_sharding_constraint(
      x, jax.sharding.NamedSharding(cfg.mesh, cfg.activation_specs[kind]))


# ---------------------------------------------------------------- parameters


def init_params(cfg: RefConfig, key: jax.Array) -> Params:
  """Fresh float32 parameters (the same initialisers as paxlike's layers)."""
  d, n, h, f, v = (cfg.model_dims, cfg.num_heads, cfg.dim_per_head, cfg.hidden_dims,
                   cfg.vocab_size)

  def fan_in(key, shape, fan):
    # variance_scaling(1.0, "fan_in", "truncated_normal")
    std = math.sqrt(1.0 / fan) / 0.87962566103423978
    return jax.random.truncated_normal(key, -2.0, 2.0, shape, jnp.float32) * std

  def layer(key):
    k = jax.random.split(key, 6)
    extra = {"per_dim_scale": jnp.zeros((h,))} if cfg.per_dim_scale else {}
    return extra | {
        "attn_norm_scale": jnp.ones((d,)), "attn_norm_bias": jnp.zeros((d,)),
        "wq": fan_in(k[0], (d, n, h), d), "wk": fan_in(k[1], (d, n, h), d),
        "wv": fan_in(k[2], (d, n, h), d), "wo": fan_in(k[3], (n, h, d), n * h),
        "ffn_norm_scale": jnp.ones((d,)), "ffn_norm_bias": jnp.zeros((d,)),
        "w1": fan_in(k[4], (d, f), d), "b1": jnp.zeros((f,)),
        "w2": fan_in(k[5], (f, d), f), "b2": jnp.zeros((d,)),
    }

  k_embed, k_layers = jax.random.split(key)
  layer_keys = jax.random.split(k_layers, cfg.num_layers)
  if cfg.use_repeated_layer:
    layers = jax.vmap(layer)(layer_keys)
  else:
    layers = [layer(k) for k in layer_keys]
  extra = {"softmax_bias": jnp.zeros((v,))} if cfg.softmax_bias else {}
  return extra | {
      "embedding": jax.random.normal(k_embed, (v, d), jnp.float32) * d ** -0.5,
      "layers": layers,
      "final_norm_scale": jnp.ones((d,)), "final_norm_bias": jnp.zeros((d,)),
  }


def _layer_from_paxlike(p: Params) -> Params:
  att, ffn = p["attention"], p["ffn"]
  extra = {"per_dim_scale": att["per_dim_scale"]} if "per_dim_scale" in att else {}
  return extra | {
      "attn_norm_scale": p["pre_attn_norm"]["scale"], "attn_norm_bias": p["pre_attn_norm"]["bias"],
      "wq": att["query"]["w"], "wk": att["key"]["w"], "wv": att["value"]["w"], "wo": att["post"],
      "ffn_norm_scale": p["pre_ffn_norm"]["scale"], "ffn_norm_bias": p["pre_ffn_norm"]["bias"],
      "w1": ffn["ffn1"]["w"], "b1": ffn["ffn1"]["b"],
      "w2": ffn["ffn2"]["w"], "b2": ffn["ffn2"]["b"],
  }


def params_from_paxlike(cfg: RefConfig, params: Params) -> Params:
  """paxlike's LanguageModel parameter tree -> this module's (no copies, no transposes).

  Works on any tree with paxlike's structure: arrays, shardings, specs.
  """
  stack = params["transformer"]
  if cfg.use_repeated_layer:
    layers = _layer_from_paxlike(stack["repeat"])
  else:
    layers = [_layer_from_paxlike(stack[f"x_layers_{i}"]) for i in range(cfg.num_layers)]
  extra = {"softmax_bias": params["softmax"]["bias"]} if cfg.softmax_bias else {}
  return extra | {
      "embedding": params["softmax"]["embedding"],
      "layers": layers,
      "final_norm_scale": params["final_norm"]["scale"],
      "final_norm_bias": params["final_norm"]["bias"],
  }


# ------------------------------------------------------------------- forward


def sinusoidal_positions(length: int, dims: int, max_timescale: float = 1.0e4) -> jax.Array:
  pos = jnp.arange(length, dtype=jnp.float32)
  half = dims // 2
  log_inc = np.log(max_timescale) / max(half - 1, 1)
  inv = jnp.exp(jnp.arange(half, dtype=jnp.float32) * -log_inc)
  scaled = pos[:, None] * inv[None, :]
  emb = jnp.concatenate([jnp.sin(scaled), jnp.cos(scaled)], axis=1)
  if dims % 2:
    emb = jnp.pad(emb, ((0, 0), (0, 1)))
  return emb


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, dtype: Any,
               eps: float = 1e-6) -> jax.Array:
  xf = x.astype(jnp.float32)
  mean = jnp.mean(xf, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
  return ((xf - mean) * jax.lax.rsqrt(var + eps) * scale + bias).astype(dtype)


def transformer_layer(cfg: RefConfig, x: jax.Array, p: Params) -> jax.Array:
  dt = cfg.dtype
  t = x.shape[1]
  h = layer_norm(x, p["attn_norm_scale"], p["attn_norm_bias"], dt)
  q = jnp.einsum("btd,dnh->btnh", h, p["wq"].astype(dt))
  k = jnp.einsum("btd,dnh->btnh", h, p["wk"].astype(dt))
  v = jnp.einsum("btd,dnh->btnh", h, p["wv"].astype(dt))
  if cfg.per_dim_scale:
    scale = jax.nn.softplus(p["per_dim_scale"]) / (math.log(2.0) * math.sqrt(cfg.dim_per_head))
    q = q * scale.astype(dt)
  else:
    q = q * jnp.asarray(cfg.dim_per_head ** -0.5, dt)
  logits = jnp.einsum("btnh,bsnh->bnts", q, k).astype(jnp.float32)
  if cfg.atten_logit_cap > 0:
    logits = cfg.atten_logit_cap * jnp.tanh(logits / cfg.atten_logit_cap)
  causal = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
  logits = jnp.where(causal, logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1).astype(dt)
  context = constrain(cfg, jnp.einsum("bnts,bsnh->btnh", probs, v), "heads")
  context = checkpoint_name(context, "context")
  out = checkpoint_name(jnp.einsum("btnh,nhd->btd", context, p["wo"].astype(dt)), "out_proj")
  x = constrain(cfg, x + out, "embed")
  h = layer_norm(x, p["ffn_norm_scale"], p["ffn_norm_bias"], dt)
  h1 = jnp.einsum("btd,df->btf", h, p["w1"].astype(dt)) + p["b1"].astype(dt)
  h1 = constrain(cfg, ACTIVATIONS[cfg.activation](h1), "mlp")
  h1 = checkpoint_name(h1, "ffn1")
  y = jnp.einsum("btf,fd->btd", h1, p["w2"].astype(dt)) + p["b2"].astype(dt)
  return constrain(cfg, x + checkpoint_name(y, "ffn2"), "embed")


def forward(cfg: RefConfig, params: Params, ids: jax.Array) -> jax.Array:
  """ids [batch, length] -> logits [batch, length, vocab] in cfg.dtype."""
  dt = cfg.dtype
  table = params["embedding"]
  x = jnp.take(table, ids, axis=0).astype(dt) * jnp.asarray(cfg.model_dims ** 0.5, dt)
  x = x + sinusoidal_positions(ids.shape[1], cfg.model_dims).astype(dt)[None]
  x = constrain(cfg, x, "embed")

  layer = lambda x, p: transformer_layer(cfg, x, p)
  policy = REMAT_POLICIES[cfg.checkpoint_policy]
  remat = cfg.checkpoint_policy != "SAVE_EVERYTHING"
  if cfg.use_repeated_layer:
    if remat:
      layer = jax.checkpoint(layer, policy=policy, prevent_cse=False)
    x, _ = jax.lax.scan(lambda c, p: (layer(c, p), None), x, params["layers"])
  else:
    if remat:
      layer = jax.checkpoint(layer, policy=policy, prevent_cse=True)
    for p in params["layers"]:
      x = layer(x, p)
  x = layer_norm(x, params["final_norm_scale"], params["final_norm_bias"], dt)
  logits = jnp.einsum("btd,vd->btv", x, table.astype(dt))
  if cfg.softmax_bias:
    logits = logits + params["softmax_bias"].astype(dt)
  if cfg.softmax_cap_logits > 0:
    logits = cfg.softmax_cap_logits * jnp.tanh(logits / cfg.softmax_cap_logits)
  return constrain(cfg, logits, "vocab")


def loss_and_metrics(cfg: RefConfig, params: Params,
                     batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Weighted mean cross-entropy (float32) and token accuracy."""
  logits = forward(cfg, params, batch["ids"])
  labels = batch["labels"]
  weights = batch["weights"].astype(jnp.float32)
  logits32 = logits.astype(jnp.float32)
  xent = (jax.nn.logsumexp(logits32, axis=-1)
          - jnp.take_along_axis(logits32, labels[..., None], axis=-1)[..., 0])
  total = jnp.maximum(jnp.sum(weights), 1e-8)
  loss = jnp.sum(xent * weights) / total
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return loss, {"loss": loss, "accuracy": jnp.sum(correct * weights) / total}


# ----------------------------------------------------------------- optimizer


def lr_schedule(cfg: RefConfig) -> optax.Schedule:
  """Pax's schedules: constant (optional warmup), linear_rampup_{cosine,exponential}_decay."""
  lr = cfg.learning_rate
  if cfg.schedule == "constant":
    if cfg.warmup_steps:
      return optax.linear_schedule(0.0, lr, cfg.warmup_steps)
    return optax.constant_schedule(lr)
  warmup = max(cfg.warmup_steps, 1)
  decay_start = max(cfg.decay_start, cfg.warmup_steps)
  decay_steps = max(cfg.decay_end, decay_start + 1) - decay_start
  if cfg.schedule == "linear_rampup_cosine_decay":
    decay = optax.cosine_decay_schedule(lr, decay_steps, alpha=cfg.min_ratio)
  elif cfg.schedule == "linear_rampup_exponential_decay":
    decay = optax.exponential_decay(lr, decay_steps, cfg.min_ratio, end_value=lr * cfg.min_ratio)
  else:
    raise ValueError(f"unknown schedule {cfg.schedule!r}")
  return optax.join_schedules(
      [optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr), decay],
      [warmup, decay_start])


def optimizer(cfg: RefConfig) -> optax.GradientTransformation:
  if cfg.optimizer == "adafactor":  # optax's factored Adafactor, as T5X and paxlike run it
    opt = optax.adafactor(lr_schedule(cfg), weight_decay_rate=cfg.weight_decay or None)
  elif cfg.optimizer == "adam":
    opt = optax.adamw(lr_schedule(cfg), b1=cfg.beta1, b2=cfg.beta2, eps=cfg.epsilon,
                      weight_decay=cfg.weight_decay)
  else:
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")
  if cfg.clip_gradient_norm_to_value > 0:
    return optax.chain(optax.clip_by_global_norm(cfg.clip_gradient_norm_to_value), opt)
  return opt


# ---------------------------------------------------------------------- step


def init_state(cfg: RefConfig, params: Params) -> dict[str, Any]:
  return {"step": jnp.zeros((), jnp.int32), "params": params,
          "opt_state": optimizer(cfg).init(params)}


def make_train_step(cfg: RefConfig) -> Callable:
  """jit((state, batch) -> (state, metrics)), the state donated."""
  tx = optimizer(cfg)
  schedule = lr_schedule(cfg)

  def train_step(state: dict[str, Any], batch: dict[str, jax.Array]):
    (_, metrics), grads = jax.value_and_grad(
        lambda p: loss_and_metrics(cfg, p, batch), has_aux=True)(state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    metrics["grad_norm"] = optax.global_norm(grads)
    metrics["learning_rate"] = jnp.asarray(schedule(state["step"]), jnp.float32)
    return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, metrics

  return jax.jit(train_step, donate_argnums=(0,))
