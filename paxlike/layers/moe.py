"""Mixture-of-experts feed-forward with GShard's top-2 routing (praxis's TransformerFeedForwardMoe).

The tokens of a batch are cut into num_groups groups of S tokens; each group
routes on its own. Tokens reach their experts' slots and come back by
gathers (dispatch, combine), which give GShard's one-hot einsums' values
without their [groups, S, experts, capacity] tensors, quadratic in S.

A token goes to its two highest-gated experts, in token order while an
expert has room: an expert takes at most C tokens of a group
(the expert capacity, from the capacity factor: int(S x factor / E) rounded
up to a multiple of 4, or a fixed expert_capacity_dim). A token past an
expert's capacity skips that expert (a token with neither expert passes
through the residual alone). The two outputs are weighted by the two gates,
renormalised to sum to 1 (before dropping, as GShard's Mesh TensorFlow code).

The load-balancing loss is E^2 x mean over groups and experts of
(fraction of the group's tokens whose first choice is the expert) x (mean
gate the expert gets): 1 for a perfectly even router, E for a router that
sends everything to one expert. The layer returns it times
moe_load_balance_loss_weight, which the LM adds to its loss, and the
fraction of its tokens' two choices that found the expert full
(over_capacity, praxis's over_capacity ratios in one number), which the LM
reports.

Decoding (a KV-cache pass) routes every token to its top two experts with no
capacity limit (praxis's dense_top2 gating), so a decoded token never loses
an expert to another row of the batch.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from paxlike.errors import UserError
from paxlike.layers.linear import ACTIVATIONS, dropout_active, fp8_product

Dtype = Any

GATING_FUNCS = ("top2",)


def expert_capacity(group_size: int, num_experts: int, capacity_factor: float,
                    capacity_dim: int | None) -> int:
  """Tokens an expert takes per group: capacity_dim, raised to int(group_size x factor /
  experts) rounded up to a multiple of 4 when that is larger (praxis's rule); at least 1."""
  capacity = capacity_dim or 0
  if capacity_factor:
    auto = int(group_size * capacity_factor / num_experts)
    if capacity < auto:
      capacity = (auto + 3) // 4 * 4
  return max(capacity, 1)


def top2_gating(logits: jax.Array, nonpadding: jax.Array | None, capacity: int,
                logit_cap: float = 0.0) -> tuple[dict[str, jax.Array], jax.Array,
                                                  dict[str, jax.Array]]:
  """GShard's top-2 routing of logits [G, S, E].

  Returns (assignments, load-balancing loss, stats). assignments holds, for
  each token's first and second choice ([G, S, 2] each): `slot`, the flat
  index expert x C + position of the place it got, or E x C where the expert
  was full (or the token is padding), and `gate`, its renormalised gate (0
  where it got no place). stats: the fraction of non-padding tokens that
  reached 0, 1 and 2 experts (dispatch_0/1/2), and of their choices that
  found the expert full (over_capacity).
  """
  logits = logits.astype(jnp.float32)
  if logit_cap > 0.0:
    logits = logit_cap * jnp.tanh(logits / logit_cap)
  num_experts = logits.shape[-1]
  gates = jax.nn.softmax(logits, axis=-1)
  keep = (jnp.ones(gates.shape[:-1], jnp.float32) if nonpadding is None
          else nonpadding.astype(jnp.float32))
  first = jnp.argmax(gates, axis=-1)
  mask1 = jax.nn.one_hot(first, num_experts, dtype=jnp.float32) * keep[..., None]
  rest = gates * (1.0 - jax.nn.one_hot(first, num_experts, dtype=jnp.float32))
  second = jnp.argmax(rest, axis=-1)
  mask2 = jax.nn.one_hot(second, num_experts, dtype=jnp.float32) * keep[..., None]
  gate1 = jnp.sum(gates * mask1, axis=-1)
  gate2 = jnp.sum(rest * mask2, axis=-1)
  denom = gate1 + gate2 + 1e-9
  gate1, gate2 = gate1 / denom, gate2 / denom

  # Load balance: first-choice fractions against mean gates (padding counts as no token).
  density = jnp.mean(mask1, axis=1)
  proxy = jnp.mean(gates * keep[..., None], axis=1)
  aux_loss = jnp.mean(density * proxy) * num_experts * num_experts

  # Positions in token order, first choices before second ones; a full expert drops.
  pos1 = jnp.sum((jnp.cumsum(mask1, axis=1) - mask1) * mask1, axis=-1)
  kept1 = (jnp.sum(mask1, axis=-1) > 0) & (pos1 < capacity)
  taken = jnp.sum(mask1 * (pos1 < capacity)[..., None], axis=1, keepdims=True)
  pos2 = jnp.sum((jnp.cumsum(mask2, axis=1) - mask2 + taken) * mask2, axis=-1)
  kept2 = (jnp.sum(mask2, axis=-1) > 0) & (pos2 < capacity)
  full = num_experts * capacity  # the slot index of "no place"
  slot1 = jnp.where(kept1, first * capacity + pos1.astype(jnp.int32), full)
  slot2 = jnp.where(kept2, second * capacity + pos2.astype(jnp.int32), full)
  assignments = {"slot": jnp.stack([slot1, slot2], axis=-1).astype(jnp.int32),
                 "gate": jnp.stack([gate1 * kept1, gate2 * kept2], axis=-1)}
  reached = kept1.astype(jnp.float32) + kept2.astype(jnp.float32)
  tokens = jnp.maximum(jnp.sum(keep), 1.0)
  stats = {f"dispatch_{k}": jnp.sum((reached == k) * keep) / tokens for k in range(3)}
  stats["over_capacity"] = 1.0 - jnp.sum(reached * keep) / (2.0 * tokens)
  return assignments, aux_loss, stats


def dispatch(grouped: jax.Array, slots: jax.Array, num_slots: int) -> jax.Array:
  """Each expert's inputs [G, E x C, M]: slot i of group g holds the token routed there
  (zeros where none is). A gather: GShard's one-hot dispatch einsum, without its
  [G, S, E, C] tensor."""
  g, s = slots.shape[:2]
  token = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32)[None, :, None], slots.shape)
  # The token in each slot (s, a zero row, where none is); out-of-range slots drop.
  table = jnp.full((g, num_slots), s, jnp.int32)
  table = table.at[jnp.arange(g)[:, None, None], slots].set(token, mode="drop")
  padded = jnp.concatenate([grouped, jnp.zeros_like(grouped[:, :1])], axis=1)
  return jnp.take_along_axis(padded, table[..., None], axis=1)


