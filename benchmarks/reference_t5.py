"""The paxlike T5 / Flan-T5 train step, hand-written in plain JAX + optax.

No flax, no fiddle, no paxlike: parameters are a nested dict of arrays laid
out exactly as paxlike's T5 lays out its own (so paxlike's initial parameters
copy over unchanged), the forward pass is a handful of einsums, and the step
is one `jax.jit` with donation. It is the yardstick benchmarks/train_step.py
measures paxlike's T5 against, so it does the math transformers' T5 does:

- a shared [vocab, embed] table embeds encoder and decoder ids (no scaling);
- pre-norm layers with RMS norm (float32, scale only, no mean, no bias);
- relative position bias: T5's log-spaced buckets, bidirectional in the
  encoder and causal in the decoder, one [buckets, heads] table per stack,
  its bias computed once per stack and added in every layer of that stack;
- attention without the 1/sqrt(dim) scale, logits and softmax in float32;
  padding (token 0) of the encoder input masked as keys in the encoder's
  self-attention and in cross-attention; causal decoder self-attention;
- a gated-gelu (tanh approximation) or relu feed-forward without biases;
- a final norm per stack; untied logits (`decoder/logits_dense/kernel`) or
  tied ones (decoder output * embed**-0.5 @ embedding.T);
- weighted cross-entropy in float32;
- remat with the same policies and `lax.scan` over stacked layers when
  repeated, clip by global norm + adamw or adafactor with Pax's schedules (both shared
  with benchmarks.reference_lm).

On a device mesh the caller places parameters and batch; `activation_specs`
pins the activations' shardings at the points paxlike constrains them (see
benchmarks.reference_lm).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.ad_checkpoint import checkpoint_name

from benchmarks.reference_lm import REMAT_POLICIES, constrain, lr_schedule, optimizer

Params = dict[str, Any]
Batch = dict[str, jax.Array]

PAD_ID = 0

FFN_ACTIVATIONS = ("gated-gelu", "relu")


@dataclasses.dataclass(frozen=True)
class T5RefConfig:
  """Everything the reference T5 step depends on (model, remat, optimizer)."""

  vocab_size: int
  model_dims: int
  num_encoder_layers: int
  num_decoder_layers: int
  num_heads: int
  dim_per_head: int
  hidden_dims: int
  activation: str = "gated-gelu"
  tie_embeddings: bool = False
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  layer_norm_epsilon: float = 1e-6
  dtype: Any = jnp.float32
  use_repeated_layer: bool = True
  checkpoint_policy: str = "SAVE_NOTHING"
  # Optimizer: clip by global norm (0 = off), then adamw or adafactor (reference_lm's fields).
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

  def __post_init__(self):
    if self.activation not in FFN_ACTIVATIONS:
      raise ValueError(f"activation must be one of {FFN_ACTIVATIONS}, not {self.activation!r}")
    if self.checkpoint_policy not in REMAT_POLICIES:
      raise ValueError(f"unknown checkpoint_policy {self.checkpoint_policy!r}")


# ---------------------------------------------------------------- parameters


class _Init:
  """numpy draws for init_params.

  numpy rather than jax.random: eagerly every jax.random call compiles a
  program of its own, and under one jit the threefry draws take seconds to
  compile; the self-test needs neither.
  """

  def __init__(self, cfg: T5RefConfig, key: jax.Array):
    self.cfg = cfg
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
      key = jax.random.key_data(key)
    self.rng = np.random.default_rng(np.asarray(key, np.uint32).ravel().tolist())

  def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
    return self.rng.standard_normal(shape, np.float32) * np.float32(std)

  def ones(self) -> np.ndarray:
    # A fresh array per norm: leaves sharing one buffer would break the donating step.
    return np.ones((self.cfg.model_dims,), np.float32)

  def mlp(self) -> Params:
    d, f = self.cfg.model_dims, self.cfg.hidden_dims
    if self.cfg.activation == "gated-gelu":
      wi = {"wi_0": {"kernel": self.normal((d, f), d ** -0.5)},
            "wi_1": {"kernel": self.normal((d, f), d ** -0.5)}}
    else:
      wi = {"wi": {"kernel": self.normal((d, f), d ** -0.5)}}
    return {**wi, "wo": {"kernel": self.normal((f, d), f ** -0.5)}}

  def attention(self) -> Params:
    d, n, h = self.cfg.model_dims, self.cfg.num_heads, self.cfg.dim_per_head
    # T5 folds the missing 1/sqrt(dim) logit scale into the query's initial scale.
    return {"query": {"kernel": self.normal((d, n, h), (d * h) ** -0.5)},
            "key": {"kernel": self.normal((d, n, h), d ** -0.5)},
            "value": {"kernel": self.normal((d, n, h), d ** -0.5)},
            "out": {"kernel": self.normal((n, h, d), (n * h) ** -0.5)}}

  def encoder_layer(self) -> Params:
    return {"pre_attention_layer_norm": {"scale": self.ones()},
            "attention": self.attention(),
            "pre_mlp_layer_norm": {"scale": self.ones()},
            "mlp": self.mlp()}

  def decoder_layer(self) -> Params:
    return {"pre_self_attention_layer_norm": {"scale": self.ones()},
            "self_attention": self.attention(),
            "pre_cross_attention_layer_norm": {"scale": self.ones()},
            "encoder_decoder_attention": self.attention(),
            "pre_mlp_layer_norm": {"scale": self.ones()},
            "mlp": self.mlp()}

  def stack(self, make: Callable[[], Params], num_layers: int) -> Params:
    """{"layers": stacked tree} when repeated, else {"layers_0": ..., "layers_1": ...}."""
    layers = [make() for _ in range(num_layers)]
    if self.cfg.use_repeated_layer:
      return {"layers": jax.tree.map(lambda *xs: np.stack(xs), *layers)}
    return {f"layers_{i}": p for i, p in enumerate(layers)}

  def relpos_bias(self) -> Params:
    cfg = self.cfg
    return {"rel_embedding": self.normal(
        (cfg.relative_attention_num_buckets, cfg.num_heads), cfg.model_dims ** -0.5)}


def init_params(cfg: T5RefConfig, key: jax.Array) -> Params:
  """Fresh float32 parameters in paxlike's T5 tree (T5's usual normal initialisers).

  Args:
    cfg: the config.
    key: a concrete JAX PRNG key (typed or raw); it seeds numpy's generator, so
      this function cannot be traced (no jit, no eval_shape).

  Returns:
    The parameter tree, on the default device.
  """
  init = _Init(cfg, key)
  d = cfg.model_dims
  params = {
      "token_embedder": {"embedding": init.normal((cfg.vocab_size, d), 1.0)},
      "encoder": {"relpos_bias": init.relpos_bias(),
                  **init.stack(init.encoder_layer, cfg.num_encoder_layers),
                  "encoder_norm": {"scale": init.ones()}},
      "decoder": {"relpos_bias": init.relpos_bias(),
                  **init.stack(init.decoder_layer, cfg.num_decoder_layers),
                  "decoder_norm": {"scale": init.ones()}},
  }
  if not cfg.tie_embeddings:
    params["decoder"]["logits_dense"] = {"kernel": init.normal((d, cfg.vocab_size), d ** -0.5)}
  return jax.tree.map(jnp.asarray, params)


def _as_dicts(tree: Any) -> Any:
  """Nested Mappings (flax FrozenDicts included) as plain dicts; leaves untouched."""
  if isinstance(tree, Mapping):
    return {k: _as_dicts(v) for k, v in tree.items()}
  return tree


def params_from_paxlike(cfg: T5RefConfig, params: Params) -> Params:
  """paxlike's T5 parameter tree -> this module's: the same tree, as plain dicts.

  No copies, no transposes, so it works on any tree with paxlike's structure
  (arrays, shardings, specs). A `{"params": ...}` wrapper is unwrapped.

  Raises:
    ValueError: the tree's layer layout does not match cfg.use_repeated_layer.
  """
  tree = _as_dicts(params)
  if set(tree) == {"params"}:
    tree = tree["params"]
  for stack, num_layers in (("encoder", cfg.num_encoder_layers),
                            ("decoder", cfg.num_decoder_layers)):
    keys = set(tree[stack])
    want = {"layers"} if cfg.use_repeated_layer else {f"layers_{i}" for i in range(num_layers)}
    if not want <= keys:
      raise ValueError(f"{stack} has {sorted(keys)}; use_repeated_layer="
                       f"{cfg.use_repeated_layer} needs {sorted(want)}")
  return tree


# ------------------------------------------------------------------- forward


def rms_norm(x: jax.Array, scale: jax.Array, dtype: Any, eps: float) -> jax.Array:
  """T5's norm: x / rms(x) * scale, computed in float32, no mean, no bias."""
  xf = x.astype(jnp.float32)
  var = jnp.mean(jnp.square(xf), axis=-1, keepdims=True)
  return (xf * jax.lax.rsqrt(var + eps) * scale).astype(dtype)


