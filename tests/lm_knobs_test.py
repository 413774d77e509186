"""Pax's LM knobs change the computation as Pax defines them (tiny shapes, in process)."""

from __future__ import annotations

import functools

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import train_in_process

from paxlike import experiment, flops, registry
from paxlike.errors import UserError
from paxlike.layers import activations
from paxlike.layers.attention import DotProductAttention
from paxlike.lm_experiments import SyntheticDataset, TransformerLmSpmdAdam
from paxlike.models.language_model import LanguageModel
from paxlike.train_state import count_params

SEQ = 8


class KnobsLm(SyntheticDataset, TransformerLmSpmdAdam):
  """A tiny LM on the template's Pax defaults (logit caps included)."""

  NUM_LAYERS = 2
  MODEL_DIMS = 16
  NUM_HEADS = 2
  DIMS_PER_HEAD = None  # 16 / 2 heads (the template's 128 would not fit MODEL_DIMS)
  VOCAB_SIZE = 32
  MAX_SEQ_LEN = SEQ
  PERCORE_BATCH_SIZE = 1
  USE_REPEATED_LAYER = False
  CHECKPOINT_POLICY = "SAVE_EVERYTHING"
  ICI_MESH_SHAPE = [1, 1, 1]


def _model(overrides: list[str] = (), cls: type = KnobsLm) -> LanguageModel:
  return fdl.build(experiment.instantiate(cls, list(overrides)).model())


def _params(model: LanguageModel, seed: int = 0):
  ids = jnp.zeros((1, SEQ), jnp.int32)
  return nn.unbox(model.init(jax.random.key(seed), ids))["params"]


def _ids(seed: int = 1, rows: int = 2, vocab: int = 32) -> jax.Array:
  return jax.random.randint(jax.random.key(seed), (rows, SEQ), 0, vocab)


def _logits(model: LanguageModel, params, ids: jax.Array, **kw) -> np.ndarray:
  return np.asarray(model.apply({"params": params}, ids, **kw))


# ------------------------------------------------------------------ logit caps


def test_attention_logit_cap_is_cap_times_tanh_of_the_logits():
  """The attention with ATTEN_LOGIT_CAP = 0.5 equals numpy's softmax(0.5 tanh(qk/0.5/sqrt(h))) v."""
  n, h, d, cap = 2, 4, 8, 0.5
  layer = DotProductAttention(n, h, logit_cap=cap)
  x = jax.random.normal(jax.random.key(0), (2, SEQ, d)) * 3.0
  params = nn.unbox(layer.init(jax.random.key(1), x))["params"]
  out = np.asarray(layer.apply({"params": params}, x))

  p = jax.tree.map(np.asarray, params)
  xs = np.asarray(x, np.float64)
  q = np.einsum("btd,dnh->btnh", xs, p["query"]["w"]) / np.sqrt(h)
  k = np.einsum("btd,dnh->btnh", xs, p["key"]["w"])
  v = np.einsum("btd,dnh->btnh", xs, p["value"]["w"])
  logits = cap * np.tanh(np.einsum("btnh,bsnh->bnts", q, k) / cap)
  logits = np.where(np.tril(np.ones((SEQ, SEQ), bool)), logits, -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  want = np.einsum("btnh,nhd->btd", np.einsum("bnts,bsnh->btnh", probs, v), p["post"])
  np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-5)
  # The cap matters here: without it the output differs.
  uncapped = DotProductAttention(n, h).apply({"params": params}, x)
  assert np.abs(np.asarray(uncapped) - out).max() > 1e-2


def test_softmax_cap_is_cap_times_tanh_of_the_uncapped_logits():
  capped = _model(["SOFTMAX_CAP_LOGITS=2.0", "ATTEN_LOGIT_CAP=-1.0"])
  plain = _model(["SOFTMAX_CAP_LOGITS=0.0", "ATTEN_LOGIT_CAP=-1.0"])
  params = _params(plain)  # the cap adds no parameter: the same params fit both
  ids = _ids()
  want = 2.0 * np.tanh(_logits(plain, params, ids) / 2.0)
  got = _logits(capped, params, ids)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert np.abs(got).max() < 2.0 < np.abs(_logits(plain, params, ids)).max()


