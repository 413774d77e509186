"""praxis's config tree (`task_p.model.lm_tpl...`) edits land on the model paxlike builds.

The experiments here are written in the idiom of Pax's LM files (a task()
that walks lm_tpl.stacked_transformer_tpl through block / pipeline_stage and
swaps layer templates), with paxlike.pax imports; their text is this
project's own.
"""

from __future__ import annotations

import fiddle as fdl
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY

from paxlike import config, experiment, registry
from paxlike import train_state as ts
from paxlike.errors import UserError
from paxlike.models.llama import LlamaModel
from paxlike.pax import base_layer, layers, pax_fiddle
from paxlike.pax.layers import activations, transformers

D, F, N, KV, H, V, L = 32, 64, 4, 2, 8, 64, 2


def _layer_p(task_p):
  """The layer template, found as Pax's files find it."""
  stacked_p = task_p.model.lm_tpl.stacked_transformer_tpl
  if fdl.get_callable(stacked_p) == transformers.PipelinedTransformer:
    stacked_p = stacked_p.pipeline_stage
  if issubclass(fdl.get_callable(stacked_p), transformers.StackedTransformerRepeated):
    stacked_p = stacked_p.block
  return stacked_p.transformer_layer_params_tpl


def _make_llama(task_p, kv_heads: int) -> None:
  """GQA + RoPE + RMSNorm + SwiGLU, as Pax's GPU Llama configs edit the LM."""
  layer_p = _layer_p(task_p)
  layer_p.tr_fflayer_tpl.use_gated_activation = True
  layer_p.tr_fflayer_tpl.activation_tpl = pax_fiddle.Config(activations.Swish)
  layer_p.tr_atten_tpl = pax_fiddle.Config(layers.grouped_query_attention.GroupedQueryAttention)
  layer_p.tr_atten_tpl.num_kv_heads = kv_heads
  layer_p.tr_atten_tpl.rope_min_max_timescales = [1, 10000]
  task_p.model.lm_tpl.position_emb_tpl = None
  layer_p.ln_tpl = pax_fiddle.Config(layers.RmsNorm)
  layer_p.tr_fflayer_tpl.ln_tpl = pax_fiddle.Config(layers.RmsNorm)
  task_p.model.lm_tpl.final_ln_tpl = pax_fiddle.Config(layers.RmsNorm)
  layer_p.ln_tpl.intermediate_dtype = jnp.float32
  layer_p.tr_atten_tpl.weight_split_dims_mapping.dnh = ["data", "mdl", None]


def _base():
  return registry.get(TINY)


class PaxLlama(_base()):
  """Pax's Llama edit: the LM keeps its FFN biases, softmax bias and tied table."""

  NUM_LAYERS = L
  MODEL_DIMS = D
  HIDDEN_DIMS = F
  NUM_HEADS = N
  DIMS_PER_HEAD = H
  VOCAB_SIZE = V
  MAX_SEQ_LEN = 16
  NUM_KV_HEADS = KV
  USE_REPEATED_LAYER = True

  def task(self):
    task_p = super().task()
    _make_llama(task_p, self.NUM_KV_HEADS)
    return task_p


class PaxLlamaAsHf(PaxLlama):
  """The same edit, made bias-free and untied: the shape of paxlike's Llama family."""

  def task(self):
    task_p = super().task()
    lm_p = task_p.model.lm_tpl
    lm_p.separate_embedding_tpl = pax_fiddle.Config(layers.Embedding, scale_sqrt_depth=False)
    lm_p.softmax_tpl = pax_fiddle.Config(layers.FullSoftmax, soft_cap_logits=None)
    lm_p.softmax_tpl.feed_forward_tpl.has_bias = False
    _layer_p(task_p).tr_fflayer_tpl.has_bias = False
    for norm in (_layer_p(task_p).ln_tpl, _layer_p(task_p).tr_fflayer_tpl.ln_tpl,
                 lm_p.final_ln_tpl):
      norm.epsilon = 1e-5
    return task_p


def _model(cls, *overrides):
  exp = experiment.instantiate(cls, list(overrides))
  return config.build(experiment.build_checked(exp).task).model


def _params(model, seed=0):
  batch = model.init_batch({k: jax.ShapeDtypeStruct((1, 8), jnp.int32)
                            for k in model.input_features()})
  return flax.linen.unbox(ts.init_params(model, jax.random.key(seed), batch))


def _count(params) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