def relative_position_buckets(q_len: int, k_len: int, bidirectional: bool, num_buckets: int,
                              max_distance: int) -> np.ndarray:
  """T5's bucket of each (query, key) pair: int32 [q_len, k_len].

  Lengths are static, so this is numpy at trace time and lands in the
  program as a constant. The float steps run in float32 in transformers'
  order, so positions on a bucket boundary fall on the same side as there.
  """
  rel = np.arange(k_len)[None, :] - np.arange(q_len)[:, None]  # key - query
  buckets = np.zeros_like(rel)
  if bidirectional:
    num_buckets //= 2  # half of the buckets for keys after the query
    buckets += (rel > 0) * num_buckets
    rel = np.abs(rel)
  else:
    rel = -np.minimum(rel, 0)  # keys after the query are masked anyway
  max_exact = num_buckets // 2
  # max(rel, 1): log(0) would be -inf; those positions take the exact branch below.
  log_ratio = (np.log(np.maximum(rel, 1).astype(np.float32) / np.float32(max_exact))
               / np.float32(math.log(max_distance / max_exact))
               * np.float32(num_buckets - max_exact))
  large = np.minimum(max_exact + log_ratio.astype(np.int32), num_buckets - 1)
  return (buckets + np.where(rel < max_exact, rel, large)).astype(np.int32)


