"""Mixture-of-experts routing (paxlike.layers.moe) and the GLaM layers of Pax's LM."""

from __future__ import annotations

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.layers import attention, moe
from paxlike.layers.moe import MoeFeedForward, expert_capacity
from paxlike.models.language_model import LanguageModel
from paxlike.pax import config_tree
from paxlike.pax.pax_fiddle import Config

# Jitted, as the layers run them: one compile per shape instead of op-by-op dispatch.
top2_gating = jax.jit(moe.top2_gating, static_argnames=("capacity",))
dispatch = jax.jit(moe.dispatch, static_argnames=("num_slots",))
combine = jax.jit(moe.combine)


def test_expert_capacity_follows_praxis_rule():
  assert expert_capacity(16, 8, 2.0, None) == 4  # int(16 x 2 / 8)
  assert expert_capacity(10, 4, 2.0, None) == 8  # int(5), rounded up to a multiple of 4
  assert expert_capacity(16, 8, 2.0, 12) == 12  # a larger fixed capacity stands
  assert expert_capacity(16, 8, 0.0, 3) == 3  # no factor: the fixed capacity alone


def _logits(first: list[int], second: list[int], experts: int) -> jnp.ndarray:
  """[1, S, E] logits whose top two experts per token are first[s] then second[s]."""
  logits = np.zeros((1, len(first), experts), np.float32)
  for s, (a, b) in enumerate(zip(first, second, strict=True)):
    logits[0, s, a], logits[0, s, b] = 4.0, 2.0
  return jnp.asarray(logits)


def test_tokens_fill_an_expert_in_order_first_choices_before_second():
  """Capacity 2: expert 0 takes the first two tokens that choose it first; the third of them
  is left to its second expert, and second choices only take the room left."""
  routed, _, stats = top2_gating(_logits([0, 0, 0, 1], [1, 1, 2, 0], 3), None, capacity=2)
  none = 3 * 2  # the slot index of "no place": experts x capacity
  slots = np.asarray(routed["slot"][0])  # [S, 2]: expert x 2 + position, per choice
  # Tokens 0 and 1 fill expert 0's two slots, token 2 finds it full and keeps expert 2;
  # expert 1: token 3's first choice takes slot 0, token 0's second choice slot 1, and
  # token 1's second choice finds it full; token 3's second choice, expert 0, is full.
  np.testing.assert_array_equal(slots, [[0, 3], [1, none], [none, 4], [2, none]])
  # Each token's gates are renormalised over its two choices before any is dropped.
  pair = np.exp(4.0) / (np.exp(4.0) + np.exp(2.0))
  np.testing.assert_allclose(np.asarray(routed["gate"][0]),
                             [[pair, 1 - pair], [pair, 0], [0, 1 - pair], [pair, 0]], rtol=1e-5)
  np.testing.assert_allclose([stats["dispatch_1"], stats["dispatch_2"]], [0.75, 0.25])
  assert float(stats["over_capacity"]) == pytest.approx(3 / 8)  # 3 of the 8 choices


def test_padding_tokens_reach_no_expert_and_count_for_nothing():
  routed, _, stats = top2_gating(_logits([0, 1, 2, 0], [1, 2, 0, 1], 3),
                                 jnp.asarray([[1, 1, 0, 0]]), capacity=4)
  assert (np.asarray(routed["slot"][0, 2:]) == 3 * 4).all()
  assert not np.asarray(routed["gate"][0, 2:]).any()
  assert float(stats["dispatch_2"]) == 1.0  # both real tokens reach their two experts