def test_the_llama_edit_builds_that_model_with_praxis_count():
  model = _model(PaxLlama)
  assert (model.num_kv_heads, model.rope_timescales, model.norm_type, model.activation,
          model.use_gated_activation, model.use_position_emb, model.per_dim_scale) == (
              KV, (1.0, 10000.0), "rmsnorm", "silu", True, False, False)
  # praxis's shapes: q and o over N heads, k and v over KV heads, no attention bias;
  # gated FFN with biases (2F + D); two RMS scales a layer; tied table with its bias.
  layer = 2 * D * N * H + 2 * D * KV * H + 3 * D * F + 2 * F + D + 2 * D
  pax_count = L * layer + V * D + V + D
  assert _count(_params(model)) == pax_count
  from paxlike import flops
  assert flops.param_count(model.flops_dims(8)) == pax_count


def test_bias_free_untied_llama_edit_equals_paxlikes_llama_family():
  """Same count and, with the same weights, the same logits as paxlike's LlamaModel."""
  pax = _model(PaxLlamaAsHf)
  llama = LlamaModel(vocab_size=V, model_dims=D, num_layers=L, num_heads=N, num_kv_heads=KV,
                     head_dim=H, hidden_dims=F, norm_epsilon=1e-5, rope_theta=10000.0,
                     use_repeated_layer=True)
  lp = _params(llama, seed=3)
  assert _count(_params(pax)) == _count(lp)
  la = lp["layers"]
  pp = {
      "embedding": {"embedding": lp["embed_tokens"]},
      "softmax": {"embedding": lp["lm_head"]["w"].T},
      "final_norm": {"scale": lp["norm"]["scale"]},
      "transformer": {"repeat": {
          "attention": {"query": {"w": la["self_attn"]["q_proj"]["w"]},
                        "key": {"w": la["self_attn"]["k_proj"]["w"]},
                        "value": {"w": la["self_attn"]["v_proj"]["w"]},
                        "post": la["self_attn"]["o_proj"]["w"]},
          "ffn": {"ffn1": {"w": la["mlp"]["up_proj"]["w"]},
                  "ffn1_gate": {"w": la["mlp"]["gate_proj"]["w"]},
                  "ffn2": {"w": la["mlp"]["down_proj"]["w"]}},
          "pre_attn_norm": {"scale": la["input_layernorm"]["scale"]},
          "pre_ffn_norm": {"scale": la["post_attention_layernorm"]["scale"]}}},
  }
  assert jax.tree.structure(pp) == jax.tree.structure(_params(pax))
  ids = jax.random.randint(jax.random.key(1), (2, 12), 0, V)
  got = pax.apply({"params": pp}, ids)
  want = llama.apply({"params": lp}, ids)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)


class PaxGaussianInit(_base()):
  """GPT-3's initializer: every weight N(0, 0.006), the softmax table its own."""

  NUM_LAYERS = 2
  MODEL_DIMS = 64

  def task(self):
    task_p = super().task()
    task_p.model.params_init = base_layer.WeightInit.Gaussian(0.006)
    task_p.model.lm_tpl.softmax_tpl.params_init = base_layer.WeightInit.Gaussian(0.05)
    task_p.model.lm_tpl.softmax_tpl.scale_sqrt_depth = False
    task_p.model.lm_tpl.softmax_tpl.feed_forward_tpl.has_bias = False
    _layer_p(task_p).tr_atten_tpl.internal_enable_per_dim_scale = False
    return task_p


def test_params_init_draws_the_weights_and_the_switches_land():
  model = _model(PaxGaussianInit)
  assert (model.scale_sqrt_depth, model.softmax_has_bias, model.per_dim_scale) == (
      False, False, False)
  flat = flax.traverse_util.flatten_dict(_params(model))
  kernels = [v for k, v in flat.items() if k[-1] in ("w", "post") and k[0] != "softmax"]
  assert kernels and all(abs(float(np.std(k)) - 0.006) < 0.0015 for k in kernels)
  assert abs(float(np.std(flat[("softmax", "embedding")])) - 0.05) < 0.005
  norms = [v for k, v in flat.items() if k[-1] == "scale"]
  assert all(np.all(np.asarray(v) == 1.0) for v in norms)  # norms keep their own init