def combine(expert_out: jax.Array, assignments: dict[str, jax.Array]) -> jax.Array:
  """Each token's output [G, S, M]: its two slots' expert outputs (expert_out [G, E x C, M])
  weighted by their gates; GShard's combine einsum as a gather."""
  padded = jnp.concatenate([expert_out, jnp.zeros_like(expert_out[:, :1])], axis=1)
  g, s, k = assignments["slot"].shape
  picked = jnp.take_along_axis(padded, assignments["slot"].reshape(g, s * k)[..., None], axis=1)
  picked = picked.reshape(g, s, k, -1)
  return jnp.einsum("gskm,gsk->gsm", picked, assignments["gate"].astype(picked.dtype))


def no_routing() -> dict[str, jax.Array]:
  """What a layer without experts adds to the MoE layers' routing record."""
  return {"aux_loss": jnp.zeros((), jnp.float32), "over_capacity": jnp.zeros((), jnp.float32)}


def dense_top2(logits: jax.Array, logit_cap: float = 0.0) -> jax.Array:
  """Each token's two top gates, renormalised, over every expert [..., E] (no capacity)."""
  logits = logits.astype(jnp.float32)
  if logit_cap > 0.0:
    logits = logit_cap * jnp.tanh(logits / logit_cap)
  gates = jax.nn.softmax(logits, axis=-1)
  top = jax.lax.top_k(gates, 2)[0]
  kept = gates * (gates >= top[..., 1:2])
  return kept / (jnp.sum(kept, axis=-1, keepdims=True) + 1e-9)


def _fan_in_uniform(fan_in: int) -> Any:
  """praxis's internal_gshard_variance_scaling_fan_in_init: U(+-sqrt(3 / fan_in))."""
  limit = (3.0 / fan_in) ** 0.5
  return lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -limit, limit)