def position_bias(cfg: T5RefConfig, table: jax.Array, q_len: int, k_len: int,
                  bidirectional: bool) -> jax.Array:
  """A stack's relative position bias, float32 [heads, q_len, k_len]."""
  buckets = relative_position_buckets(q_len, k_len, bidirectional,
                                      cfg.relative_attention_num_buckets,
                                      cfg.relative_attention_max_distance)
  # Gather from the [heads, buckets] transpose (tiny) so the result is already [n, q, k].
  return jnp.take(table.astype(jnp.float32).T, jnp.asarray(buckets), axis=1)


def attention(cfg: T5RefConfig, x: jax.Array, kv: jax.Array, p: Params,
              bias: jax.Array | None, mask: jax.Array) -> jax.Array:
  """Multi-head attention of x's positions over kv's; no 1/sqrt(dim) scale.

  Args:
    cfg: the config.
    x: queries' input [b, t, d]; kv: keys' and values' input [b, s, d].
    p: {query, key, value, out}/kernel.
    bias: float32 [n, t, s] or None (cross-attention has no position bias).
    mask: bool, broadcastable to [b, n, t, s]; True where a query may attend a key.

  Returns:
    [b, t, d] in cfg.dtype.
  """
  dt = cfg.dtype
  q = jnp.einsum("btd,dnh->btnh", x, p["query"]["kernel"].astype(dt))
  k = jnp.einsum("bsd,dnh->bsnh", kv, p["key"]["kernel"].astype(dt))
  v = jnp.einsum("bsd,dnh->bsnh", kv, p["value"]["kernel"].astype(dt))
  # Logits straight out of the matmul in float32: no rounding to dtype first.
  logits = jnp.einsum("btnh,bsnh->bnts", q, k, preferred_element_type=jnp.float32)
  if bias is not None:
    logits = logits + bias
  logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1).astype(dt)
  context = constrain(cfg, jnp.einsum("bnts,bsnh->btnh", probs, v), "heads")
  context = checkpoint_name(context, "context")
  out = jnp.einsum("btnh,nhd->btd", context, p["out"]["kernel"].astype(dt))
  return checkpoint_name(out, "out_proj")