@pytest.mark.parametrize("edit,names", [
    (lambda t: setattr(_layer_p(t).tr_atten_tpl, "dconv_qkv", True), "tr_atten_tpl.dconv_qkv"),
    (lambda t: setattr(_layer_p(t), "ln_tpl", pax_fiddle.Config(layers.RmsNorm)),
     "tr_fflayer_tpl.ln_tpl"),
    (lambda t: setattr(t.model.lm_tpl, "stacked_transformer_tpl",
                       pax_fiddle.Config(layers.PipelinedTransformer)), "PipelinedTransformer"),
    (lambda t: setattr(_layer_p(t).tr_fflayer_tpl, "activation_tpl",
                       pax_fiddle.Config(layers.GELU, approximate=False)), "approximate"),
])
def test_an_edit_paxlike_does_not_model_is_one_line_naming_the_path(edit, names):
  class Edited(_base()):
    def task(self):
      task_p = super().task()
      edit(task_p)
      return task_p

  with pytest.raises(UserError) as err:
    _model(Edited)
  text = str(err.value)
  assert names in text and "\n" not in text and "task_p.model.lm_tpl" in text, text


def test_a_field_praxis_layers_do_not_have_is_refused_by_name():
  class Typo(_base()):
    def task(self):
      task_p = super().task()
      _layer_p(task_p).tr_atten_tpl.num_kv_head = 2
      return task_p

  with pytest.raises(UserError, match="num_kv_head"):
    _model(Typo)


def test_an_untouched_tree_changes_nothing():
  """A task() that only reads the tree builds the model it would without it."""
  class Reader(_base()):
    def task(self):
      task_p = super().task()
      assert task_p.model.lm_tpl.vocab_size == self.VOCAB_SIZE
      assert _layer_p(task_p).tr_atten_tpl.cls == layers.DotProductAttention
      return task_p

  assert repr(_model(Reader)) == repr(_model(_base()))


class PaxGpt3Style(_base()):
  """The edits of Pax's GPT-3 helper: GELU(approximate), no per-dim scale, biased
  attention, one epsilon, decoder ids, sharding hints on every attention."""

  ACTIVATION_CLS = layers.GELU
  LAYERNORM_EPSILON = 1e-5

  def task(self):
    task_p = super().task()
    model_p = task_p.model
    model_p.decoder_tpl.eos_id = 7
    model_p.decoder_tpl.seqlen = self.MAX_SEQ_LEN
    layer_p = _layer_p(task_p)
    layer_p.ln_tpl.epsilon = self.LAYERNORM_EPSILON
    layer_p.tr_fflayer_tpl.ln_tpl.epsilon = self.LAYERNORM_EPSILON
    model_p.lm_tpl.final_ln_tpl.epsilon = self.LAYERNORM_EPSILON
    layer_p.tr_atten_tpl.internal_enable_per_dim_scale = False
    layer_p.tr_atten_tpl.use_bias = True
    layer_p.tr_fflayer_tpl.activation_tpl.approximate = True
    for atten_p in (layer_p.tr_atten_tpl, layer_p.cross_atten_tpl):
      if atten_p is None:
        continue
      atten_p.weight_split_dims_mapping.proj = ["data", "mdl", None]
    return task_p


def test_gpt3_style_edits_land():
  model = _model(PaxGpt3Style)
  assert (model.activation, model.layernorm_epsilon, model.per_dim_scale, model.use_bias,
          model.special_ids()["eos_id"]) == ("gelu", 1e-5, False, True, 7)


def test_lm_vocab_size_and_relative_bias_as_pax_files_spell_them():
  """lm_tpl.vocab_size alone sets the vocabulary (praxis's TransformerLm gives it to the
  softmax and the embedding), and layers.RelativeBias is where praxis exports it."""
  class Edited(_base()):
    def task(self):
      task_p = super().task()
      task_p.model.lm_tpl.vocab_size = 2 * self.VOCAB_SIZE
      _layer_p(task_p).tr_atten_tpl.relative_bias_tpl = pax_fiddle.Config(
          layers.RelativeBias, relative_attention_num_buckets=8,
          relative_attention_max_distance=16)
      return task_p

  model = _model(Edited)
  assert model.vocab_size == 2 * _base().VOCAB_SIZE
  assert tuple(model.relative_bias) == (8, 16)
  assert _params(model)["softmax"]["embedding"].shape[0] == 2 * _base().VOCAB_SIZE


def test_pax_template_knobs_rotary_and_dconv():
  class Rotary(_base()):
    USE_ROTARY_POSITION_EMB = True

  class Dconv(_base()):
    ENABLE_DCONV = True

  model = _model(Rotary)
  assert tuple(model.rope_timescales) == (1.0, 10_000.0)  # praxis's rotary timescales
  assert _model(_base()).rope_timescales is None
  with pytest.raises(UserError, match=r"^ENABLE_DCONV=True: paxlike's attention has no "):
    _model(Dconv)