def test_templates_carry_paxs_caps_and_a_nonpositive_cap_means_none():
  model = _model()
  assert (model.atten_logit_cap, model.softmax_cap_logits) == (50.0, 30.0)
  ids = _ids()
  params = _params(model)
  off = _model(["ATTEN_LOGIT_CAP=-1.0", "SOFTMAX_CAP_LOGITS=-1.0"])
  zero = _model(["ATTEN_LOGIT_CAP=0.0", "SOFTMAX_CAP_LOGITS=0.0"])
  np.testing.assert_array_equal(_logits(off, params, ids), _logits(zero, params, ids))


# ------------------------------------------------------------ parameter counts


def _count(model: LanguageModel) -> int:
  return count_params(jax.eval_shape(lambda: _params(model)))


@pytest.mark.parametrize("overrides", [
    [], ["TRAINABLE_POSITION_EMB=True", "TRAINABLE_PE_MAX_SEQ_LEN=64"],
    ["USE_GATED_ACTIVATION=True"], ["USE_BIAS=True"], ["SEPARATE_EMBEDDING=True"],
    ["NORM_POLICY='primer_hybrid'"], ["NORM_POLICY='post'", "COMBINE_QKV=True"],
    ["SOFTMAX_HAS_BIAS=False"], ["PER_DIM_SCALE=False", "USE_REPEATED_LAYER=True"],
    ["RELATIVE_BIAS=True", "USE_REPEATED_LAYER=True"],
])
def test_flops_param_count_equals_the_models_parameters(overrides):
  model = _model(overrides)
  assert _count(model) == flops.param_count(model.flops_dims(SEQ))
  # Pax's RELATIVE_BIAS: a [32 buckets, heads] table in every layer.
  assert model.relative_bias == ((32, 128) if "RELATIVE_BIAS=True" in overrides else None)


def test_paxs_softmax_bias_and_per_dim_scale_are_on_by_default_and_gpt3_turns_them_off():
  """Pax's LM has a [vocab] softmax bias and a [dim_per_head] query scale per layer."""
  layers, vocab, dim_per_head = 2, 32, 8
  model = _model()
  params = _params(model)
  assert params["softmax"]["bias"].shape == (vocab,)
  assert params["transformer"]["x_layers_0"]["attention"]["per_dim_scale"].shape == (8,)
  base = _count(model)
  assert _count(_model(["SOFTMAX_HAS_BIAS=False"])) == base - vocab
  assert _count(_model(["PER_DIM_SCALE=False"])) == base - layers * dim_per_head
  gpt3 = experiment.instantiate(registry.get("C4SpmdGpt3AdamOrgHP")).model()
  assert (gpt3.softmax_has_bias, gpt3.per_dim_scale) == (False, False)
  pax_2b = experiment.instantiate(registry.get("LmCloudSpmd2B")).model()
  assert (pax_2b.softmax_has_bias, pax_2b.per_dim_scale) == (True, True)


def test_per_dim_scale_is_softplus_of_theta_over_softplus_zero_sqrt_dim():
  """With theta set, the attention equals numpy's: q * softplus(theta) / (ln 2 * sqrt(h))."""
  n, h, d = 2, 4, 8
  layer = DotProductAttention(n, h)
  x = jax.random.normal(jax.random.key(0), (2, SEQ, d))
  params = nn.unbox(layer.init(jax.random.key(1), x))["params"]
  theta = np.asarray([-2.0, -0.5, 0.5, 3.0], np.float32)
  params = {**params, "per_dim_scale": jnp.asarray(theta)}
  out = np.asarray(layer.apply({"params": params}, x))

  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  xs = np.asarray(x, np.float64)
  softplus = np.log1p(np.exp(theta.astype(np.float64)))
  q = np.einsum("btd,dnh->btnh", xs, p["query"]["w"]) * softplus / (np.log(2.0) * np.sqrt(h))
  k = np.einsum("btd,dnh->btnh", xs, p["key"]["w"])
  v = np.einsum("btd,dnh->btnh", xs, p["value"]["w"])
  logits = np.einsum("btnh,bsnh->bnts", q, k)
  logits = np.where(np.tril(np.ones((SEQ, SEQ), bool)), logits, -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  want = np.einsum("btnh,nhd->btd", np.einsum("bnts,bsnh->btnh", probs, v), p["post"])
  np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-5)
  # At theta = 0 it is the plain 1/sqrt(h) scaling of PER_DIM_SCALE = False.
  zero = {**params, "per_dim_scale": jnp.zeros((h,))}
  plain = DotProductAttention(n, h, per_dim_scale=False)
  np.testing.assert_allclose(layer.apply({"params": zero}, x),
                             plain.apply({"params": params}, x), rtol=1e-6, atol=1e-6)