def mlp(cfg: T5RefConfig, x: jax.Array, p: Params) -> jax.Array:
  """gated-gelu: gelu_tanh(x wi_0) * (x wi_1) -> wo; relu: relu(x wi) -> wo."""
  dt = cfg.dtype
  if cfg.activation == "gated-gelu":
    gate = jnp.einsum("btd,df->btf", x, p["wi_0"]["kernel"].astype(dt))
    linear = jnp.einsum("btd,df->btf", x, p["wi_1"]["kernel"].astype(dt))
    h = jax.nn.gelu(gate, approximate=True) * linear
  else:
    h = jax.nn.relu(jnp.einsum("btd,df->btf", x, p["wi"]["kernel"].astype(dt)))
  h = checkpoint_name(constrain(cfg, h, "mlp"), "ffn1")
  return checkpoint_name(jnp.einsum("btf,fd->btd", h, p["wo"]["kernel"].astype(dt)), "ffn2")


def encoder_layer(cfg: T5RefConfig, x: jax.Array, p: Params, bias: jax.Array,
                  key_mask: jax.Array) -> jax.Array:
  eps, dt = cfg.layer_norm_epsilon, cfg.dtype
  h = rms_norm(x, p["pre_attention_layer_norm"]["scale"], dt, eps)
  x = constrain(cfg, x + attention(cfg, h, h, p["attention"], bias, key_mask), "embed")
  h = rms_norm(x, p["pre_mlp_layer_norm"]["scale"], dt, eps)
  return constrain(cfg, x + mlp(cfg, h, p["mlp"]), "embed")


def decoder_layer(cfg: T5RefConfig, y: jax.Array, p: Params, encoded: jax.Array,
                  bias: jax.Array, causal: jax.Array, key_mask: jax.Array) -> jax.Array:
  eps, dt = cfg.layer_norm_epsilon, cfg.dtype
  h = rms_norm(y, p["pre_self_attention_layer_norm"]["scale"], dt, eps)
  y = constrain(cfg, y + attention(cfg, h, h, p["self_attention"], bias, causal), "embed")
  h = rms_norm(y, p["pre_cross_attention_layer_norm"]["scale"], dt, eps)
  cross = attention(cfg, h, encoded, p["encoder_decoder_attention"], None, key_mask)
  y = constrain(cfg, y + cross, "embed")
  h = rms_norm(y, p["pre_mlp_layer_norm"]["scale"], dt, eps)
  return constrain(cfg, y + mlp(cfg, h, p["mlp"]), "embed")


def run_stack(cfg: T5RefConfig, layer: Callable[..., jax.Array], x: jax.Array, stack: Params,
              num_layers: int, *args: jax.Array) -> jax.Array:
  """x through a stack's layers: remat with cfg's policy, scanned when repeated.

  args (bias, masks, encoder output) are the same for every layer.
  """
  fn = lambda x, p: layer(cfg, x, p, *args)
  policy = REMAT_POLICIES[cfg.checkpoint_policy]
  remat = cfg.checkpoint_policy != "SAVE_EVERYTHING"
  if cfg.use_repeated_layer:
    if remat:
      fn = jax.checkpoint(fn, policy=policy, prevent_cse=False)
    x, _ = jax.lax.scan(lambda c, p: (fn(c, p), None), x, stack["layers"])
    return x
  if remat:
    fn = jax.checkpoint(fn, policy=policy, prevent_cse=True)
  for i in range(num_layers):
    x = fn(x, stack[f"layers_{i}"])
  return x