class MoeFeedForward(nn.Module):
  """x [B, L, D] -> (y [B, L, D], routing record: the weighted load-balancing loss
  `aux_loss` and `over_capacity`); see the module docstring.

  Weights: gate [D, E], wi [E, D, H] (and wi_gate with gated_activation:
  act(x wi_gate) * (x wi)), wo [E, H, D]; the expert dim is sharded over the
  mesh's 'data' axis (logical 'expert'), as Pax shards it, or over 'data_expert' on the
  expert-parallel mesh (paxlike.mesh). shard_experts=False
  (experts that do not divide the data axis: MoELarge's 16 on 32 devices) keeps
  each device's copy of every expert split on its embed dim instead, as a dense
  layer's weights are.
  """

  num_experts: int
  hidden_dims: int
  activation: str = "relu"
  dtype: Dtype = jnp.float32
  num_groups: int = 1
  capacity_factor: float = 2.0
  capacity_dim: int | None = None
  gated_activation: bool = False
  gating_logit_cap: float = 0.0
  load_balance_loss_weight: float = 1.0
  dropout_rate: float = 0.0
  decode: bool = False
  shard_experts: bool = True
  # Pax's USE_FP8 (praxis's Fp8EinsumOp / Fp8EinsumGatedOp on the experts): the experts'
  # einsums with wi, wi_gate and wo through FP8 (linear.fp8_product; scopes wi_fp8,
  # wi_gate_fp8, wo_fp8). Routing (gate, dispatch, combine) stays in the compute dtype.
  fp8: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, nonpadding: jax.Array | None = None
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
    b, length, d = x.shape
    e, h = self.num_experts, self.hidden_dims

    def weight(name: str, shape: tuple[int, ...], axes: tuple[str, ...], fan_in: int
               ) -> jax.Array:
      init = nn.with_logical_partitioning(_fan_in_uniform(fan_in), axes)
      return self.param(name, init, shape, jnp.float32).astype(self.dtype)

    expert, embed = ("expert", "expert_embed") if self.shard_experts else (None, "embed")
    gate_w = weight("gate", (d, e), (embed, None), d)
    wi = weight("wi", (e, d, h), (expert, embed, "mlp"), d)
    wi_gate = (weight("wi_gate", (e, d, h), (expert, embed, "mlp"), d)
               if self.gated_activation else None)
    wo = weight("wo", (e, h, d), (expert, "mlp", embed), h)
    act = ACTIVATIONS[self.activation]
    x = x.astype(self.dtype)

    def expert_einsum(spec: str, inputs: jax.Array, w: jax.Array, name: str) -> jax.Array:
      if not self.fp8:
        return jnp.einsum(spec, inputs, w)
      return fp8_product(self, inputs, w, lambda a, b: jnp.einsum(spec, a, b), f"{name}_fp8")

    def hidden(inputs: jax.Array, spec: str, out: str) -> jax.Array:
      """act(inputs @ wi), gated or not: einsum `spec`m,emh->`out`h."""
      h = expert_einsum(f"{spec}m,emh->{out}h", inputs, wi, "wi")
      if wi_gate is not None:
        return act(expert_einsum(f"{spec}m,emh->{out}h", inputs, wi_gate, "wi_gate")) * h
      return act(h)

    if self.decode:
      gates = dense_top2(jnp.einsum("blm,me->ble", x, gate_w), self.gating_logit_cap)
      outs = expert_einsum("eblh,ehm->eblm", hidden(x, "bl", "ebl"), wo, "wo")
      y = jnp.einsum("eblm,ble->blm", outs, gates.astype(self.dtype))
      return y, no_routing()

    tokens = b * length
    # Initialising (on any sample batch) routes in one group: the weights' shapes do not
    # depend on the groups.
    g = 1 if self.is_initializing() else self.num_groups
    if tokens % g:
      raise UserError(f"the MoE layer's num_groups={g} does not divide the {tokens} tokens "
                      f"of a batch ({b} rows x {length}); set a divisor (Pax: the data-"
                      "parallel device count).")
    s = tokens // g
    capacity = expert_capacity(s, e, self.capacity_factor, self.capacity_dim)
    grouped = nn.with_logical_constraint(x.reshape(g, s, d), ("batch", None, "activation_embed"))
    keep = None if nonpadding is None else nonpadding.reshape(g, s)
    logits = jnp.einsum("gsm,me->gse", grouped, gate_w)
    assignments, aux_loss, stats = top2_gating(logits, keep, capacity, self.gating_logit_cap)
    expert_in = dispatch(grouped, assignments["slot"], e * capacity)
    expert_in = expert_in.reshape(g, e, capacity, d).transpose(1, 0, 2, 3)
    # [E, G, C, M]: split over the experts (each device runs its experts for every group,
    # an all-to-all away; on the expert-parallel mesh the groups also go over replica x
    # data), or, where the experts are not split, over the groups.
    spread = ((expert, "expert_group", None, None) if self.shard_experts
              else (None, "batch", None, None))
    expert_in = nn.with_logical_constraint(expert_in, spread)
    hid = hidden(expert_in, "egc", "egc")
    hid = nn.Dropout(self.dropout_rate)(
        hid, deterministic=not dropout_active(self, self.dropout_rate))
    hid = checkpoint_name(hid, "ffn1")
    expert_out = expert_einsum("egch,ehm->egcm", hid, wo, "wo")
    expert_out = nn.with_logical_constraint(expert_out, spread)
    expert_out = expert_out.transpose(1, 0, 2, 3).reshape(g, e * capacity, d)
    y = combine(expert_out, assignments)
    y = nn.with_logical_constraint(y, ("batch", None, "activation_embed"))
    y = checkpoint_name(y.reshape(b, length, d), "ffn2")
    return y, {"aux_loss": aux_loss * self.load_balance_loss_weight,
               "over_capacity": stats["over_capacity"]}
