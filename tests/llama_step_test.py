"""benchmarks.llama_step compares two steps of the same model FLOPs (built, not compiled)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from benchmarks import llama_step
from paxlike import config, experiment
from paxlike.errors import UserError


def _models(argv):
  args = llama_step.parse_args(argv)
  exps = llama_step.peer_experiments(args.rope_theta, args.lm_norm, args.lm_rope)
  out = {}
  for name, cls in exps.items():
    exp = experiment.instantiate(cls, llama_step.shape_sets(args, name))
    out[name] = config.build(exp.task()).model
  specs = {"ids": jax.ShapeDtypeStruct((args.batch, args.seq), jnp.int32)}
  return out, specs


@pytest.mark.parametrize("argv", [[], ["--no-lm_rope", "--lm_norm=layernorm", "--layers=2"]])
def test_the_llama_and_lm_steps_compared_have_the_same_model_flops(argv):
  models, specs = _models(argv)
  llama, lm = models["llama"], models["lm"]
  assert type(llama).__name__ == "LlamaModel" and type(lm).__name__ == "LanguageModel"
  assert lm.use_gated_activation and lm.activation == "silu"
  assert llama.model_flops_per_step(specs) == lm.model_flops_per_step(specs) > 0
  if not argv:  # the default LM is as Llama-like as its knobs go
    assert lm.norm_type == "rmsnorm" and lm.rope_timescales == (1.0, 10000.0)
    assert not lm.use_position_emb and not lm.softmax_has_bias and not lm.per_dim_scale


def test_a_kv_head_count_the_lm_cannot_take_is_refused():
  with pytest.raises(UserError, match="--kv_heads equal to --heads"):
    _models(["--kv_heads=2"])


def test_llamas_cpu_head_has_linears_parameter_logits_and_gradients():
  """VocabHead, the fix the benchmark measured: Linear's kernel, product and gradients."""
  import flax.linen as nn
  import numpy as np

  from paxlike.layers.linear import Linear
  from paxlike.layers.llama import VocabHead

  x = jax.random.normal(jax.random.key(0), (2, 5, 16))
  head, plain = VocabHead(32), Linear((32,), ("embed", "vocab"))
  params = head.init(jax.random.key(1), x)
  plain_params = plain.init(jax.random.key(1), x)
  assert jax.tree.map(np.shape, nn.unbox(params)) == {"params": {"w": (16, 32)}}
  np.testing.assert_array_equal(nn.unbox(params)["params"]["w"],
                                nn.unbox(plain_params)["params"]["w"])

  def loss(module, p, x):
    return jnp.sum(jnp.sin(module.apply(p, x)))

  np.testing.assert_array_equal(head.apply(params, x), plain.apply(params, x))
  got = jax.grad(loss, argnums=(1, 2))(head, params, x)
  want = jax.grad(loss, argnums=(1, 2))(plain, params, x)
  for g, w in zip(jax.tree.leaves(nn.unbox(got)), jax.tree.leaves(nn.unbox(want)), strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