def forward(cfg: T5RefConfig, params: Params, batch: Batch) -> tuple[jax.Array, jax.Array]:
  """The batch's encoder output [b, s, d] and logits [b, t, vocab], both in cfg.dtype."""
  dt = cfg.dtype
  table = params["token_embedder"]["embedding"]
  enc_ids, dec_ids = batch["encoder_input_tokens"], batch["decoder_input_tokens"]
  s, t = enc_ids.shape[1], dec_ids.shape[1]
  # Padding is masked only as keys: padded queries compute something nobody reads.
  key_mask = (enc_ids != PAD_ID)[:, None, None, :]  # [b, 1, 1, s]

  enc, dec = params["encoder"], params["decoder"]
  x = constrain(cfg, jnp.take(table, enc_ids, axis=0).astype(dt), "embed")
  enc_bias = position_bias(cfg, enc["relpos_bias"]["rel_embedding"], s, s, bidirectional=True)
  x = run_stack(cfg, encoder_layer, x, enc, cfg.num_encoder_layers, enc_bias, key_mask)
  encoded = rms_norm(x, enc["encoder_norm"]["scale"], dt, cfg.layer_norm_epsilon)

  y = constrain(cfg, jnp.take(table, dec_ids, axis=0).astype(dt), "embed")
  dec_bias = position_bias(cfg, dec["relpos_bias"]["rel_embedding"], t, t, bidirectional=False)
  causal = jnp.asarray(np.tril(np.ones((t, t), bool)))
  y = run_stack(cfg, decoder_layer, y, dec, cfg.num_decoder_layers, encoded, dec_bias, causal,
                key_mask)
  y = rms_norm(y, dec["decoder_norm"]["scale"], dt, cfg.layer_norm_epsilon)
  if cfg.tie_embeddings:
    y = y * jnp.asarray(cfg.model_dims ** -0.5, dt)
    logits = jnp.einsum("btd,vd->btv", y, table.astype(dt))
  else:
    logits = jnp.einsum("btd,dv->btv", y, dec["logits_dense"]["kernel"].astype(dt))
  return encoded, constrain(cfg, logits, "vocab")


def loss_fn(cfg: T5RefConfig, params: Params, batch: Batch) -> tuple[jax.Array, Batch]:
  """Weighted mean cross-entropy over decoder targets (float32), and token accuracy."""
  _, logits = forward(cfg, params, batch)
  labels = batch["decoder_target_tokens"]
  weights = batch["decoder_loss_weights"].astype(jnp.float32)
  logits32 = logits.astype(jnp.float32)
  xent = (jax.nn.logsumexp(logits32, axis=-1)
          - jnp.take_along_axis(logits32, labels[..., None], axis=-1)[..., 0])
  total = jnp.maximum(jnp.sum(weights), 1e-8)
  loss = jnp.sum(xent * weights) / total
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return loss, {"loss": loss, "accuracy": jnp.sum(correct * weights) / total}


# ---------------------------------------------------------------------- step


def init_state(cfg: T5RefConfig, params: Params) -> dict[str, Any]:
  return {"step": jnp.zeros((), jnp.int32), "params": params,
          "opt_state": optimizer(cfg).init(params)}


def make_train_step(cfg: T5RefConfig) -> Callable:
  """jit((state, batch) -> (state, metrics)), the state donated; reference_lm's step."""
  tx = optimizer(cfg)
  schedule = lr_schedule(cfg)

  def train_step(state: dict[str, Any], batch: Batch):
    (_, metrics), grads = jax.value_and_grad(
        lambda p: loss_fn(cfg, p, batch), has_aux=True)(state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    metrics["grad_norm"] = optax.tree.norm(grads)
    metrics["learning_rate"] = jnp.asarray(schedule(state["step"]), jnp.float32)
    return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, metrics

  return jax.jit(train_step, donate_argnums=(0,))