def test_softmax_bias_is_added_to_the_logits_before_the_cap():
  capped = _model(["SOFTMAX_CAP_LOGITS=2.0"])
  uncapped = _model(["SOFTMAX_CAP_LOGITS=0.0"])
  params = _params(capped)
  ids = _ids()
  bias = jax.random.normal(jax.random.key(4), (32,)) * 3.0
  zero_bias = _logits(uncapped, params, ids)
  params["softmax"]["bias"] = bias
  np.testing.assert_allclose(_logits(uncapped, params, ids), zero_bias + np.asarray(bias),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(_logits(capped, params, ids),
                             2.0 * np.tanh((zero_bias + np.asarray(bias)) / 2.0),
                             rtol=1e-5, atol=1e-6)


def test_trainable_positions_gate_bias_and_separate_table_add_their_parameters():
  d, hidden, layers, vocab = 16, 64, 2, 32
  base = _count(_model())
  assert _count(_model(["TRAINABLE_POSITION_EMB=True", "TRAINABLE_PE_MAX_SEQ_LEN=64"])) \
      == base + 64 * d
  # The gate: a third [d, hidden] matrix and its bias in every layer.
  assert _count(_model(["USE_GATED_ACTIVATION=True"])) == base + layers * (d * hidden + hidden)
  # q, k, v biases [heads x dim] and the output projection's [d].
  assert _count(_model(["USE_BIAS=True"])) == base + layers * (3 * d + d)
  assert _count(_model(["SEPARATE_EMBEDDING=True"])) == base + vocab * d
  # The gated FFN's third matrix is a matmul, so the model FLOPs grow by 6 x it per token.
  gated = _model(["USE_GATED_ACTIVATION=True"]).flops_dims(SEQ)
  plain = _model().flops_dims(SEQ)
  assert flops.model_flops_per_token(gated) - flops.model_flops_per_token(plain) \
      == 6 * layers * d * hidden


def test_gated_ffn_is_activation_of_gate_times_linear():
  from paxlike.layers.linear import FeedForward

  ffn = FeedForward(6, "gelu", use_gated_activation=True)
  x = jax.random.normal(jax.random.key(0), (1, 3, 4))
  p = nn.unbox(ffn.init(jax.random.key(1), x))["params"]
  gate = jax.nn.gelu(x @ p["ffn1_gate"]["w"] + p["ffn1_gate"]["b"])
  want = (gate * (x @ p["ffn1"]["w"] + p["ffn1"]["b"])) @ p["ffn2"]["w"] + p["ffn2"]["b"]
  np.testing.assert_allclose(ffn.apply({"params": p}, x), want, rtol=1e-5, atol=1e-6)


def test_trainable_position_table_replaces_the_sinusoids():
  model = _model(["TRAINABLE_POSITION_EMB=True", "TRAINABLE_PE_MAX_SEQ_LEN=16"])
  params = _params(model)
  assert params["position_emb"]["embedding"].shape == (16, 16)
  ids = _ids()
  moved = jax.tree.map(lambda x: x, params)
  moved["position_emb"]["embedding"] = params["position_emb"]["embedding"].at[3].add(1.0)
  diff = np.abs(_logits(model, moved, ids) - _logits(model, params, ids)).max(axis=(0, 2))
  # Position 3's row reaches positions 3.. (causal), never the ones before.
  assert np.all(diff[:3] == 0) and np.all(diff[3:] > 0)
  short = _model(["TRAINABLE_POSITION_EMB=True", "TRAINABLE_PE_MAX_SEQ_LEN=4"])
  with pytest.raises(UserError, match="TRAINABLE_PE_MAX_SEQ_LEN=4 is shorter"):
    _params(short)


def test_separate_embedding_unties_the_input_table_from_the_softmax():
  model = _model(["SEPARATE_EMBEDDING=True"])
  params = _params(model)
  emb, softmax = params["embedding"]["embedding"], params["softmax"]["embedding"]
  assert emb.shape == softmax.shape == (32, 16)
  assert not np.allclose(emb, softmax)
  ids = _ids()
  # The input table is read: scaling it changes the logits.
  scaled = {**params, "embedding": {"embedding": emb * 2.0}}
  assert not np.allclose(_logits(model, scaled, ids), _logits(model, params, ids))
  tied = _model()
  assert "embedding" not in _params(tied)


# ------------------------------------------------------------------ packed rows


def test_packed_input_keeps_segments_from_attending_to_each_other():
  model = _model()  # PACKED_INPUT = True, Pax's default
  params = _params(model)
  seg = jnp.asarray([[1, 1, 1, 1, 2, 2, 2, 2]] * 2)
  pos = jnp.asarray([[0, 1, 2, 3, 0, 1, 2, 3]] * 2)
  ids = _ids()
  other = ids.at[:, :4].set((ids[:, :4] + 5) % 32)  # new tokens in segment 1 only
  batch = lambda i: {"ids": i, "labels": i, "weights": jnp.ones(i.shape), "segment_ids": seg,
                     "segment_pos": pos}

  def logits(i, m=model):
    return np.asarray(m.apply({"params": params}, batch(i), method=lambda mod, b: mod(
        b["ids"], segment_ids=b["segment_ids"] if mod.packed_input else None,
        segment_pos=b["segment_pos"] if mod.packed_input else None)))

  a, b = logits(ids), logits(other)
  np.testing.assert_allclose(a[:, 4:], b[:, 4:], rtol=1e-5, atol=1e-6)
  assert not np.allclose(a[:, :4], b[:, :4])
  # Segment 2 reads as if it were a row of its own (positions restart at 0).
  alone = _logits(model, params, ids[:, 4:])
  np.testing.assert_allclose(a[:, 4:], alone, rtol=1e-4, atol=1e-5)
  # fprop honours them too; without PACKED_INPUT the segments mix.
  loss = lambda m, i: float(m.apply({"params": params}, batch(i), method="fprop")[0])
  unpacked = _model(["PACKED_INPUT=False"])
  assert loss(model, ids) != loss(unpacked, ids)
  assert not np.allclose(logits(ids, unpacked)[:, 4:], logits(other, unpacked)[:, 4:])


# ------------------------------------------------------------- norms, activation


def test_norm_policies_differ_and_run():
  ids = _ids()
  batch = {"ids": ids, "labels": ids, "weights": jnp.ones(ids.shape)}
  losses = {}
  for policy in ("pre", "post", "primer_hybrid"):
    model = _model([f"NORM_POLICY='{policy}'"])
    params = _params(model)
    names = set(params["transformer"]["x_layers_0"])
    want = {"pre": {"pre_attn_norm", "pre_ffn_norm"}, "post": {"post_attn_norm", "post_ffn_norm"},
            "primer_hybrid": {"pre_attn_norm", "post_attn_norm", "pre_ffn_norm", "post_ffn_norm"}}
    assert {n for n in names if n.endswith("_norm")} == want[policy]
    loss, grads = jax.jit(jax.value_and_grad(
        lambda p, m=model: m.apply({"params": p}, batch, method="fprop")[0]))(params)
    assert np.isfinite(float(loss))
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
    losses[policy] = float(loss)
  assert len(set(losses.values())) == 3, losses
  with pytest.raises(UserError, match="NORM_POLICY='postnorm' is not one of"):
    _model(["NORM_POLICY='postnorm'"])


def test_post_norm_layers_output_normalised_rows():
  """'post' ends each layer with a LayerNorm (scale 1, bias 0 at init): rows have mean 0, var 1."""
  model = _model(["NORM_POLICY='post'", "NUM_LAYERS=1"])
  params = _params(model)
  x = jax.random.normal(jax.random.key(3), (2, SEQ, 16)) * 5.0 + 2.0
  y = model.apply({"params": params}, x, method=lambda m, x: m.transformer(x)[0])
  np.testing.assert_allclose(np.mean(y, -1), 0.0, atol=1e-4)
  np.testing.assert_allclose(np.var(y, -1), 1.0, rtol=1e-3)


class GeluByClass(KnobsLm):
  ACTIVATION_CLS = activations.GELU


class GeluByString(KnobsLm):
  ACTIVATION = "gelu"


class BothDisagree(KnobsLm):
  ACTIVATION_CLS = activations.GELU
  ACTIVATION = "relu"


def test_activation_cls_gelu_equals_activation_string_gelu():
  by_class, by_string = _model(cls=GeluByClass), _model(cls=GeluByString)
  assert by_class.activation == by_string.activation == "gelu"
  params = _params(by_class)
  ids = _ids()
  np.testing.assert_array_equal(_logits(by_class, params, ids), _logits(by_string, params, ids))
  assert not np.allclose(_logits(_model(), params, ids), _logits(by_class, params, ids))
  assert _model(["ACTIVATION='silu'"], cls=GeluByClass).activation == "silu"  # --set wins
  with pytest.raises(UserError, match="ACTIVATION_CLS=.*GELU.* and ACTIVATION='relu' are set "
                                      "together and disagree"):
    _model(cls=BothDisagree)


def test_set_activation_cls_and_checkpoint_policy_by_paxs_names():
  """--set ACTIVATION_CLS=GELU or =layers.GELU gives the class; an enum-valued
  CHECKPOINT_POLICY takes a member's name; a typo names the choices."""
  for raw in ("GELU", "layers.GELU", "gelu"):
    exp = experiment.instantiate(KnobsLm, [f"ACTIVATION_CLS={raw}"])
    assert exp.ACTIVATION_CLS is activations.GELU
    assert fdl.build(exp.model()).activation == "gelu"
  with pytest.raises(UserError, match="'Gelu2' is not one of GELU, Identity, ReLU"):
    experiment.instantiate(KnobsLm, ["ACTIVATION_CLS=layers.Gelu2"])

  from paxlike.layers.transformer import AutodiffCheckpointType

  class EnumPolicy(KnobsLm):
    CHECKPOINT_POLICY = AutodiffCheckpointType.SAVE_NOTHING

  exp = experiment.instantiate(EnumPolicy, [
      "CHECKPOINT_POLICY=layers.AutodiffCheckpointType.SAVE_DOT_WITH_NO_BATCH_DIM"])
  assert exp.CHECKPOINT_POLICY is AutodiffCheckpointType.SAVE_DOT_WITH_NO_BATCH_DIM


def test_embedding_lookup_styles_agree_and_layernorm_epsilon_is_used():
  ids = _ids()
  index, matmul = _model(), _model(["EMBEDDING_LOOKUP_STYLE='matmul'"])
  params = _params(index)
  np.testing.assert_allclose(_logits(index, params, ids), _logits(matmul, params, ids),
                             rtol=1e-5, atol=1e-6)
  wide = _model(["LAYERNORM_EPSILON=10.0"])
  assert not np.allclose(_logits(wide, params, ids), _logits(index, params, ids))


def test_dropout_prob_drops_only_with_a_dropout_rng():
  model = _model(["DROPOUT_PROB=0.5"])
  params = _params(model)
  ids = _ids()
  batch = {"ids": ids, "labels": ids, "weights": jnp.ones(ids.shape)}
  fprop = lambda **kw: float(model.apply({"params": params}, batch, method="fprop", **kw)[0])
  assert fprop() == float(_model().apply({"params": params}, batch, method="fprop")[0])
  assert fprop(rngs={"dropout": jax.random.key(0)}) != fprop()


# ---------------------------------------------------------- uneven vocabulary


def test_vocab_the_mdl_axis_does_not_divide_is_padded_and_trains(tmp_path):
  """Vocabulary 100 over mdl = 8 (GPT-3's 50257 over 24 in small): the table pads to 104 rows,
  logits cover the real 100, and the loss is the unpadded model's on the same rows."""
  overrides = ["VOCAB_SIZE=100", "ICI_MESH_SHAPE=[1, 1, 8]", "MODEL_DIMS=32", "NUM_HEADS=8",
               "NUM_LAYERS=1", "MAX_SEQ_LEN=8", "PERCORE_BATCH_SIZE=1", "NUM_TRAIN_STEPS=2",
               "SUMMARY_INTERVAL_STEPS=1"]
  result, exp, part = train_in_process("LmCloudSpmdTiny", overrides, tmp_path, num_devices=8,
                                       enable_checkpoint_saving=False)
  assert result.final_step == 2
  table = result.state.params["softmax"]["embedding"]
  assert table.shape == (104, 32)
  assert "mdl" in tuple(table.sharding.spec)
  np.testing.assert_array_equal(np.asarray(table)[100:], 0.0)  # no id or logit reaches them
  model = fdl.build(exp.model())
  assert result.state.params["softmax"]["bias"].shape == (104,)  # padded like the table
  assert model.padding_params() == 4 * 32 + 4
  assert flops.param_count(model.flops_dims(8)) == count_params(result.state.params) - 4 * 33

  params = jax.device_get(result.state.params)
  unpadded = model.clone(vocab_pad_multiple=1)
  cut = {**params, "softmax": {k: v[:100] for k, v in params["softmax"].items()}}
  ids = _ids(vocab=100)
  np.testing.assert_allclose(_logits(model, params, ids), _logits(unpadded, cut, ids),
                             rtol=1e-5, atol=1e-6)


def test_decoding_with_every_knob_matches_the_full_forward_pass():
  """prefill + one-position extends give the logits of the full pass, with the learned
  position table, untied tables, gate, biases, caps, padded vocabulary and hybrid norms."""
  model = _model(["TRAINABLE_POSITION_EMB=True", "TRAINABLE_PE_MAX_SEQ_LEN=16",
                  "SEPARATE_EMBEDDING=True", "USE_GATED_ACTIVATION=True", "USE_BIAS=True",
                  "ATTEN_LOGIT_CAP=1.0", "SOFTMAX_CAP_LOGITS=2.0",
                  "NORM_POLICY='primer_hybrid'", "USE_REPEATED_LAYER=True",
                  "VOCAB_SIZE=30"]).clone(vocab_pad_multiple=8)
  params = _params(model)
  assert params["softmax"]["embedding"].shape == (32, 16)
  # The softmax bias and per-dim scales start at zero; move them so decoding must use them.
  params["softmax"]["bias"] = jax.random.normal(jax.random.key(5), (32,))
  attention = params["transformer"]["repeat"]["attention"]
  attention["per_dim_scale"] = jax.random.normal(jax.random.key(6), (2, 8))
  ids = _ids(vocab=30)
  full = _logits(model, params, ids)
  assert full.shape == (2, SEQ, 30)
  prompt = ids.at[:, 4:].set(0)
  _, state = model.apply({"params": params}, prompt, "prefill", mutable=["cache"])
  cache = state["cache"]
  # Jitted, as decoding runs it: one compile for the four steps.
  extend = jax.jit(functools.partial(model.apply, method="extend", mutable=["cache"]))
  for i in range(4, SEQ):
    logits, state = extend({"params": params, "cache": cache}, ids[:, i], jnp.asarray(i))
    cache = state["cache"]
    np.testing.assert_allclose(logits, full[:, i], rtol=1e-4, atol=1e-5)