def test_gathers_give_gshards_one_hot_einsums():
  """dispatch / combine equal GShard's dispatch and combine tensors' einsums."""
  g, s, e, c, m = 2, 12, 4, 4, 5
  logits = jax.random.normal(jax.random.key(0), (g, s, e)) * 3.0
  routed, _, _ = top2_gating(logits, None, capacity=c)
  x = jax.random.normal(jax.random.key(1), (g, s, m))
  onehot = np.zeros((g, s, e * c + 1), np.float32)  # one-hot slots, the last one "no place"
  for k in range(2):
    np.put_along_axis(onehot, np.asarray(routed["slot"][..., k:k + 1]), 1.0, axis=-1)
  gates = np.zeros_like(onehot)
  for k in range(2):
    np.put_along_axis(gates, np.asarray(routed["slot"][..., k:k + 1]),
                      np.asarray(routed["gate"][..., k:k + 1]), axis=-1)
  onehot, gates = onehot[..., :-1], gates[..., :-1]
  np.testing.assert_allclose(dispatch(x, routed["slot"], e * c),
                             np.einsum("gsx,gsm->gxm", onehot, x), rtol=1e-6, atol=1e-6)
  out = jax.random.normal(jax.random.key(2), (g, e * c, m))
  np.testing.assert_allclose(combine(out, routed), np.einsum("gxm,gsx->gsm", out, gates),
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("experts", [4, 8])
def test_load_balancing_loss_is_one_when_even_and_experts_when_collapsed(experts):
  s = 64
  even = jnp.asarray(np.eye(experts, dtype=np.float32)[np.arange(s) % experts][None] * 20.0)
  collapsed = jnp.asarray(np.tile([20.0] + [0.0] * (experts - 1), (1, s, 1)).astype(np.float32))
  assert float(top2_gating(even, None, s)[1]) == pytest.approx(1.0, rel=1e-4)
  assert float(top2_gating(collapsed, None, s)[1]) == pytest.approx(experts, rel=1e-4)


def test_decoding_routes_as_training_when_no_expert_is_full():
  """The KV-cache pass (every expert on every token, top two kept) gives the grouped
  dispatch's output wherever capacity drops nothing."""
  layer = MoeFeedForward(num_experts=4, hidden_dims=16, activation="gelu", num_groups=2,
                         capacity_factor=8.0, gated_activation=True)
  x = jax.random.normal(jax.random.key(0), (2, 6, 8))
  params = jax.jit(layer.init)(jax.random.key(1), x)
  y, record = jax.jit(layer.apply)(params, x)
  y_decode, _ = jax.jit(layer.clone(decode=True).apply)(params, x)
  np.testing.assert_allclose(y, y_decode, rtol=1e-5, atol=1e-6)
  assert float(record["aux_loss"]) > 0.0 and float(record["over_capacity"]) == 0.0


def test_extra_logit_joins_the_softmax_denominator():
  q, k, v = (jax.random.normal(jax.random.key(i), (1, 5, 2, 4)) for i in range(3))
  out = attention.xla_attention(q, k, v, is_causal=True, extra_logit=0.0)
  logits = np.einsum("btnh,bsnh->bnts", q, k)
  logits = np.where(np.tril(np.ones((5, 5), bool)), logits, -np.inf)
  probs = np.exp(logits) / (np.exp(logits).sum(-1, keepdims=True) + 1.0)  # exp(0) = 1
  np.testing.assert_allclose(out, np.einsum("bnts,bsnh->btnh", probs, v), rtol=1e-5,
                             atol=1e-6)


GLAM_LIKE = dict(vocab_size=48, model_dims=16, num_layers=4, num_heads=2, dim_per_head=8,
                 hidden_dims=32, activation="gelu", use_gated_activation=True,
                 norm_type="rmsnorm", use_bias=False, ffn_has_bias=False, per_dim_scale=False,
                 softmax_has_bias=False, scale_sqrt_depth=False, use_position_emb=False,
                 query_scale=False, attention_extra_logit=0.0, relative_bias=(8, 16),
                 gshard_softmax=True, z_loss_weight=1e-4, loss_over_labels_size=True,
                 num_experts=4, moe_layers=(0, 2), num_groups=2, moe_hidden_dims=24,
                 expert_capacity_factor=8.0, moe_activation="relu")


def test_a_glam_like_lm_decodes_the_logits_of_its_full_pass():
  """Prefill + one-position extends: the relative bias at the cached positions, the extra
  logit and the experts' decode routing give the full pass's logits."""
  model = LanguageModel(**GLAM_LIKE)
  ids = jax.random.randint(jax.random.key(0), (2, 10), 1, 48)
  params = flax.linen.unbox(jax.jit(model.init)(jax.random.key(1), ids)["params"])
  assert params["transformer"]["repeat"]["layer_0"]["attention"]["relative_bias"][
      "rel_embedding"].shape == (2, 8, 2)  # its own [buckets, heads] in each of 2 blocks
  # Jitted (as decoding runs them): one compile each instead of op-by-op dispatch.
  full = jax.jit(model.apply)({"params": params}, ids)
  _, state = jax.jit(functools.partial(model.apply, cache_mode="prefill", mutable=["cache"]))(
      {"params": params}, ids.at[:, 4:].set(0))
  cache = state["cache"]
  extend = jax.jit(functools.partial(model.apply, method="extend", mutable=["cache"]))
  for i in range(4, 10):
    logits, state = extend({"params": params, "cache": cache}, ids[:, i], jnp.asarray(i))
    cache = state["cache"]
    np.testing.assert_allclose(logits, full[:, i], rtol=1e-4, atol=1e-5)


# Grok's: grouped-query attention with biases and rotary positions, every layer with gated
# GELU experts, no dense feed-forward.
GROK_LIKE = {**GLAM_LIKE, "num_kv_heads": 1, "use_bias": True, "query_scale": True,
             "attention_extra_logit": None, "relative_bias": None,
             "rope_timescales": (1.0, 10_000.0), "moe_layers": (0, 1, 2, 3),
             "moe_gated_activation": True, "moe_activation": "gelu"}


@pytest.mark.parametrize("fields", [GLAM_LIKE, GROK_LIKE], ids=["glam", "grok"])
def test_a_moe_lms_praxis_tree_reads_back_as_the_same_model(fields):
  """What a task() that reads task_p.model.lm_tpl without editing it gets back: GLaM's
  tree, and Grok's (praxis's MultiQueryDotProductAttention, whose biases
  GroupedQueryAttention has not)."""
  cfg = Config(LanguageModel, **fields)
  values, _ = config_tree.read_tree({"lm_tpl": config_tree.tree_of(cfg), "params_init": None,
                                     "decoder_tpl": Config(config_tree.pl.DecoderHParams),
                                     "report_strict_acc": False})
  changed = {k: v for k, v in values.items() if getattr(cfg, k) != v}
  assert changed == {}, changed


def test_a_scanned_glam_like_lm_decodes_as_its_unrolled_twin():
  """Decoding runs the layers unrolled (decoding.decoding_model): blocks of an MoE and a
  dense layer come apart into x_layers_i with the same logits, and stack back."""
  from paxlike import decoding

  model = LanguageModel(**GLAM_LIKE, use_repeated_layer=True)
  ids = jax.random.randint(jax.random.key(0), (2, 10), 1, 48)
  params = flax.linen.unbox(jax.jit(model.init)(jax.random.key(1), ids)["params"])
  plain, unrolled = decoding.decoding_model(model, params)
  assert sorted(unrolled["transformer"]) == [f"x_layers_{i}" for i in range(4)]
  assert "moe" in unrolled["transformer"]["x_layers_2"]
  # Scanned and unrolled steps round differently (JAX 0.12: 1.2e-6 on a logit of 0.02).
  np.testing.assert_allclose(jax.jit(plain.apply)({"params": unrolled}, ids),
                             jax.jit(model.apply)({"params": params}, ids), rtol=1e-4,
                             atol=1e-5)
  back = model.restack_params(unrolled)
  assert jax.tree.all(jax.tree.map(np.array_equal, back, params))


def test_a_glam_like_checkpoint_reads_into_its_own_and_the_other_layout():
  """paxlike.relayout reads the stored blocks as 4 layers: the same layout needs nothing,
  the unrolled one gets the layers (and the Adam moments mirroring them) restacked."""
  from paxlike import relayout

  scanned = LanguageModel(**GLAM_LIKE, use_repeated_layer=True)
  ids = jax.random.randint(jax.random.key(0), (2, 10), 1, 48)
  params = jax.tree.map(np.asarray,
                        flax.linen.unbox(jax.jit(scanned.init)(jax.random.key(1), ids)["params"]))
  stored = {"params": params, "opt_state": [{"mu": params}]}
  assert relayout.change(stored, scanned) is None
  unrolled = scanned.clone(use_repeated_layer=False)
  plan = relayout.change(stored, unrolled)
  assert (plan.source.num_layers, plan.target.use_repeated_layer) == (4, False)
  tree, fresh = plan.apply(stored, {"params": unrolled.restack_params(params),
                                    "opt_state": [{"mu": unrolled.restack_params(params)}]})
  assert not fresh
  want = unrolled.restack_params(params)
  assert jax.tree.all(jax.tree.map(np.array_equal, tree["params"], want))
  assert jax.tree.all(jax.tree.map(np.array_equal, tree["opt_state"][0]["mu"], want))


def test_maybe_setup_moe_params_copies_the_feed_forward_as_edited_before_it():
  """As in Pax: an edit of the dense feed-forward made before maybe_setup_moe_params reaches
  the experts (here a wider hidden layer and GELU); the experts' own template starts as
  praxis's, which the call fills."""
  from paxlike import config, experiment, registry
  from paxlike.pax import layers, pax_fiddle
  from paxlike.pax.tasks.lm import model_params

  class Edited(registry.get("LmCloudSpmdTiny")):
    def task(self):
      task_p = super().task()
      stack = task_p.model.lm_tpl.stacked_transformer_tpl
      stack = getattr(stack, "block", stack)
      assert stack.moe_layer_tpl.hidden_dims == 0  # praxis's template, untouched
      ffn = stack.transformer_layer_params_tpl.tr_fflayer_tpl
      stack.hidden_dims = ffn.hidden_dims = 96
      ffn.activation_tpl = pax_fiddle.Config(layers.GELU)
      stack.num_experts, stack.moe_layers = 4, [0]
      model_params.maybe_setup_moe_params(stack)
      return task_p

  model = config.build(experiment.build_checked(experiment.instantiate(Edited)).task).model
  # Every layer has experts here, so the experts' activation is the one that runs.
  assert (model.hidden_dims, model.moe_hidden_dims or model.hidden_dims,
          model.moe_activation or model.activation, model.num_experts) == (96, 96, "gelu", 4)


def test_a_pipelined_moe_lm_routes_each_microbatch_as_the_plain_stack_routes_it():
  """Grok-like experts in every layer of 2 stages, 2 microbatches (rows i::2): the logits
  are the unpipelined model's, and the balancing loss and over-capacity share are the mean
  of the plain stack's over the two microbatches (each routed in num_groups groups, as a
  praxis stage routes its microbatch); the bubble's iterations add nothing."""
  from jax.sharding import Mesh

  from paxlike import mesh as mesh_lib

  fields = {**GROK_LIKE, "expert_capacity_factor": 1.0}  # tight: some choices are dropped
  model = LanguageModel(**fields, num_stages=2, num_microbatches=2, use_repeated_layer=False)
  plain = model.unpipelined()
  ids = jax.random.randint(jax.random.key(0), (4, 8), 1, 48)
  devices = Mesh(np.asarray(jax.devices()[:2]).reshape(2, 1, 1, 1),
                 mesh_lib.PIPELINE_MESH_AXES)
  with jax.set_mesh(devices), flax.linen.logical_axis_rules(mesh_lib.LOGICAL_AXIS_RULES):
    params = flax.linen.unbox(jax.jit(model.init)(jax.random.key(1), ids)["params"])
    logits, routing = jax.jit(functools.partial(model.apply, method="forward"))(
        {"params": params}, ids)
  flat = plain.restack_params(params)
  plain_forward = jax.jit(functools.partial(plain.apply, method="forward"))
  parts = [plain_forward({"params": flat}, ids[i::2]) for i in range(2)]
  want = np.empty(logits.shape, np.float32)
  for i, (part, _) in enumerate(parts):
    want[i::2] = part
  np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)
  for key in ("aux_loss", "over_capacity"):
    np.testing.assert_allclose(routing[key], np.mean([r[key] for _, r in parts]), rtol=1e-5)
  assert float(routing["over_capacity"]) > 0.0  # the capacity bit
