"""Pax checkpoints (paxlike.interop.pax): Pax's LLaMA variables read into the Llama family.

The checkpoints are written here the way Pax's checkpointer lays them out
(one TensorStore array per variable, named by its dotted path, under
`checkpoint_<step>/state/`, with or without OCDBT), holding a random tiny
transformers Llama converted as saxml's convert_llama_ckpt.py converts
Meta's weights: Pax's names and [D, N, H] projections, and query/key rows in
Meta's rotary layout (adjacent pairs), the inverse of the permutation
transformers' own conversion applies. The reference is transformers itself.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO_ROOT, describe, parse_trained_line, run_cli

VOCAB, D, LAYERS, HEAD_DIM, FF = 64, 32, 2, 8, 48
LENS = (9, 6)


def _hf_model(heads: int, kv_heads: int, **config):
  import torch
  from transformers import LlamaConfig, LlamaForCausalLM

  torch.manual_seed(heads + kv_heads)
  settings = dict(vocab_size=VOCAB, hidden_size=D, intermediate_size=FF,
                  num_hidden_layers=LAYERS, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, head_dim=HEAD_DIM, max_position_embeddings=64,
                  rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  eos_token_id=1, pad_token_id=0, bos_token_id=None)
  model = LlamaForCausalLM(LlamaConfig(**{**settings, **config}))
  with torch.no_grad():  # logits far from uniform
    for p in model.parameters():
      if p.ndim == 2:
        p.mul_(4.0)
  return model.eval()


def meta_rows(w: np.ndarray, heads: int) -> np.ndarray:
  """A q/k projection's [heads * H, D] rows from Hugging Face's rotary layout (dim i with
  i + H/2) to Meta's (adjacent pairs), which Pax's LLaMA and saxml's converter keep."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)


def pax_params(hf_model, combined: bool, repeated: bool) -> dict:
  """Pax's LLaMA variables (saxml's names and layouts) of a transformers Llama."""
  cfg = hf_model.config
  n, kv, h, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
  sd = {k: v.float().numpy() for k, v in hf_model.state_dict().items()}
  layers = []
  for i in range(cfg.num_hidden_layers):
    p = f"model.layers.{i}."
    q = meta_rows(sd[p + "self_attn.q_proj.weight"], n).T.reshape(d, n, h)
    k = meta_rows(sd[p + "self_attn.k_proj.weight"], kv).T.reshape(d, kv, h)
    v = sd[p + "self_attn.v_proj.weight"].T.reshape(d, kv, h)
    attention = ({"combined_qkv": {"w": np.stack([q, k, v])}} if combined
                 else {"query": {"w": q}, "key": {"w": k}, "value": {"w": v}})
    attention["post"] = {"w": sd[p + "self_attn.o_proj.weight"].reshape(d, n, h)}
    layers.append({
        "layer_norm": {"scale": sd[p + "input_layernorm.weight"]},
        "self_attention": attention,
        "ff_layer": {
            "layer_norm": {"scale": sd[p + "post_attention_layernorm.weight"]},
            "ffn_layer1_gate": {"linear": {"w": sd[p + "mlp.gate_proj.weight"].T}},
            "ffn_layer1": {"linear": {"w": sd[p + "mlp.up_proj.weight"].T}},
            "ffn_layer2": {"linear": {"w": sd[p + "mlp.down_proj.weight"].T}}}})
  transformer = ({"repeat": {"sub": {"x_layers_0": jax.tree.map(lambda *x: np.stack(x), *layers)}}}
                 if repeated else {f"x_layers_{i}": layer for i, layer in enumerate(layers)})
  return {"lm": {"embedding_lookup": {"emb_var": sd["model.embed_tokens.weight"]},
                 "softmax": {"logits_ffn": {"linear": {"w": sd["lm_head.weight"].T}}},
                 "final_ln": {"scale": sd["model.norm.weight"]},
                 "transformer": transformer}}


def write_pax_checkpoint(checkpoints: str, step: int, params: dict, ocdbt: bool) -> str:
  """A Pax train state (step, mdl_vars, an optimizer slot) as Pax's checkpointer stores it."""
  import orbax.checkpoint as ocp

  state = os.path.join(checkpoints, f"checkpoint_{step:08d}", "state")
  tree = {"step": np.int64(step), "mdl_vars": {"params": params},
          "opt_states": {"no_prefix_0": {"count": np.int32(step)}}}
  ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=ocdbt)).save(state, tree)
  return state


def _paxlike_model(heads: int, kv_heads: int, scanned: bool):
  from paxlike.models.llama import LlamaModel

  return LlamaModel(vocab_size=VOCAB, model_dims=D, num_layers=LAYERS, num_heads=heads,
                    num_kv_heads=kv_heads, head_dim=HEAD_DIM, hidden_dims=FF,
                    max_seq_len=64, use_repeated_layer=scanned)


def _logits_gap(model, params, hf_model) -> float:
  import torch

  ids = np.random.default_rng(0).integers(2, VOCAB, (len(LENS), max(LENS))).astype(np.int32)
  real = np.arange(max(LENS))[None] < np.asarray(LENS)[:, None]
  ids = np.where(real, ids, 0)
  ours = np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(ids)))
  with torch.no_grad():
    theirs = hf_model(torch.tensor(ids, dtype=torch.long),
                      attention_mask=torch.tensor(real, dtype=torch.long)).logits.numpy()
  return float(np.abs(ours - theirs)[real].max())


@pytest.mark.parametrize("ocdbt, repeated, combined, scanned", [
    (False, False, False, True),  # Pax's default format; GQA; into a scanned model
    (True, True, True, False),  # OCDBT, Pax's repeated layers, combined q/k/v; unrolled
])
def test_a_pax_llama_checkpoint_gives_transformers_logits(tmp_path, ocdbt, repeated, combined,
                                                          scanned):
  pytest.importorskip("transformers")
  from paxlike.interop import hf_files, pax

  heads, kv = (4, 4) if combined else (4, 2)
  hf_model = _hf_model(heads, kv)
  write_pax_checkpoint(str(tmp_path / "checkpoints"), 0,
                       pax_params(hf_model, combined, repeated), ocdbt)
  model = _paxlike_model(heads, kv, scanned)
  params = hf_files.materialize(pax.lazy_params(str(tmp_path), None, model))
  init = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))
  import flax.linen as nn

  assert jax.tree.structure(params) == jax.tree.structure(nn.meta.unbox(init["params"]))
  gap = _logits_gap(model, params, hf_model)
  assert gap < 1e-4, f"logits differ from transformers by {gap}"
  # Without the rotary reordering the same weights give other logits: the test sees it.
  unordered = dict(params)
  layer = "layers" if scanned else "layers_0"
  attn = params[layer]["self_attn"]
  order = np.argsort(pax.rope_order(HEAD_DIM))
  unordered[layer] = {**params[layer], "self_attn": {
      **attn, "q_proj": {"w": attn["q_proj"]["w"][..., order]}}}
  assert _logits_gap(model, unordered, hf_model) > 1e-2


def test_a_pax_source_is_found_from_its_job_checkpoints_step_or_state_folder(tmp_path):
  from paxlike.errors import UserError
  from paxlike.interop import pax

  params = {"lm": {"final_ln": {"scale": np.ones(4, np.float32)}}}
  ckpts = str(tmp_path / "job" / "checkpoints")
  for step in (100, 200):
    write_pax_checkpoint(ckpts, step, params, ocdbt=False)
  newest = os.path.join(ckpts, "checkpoint_00000200", "state")
  assert pax.find(str(tmp_path / "job"), None) == newest
  assert pax.find(ckpts, None) == newest
  assert pax.find(ckpts, 100) == os.path.join(ckpts, "checkpoint_00000100", "state")
  assert pax.find(os.path.dirname(newest), None) == newest
  assert pax.find(newest, None) == newest
  assert list(pax.read_params(newest)) == ["lm.final_ln.scale"]  # no step, no optimizer slot
  with pytest.raises(UserError, match=r"no checkpoint_00000300; steps there: \[100, 200\]"):
    pax.find(ckpts, 300)
  with pytest.raises(UserError, match="no Pax checkpoint arrays"):
    pax.find(str(tmp_path), None)
  # A paxlike job's checkpoint (an OCDBT store of params.* and opt_state.*) is named as one.
  import orbax.checkpoint as ocp

  ours = str(tmp_path / "paxlike_job" / "checkpoints" / "checkpoint_00000002" / "state")
  ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True)).save(
      ours, {"params": {"final_norm": {"scale": np.ones(4, np.float32)}}})
  with pytest.raises(UserError, match="holds no Pax model variables .* it is a paxlike "
                                      "checkpoint: read it with paxlike:DIR"):
    pax.read_params(pax.find(str(tmp_path / "paxlike_job"), None))


def test_a_checkpoint_of_another_shape_or_family_is_named(tmp_path):
  pytest.importorskip("transformers")
  from paxlike.errors import UserError
  from paxlike.interop import pax
  from paxlike.models.t5 import T5Model

  write_pax_checkpoint(str(tmp_path), 0, pax_params(_hf_model(4, 2), False, False), False)
  wider = _paxlike_model(4, 2, True).clone(hidden_dims=2 * FF)
  with pytest.raises(UserError, match=r"has lm\.transformer\.x_layers_0\.ff_layer\."
                                      r"ffn_layer1_gate\.linear\.w of shape \[32, 48\] but this "
                                      r"model needs \[32, 96\]"):
    pax.lazy_params(str(tmp_path), None, wider)
  deeper = _paxlike_model(4, 2, True).clone(num_layers=3)
  with pytest.raises(UserError, match=r"has no variable mdl_vars\.params\.lm\.transformer\."
                                      r"x_layers_2\.layer_norm\.scale"):
    pax.lazy_params(str(tmp_path), None, deeper)
  with pytest.raises(UserError, match="separate input and output tables .* sets "
                                      "TIE_EMBEDDINGS"):
    pax.lazy_params(str(tmp_path), None, _paxlike_model(4, 2, True).clone(tie_embeddings=True))
  t5 = T5Model(vocab_size=VOCAB, model_dims=D, num_encoder_layers=1, num_decoder_layers=1,
               num_heads=4, dim_per_head=HEAD_DIM, hidden_dims=FF)
  with pytest.raises(UserError, match="this experiment's model is a T5Model"):
    pax.lazy_params(str(tmp_path), None, t5)
  moe = _lm(scanned=True, combined=False).clone(num_experts=4, moe_layers=(1,))
  with pytest.raises(UserError, match="this experiment has mixture-of-experts layers"):
    pax.lazy_params(str(tmp_path), None, moe, {})


# ------------------------------------------------------------------ Pax's own LM

def _lm(scanned: bool, combined: bool):
  from paxlike.models.language_model import LanguageModel

  return LanguageModel(vocab_size=VOCAB, model_dims=D, num_layers=LAYERS, num_heads=4,
                       dim_per_head=HEAD_DIM, hidden_dims=FF, activation="relu",
                       combine_qkv=combined, use_repeated_layer=scanned, use_bias=True,
                       atten_logit_cap=50.0, softmax_cap_logits=30.0)


def praxis_lm_params(rng, combined: bool, repeated: bool) -> dict:
  """Random variables of praxis's TransformerLm (pre-LayerNorm, ReLU, biases, per-dim scale,
  shared softmax), under praxis's names and shapes; LayerNorm scales stored as scale - 1."""
  n, h = 4, HEAD_DIM

  def w(*shape, scale=0.3):
    return (scale * rng.standard_normal(shape)).astype(np.float32)

  def norm():
    return {"scale": w(D, scale=0.2), "bias": w(D, scale=0.2)}

  layers = []
  for _ in range(LAYERS):
    attention = {"per_dim_scale": {"per_dim_scale": w(h)},
                 "post": {"w": w(D, n, h), "b": w(D)}}
    if combined:
      attention["combined_qkv"] = {"w": w(3, D, n, h), "b": w(3, n, h)}
    else:
      attention.update({p: {"w": w(D, n, h), "b": w(n, h)} for p in ("query", "key", "value")})
    layers.append({"layer_norm": norm(), "self_attention": attention,
                   "ff_layer": {"layer_norm": norm(),
                                "ffn_layer1": {"linear": {"w": w(D, FF)}, "bias": {"b": w(FF)}},
                                "ffn_layer2": {"linear": {"w": w(FF, D)}, "bias": {"b": w(D)}}}})
  transformer = ({"repeat": {"sub": {"x_layers_0": jax.tree.map(lambda *x: np.stack(x), *layers)}}}
                 if repeated else {f"x_layers_{i}": layer for i, layer in enumerate(layers)})
  return {"lm": {"softmax": {"logits_ffn": {"linear": {"w": w(D, VOCAB)},
                                            "bias": {"b": w(VOCAB)}}},
                 "final_ln": norm(), "transformer": transformer}}


def praxis_lm_logits(tree: dict, ids: np.ndarray) -> np.ndarray:
  """praxis's TransformerLm forward, written out in float64 numpy from praxis's layers:
  shared-softmax lookup x sqrt(D), sinusoidal positions, pre-LayerNorm layers with
  (1 + scale), per-dim-scaled queries, logits capped at 50, causal softmax, ReLU
  feed-forward, final LayerNorm, logits (+ bias) capped at 30."""
  lm = jax.tree.map(lambda x: np.asarray(x, np.float64), tree["lm"])
  t = ids.shape[1]

  def ln(x, p):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * (1.0 + p["scale"]) + p["bias"]

  table = lm["softmax"]["logits_ffn"]["linear"]["w"]
  x = table.T[ids] * np.sqrt(D)
  inv = np.exp(np.arange(D // 2) * -(np.log(1.0e4) / (D // 2 - 1)))
  scaled = np.arange(t)[:, None] * inv[None]
  x = x + np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1)[None]
  stack = lm["transformer"]
  layers = ([jax.tree.map(lambda a, i=i: a[i], stack["repeat"]["sub"]["x_layers_0"])
             for i in range(LAYERS)] if "repeat" in stack
            else [stack[f"x_layers_{i}"] for i in range(LAYERS)])
  causal = np.tril(np.ones((t, t), bool))
  for p in layers:
    a = p["self_attention"]
    y = ln(x, p["layer_norm"])
    if "combined_qkv" in a:
      q, k, v = (np.einsum("btd,dnh->btnh", y, a["combined_qkv"]["w"][j])
                 + a["combined_qkv"]["b"][j] for j in range(3))
    else:
      q, k, v = (np.einsum("btd,dnh->btnh", y, a[n]["w"]) + a[n]["b"]
                 for n in ("query", "key", "value"))
    softplus = np.log1p(np.exp(a["per_dim_scale"]["per_dim_scale"]))
    q = q * (1.442695041 / np.sqrt(HEAD_DIM)) * softplus
    logits = np.einsum("btnh,bsnh->bnts", q, k)
    logits = 50.0 * np.tanh(logits / 50.0)
    logits = np.where(causal, logits, -1e30)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = np.einsum("bnts,bsnh->btnh", probs, v)
    x = x + np.einsum("btnh,dnh->btd", context, a["post"]["w"]) + a["post"]["b"]
    f = p["ff_layer"]
    hidden = np.maximum(ln(x, f["layer_norm"]) @ f["ffn_layer1"]["linear"]["w"]
                        + f["ffn_layer1"]["bias"]["b"], 0.0)
    x = x + hidden @ f["ffn_layer2"]["linear"]["w"] + f["ffn_layer2"]["bias"]["b"]
  logits = ln(x, lm["final_ln"]) @ table + lm["softmax"]["logits_ffn"]["bias"]["b"]
  return 30.0 * np.tanh(logits / 30.0)


@pytest.mark.parametrize("ocdbt, repeated, combined, scanned", [
    (False, False, False, True),
    (True, True, True, False),
])
def test_a_pax_lm_checkpoint_gives_praxis_s_logits(tmp_path, ocdbt, repeated, combined, scanned):
  from flax import linen as nn

  from paxlike.initial import flat_names
  from paxlike.interop import hf_files, pax

  tree = praxis_lm_params(np.random.default_rng(3), combined, repeated)
  write_pax_checkpoint(str(tmp_path / "checkpoints"), 0, tree, ocdbt)
  model = _lm(scanned, combined)
  ids = np.random.default_rng(4).integers(0, VOCAB, (2, 7)).astype(np.int32)
  abstract = nn.meta.unbox(jax.eval_shape(
      lambda: model.init(jax.random.key(0), jnp.asarray(ids)))["params"])
  params = hf_files.materialize(pax.lazy_params(str(tmp_path), None, model,
                                                flat_names(abstract)))
  assert jax.tree.structure(params) == jax.tree.structure(abstract)
  ours = np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(ids)))
  gap = float(np.abs(ours - praxis_lm_logits(tree, ids)).max())
  assert gap < 1e-3, f"logits differ from praxis's forward by {gap}"


def test_pax_s_checkpoint_restore_path_starts_the_run_as_the_same_weights_from_hugging_face(
    tmp_path):
  """Pax's GPU CheckpointRestoreMixin with CHECKPOINT_RESTORE_PATH trains exactly as from the
  same weights imported from a Hugging Face directory; a wrong path is one line, exit 2."""
  pytest.importorskip("transformers")
  from paxlike import config, experiment, registry

  exp = experiment.instantiate(registry.get("LlamaTiny"), ["ROPE_SCALING=None"])
  cfg = config.build(exp.task()).model.hf_config()
  hf_model = _hf_model(cfg["num_attention_heads"], cfg["num_key_value_heads"],
                       **{k: cfg[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                              "num_hidden_layers", "head_dim", "rope_theta",
                                              "max_position_embeddings", "rms_norm_eps")})
  hf_dir = tmp_path / "hf"
  hf_model.save_pretrained(str(hf_dir))
  write_pax_checkpoint(str(tmp_path / "pax_source" / "checkpoints"), 0,
                       pax_params(hf_model, False, False), ocdbt=False)
  restore = tmp_path / "pax_source" / "checkpoints" / "checkpoint_00000000"
  (tmp_path / "pax_llama.py").write_text(
      "from paxlike import experiment_registry\n"
      "from paxlike.pax.contrib.gpu.scripts_gpu.checkpoint_utils import "
      "CheckpointRestoreMixin\n"
      "from experiments.llama.llama3 import LlamaTiny\n\n"
      "@experiment_registry.register\n"
      "class PaxLlamaTiny(LlamaTiny, CheckpointRestoreMixin):\n"
      "  ROPE_SCALING = None\n"
      f"  CHECKPOINT_RESTORE_PATH = {str(restore)!r}\n\n"
      "  def task(self):  # as Pax's LLaMA7B\n"
      "    return self.configure_checkpoint_restore(super().task())\n")
  losses = []
  for name, args in (("hf", ["--exp=LlamaTiny", "--set", "ROPE_SCALING=None",
                             f"--init_from=hf:{hf_dir}"]),
                     ("pax", ["--exp=pax_llama.PaxLlamaTiny"])):
    proc = run_cli([*args, f"--job_log_dir={tmp_path / name}", "--set", "NUM_TRAIN_STEPS=3",
                    "--set", "SUMMARY_INTERVAL_STEPS=1"], tmp_path,
                   pythonpath=[tmp_path, REPO_ROOT])
    assert proc.returncode == 0, describe(proc)
    assert f"{name}:" in proc.stderr, describe(proc)
    trained = parse_trained_line(proc.stdout)
    losses.append((trained["first_loss"], trained["last_loss"]))
  assert losses[1] == pytest.approx(losses[0], rel=1e-5)
  job = tmp_path / "wrong"
  proc = run_cli(["--exp=pax_llama.PaxLlamaTiny", f"--job_log_dir={job}", "--set",
                  f"CHECKPOINT_RESTORE_PATH={tmp_path / 'nowhere'}"], tmp_path,
                 pythonpath=[tmp_path, REPO_ROOT])
  assert proc.returncode == 2, describe(proc)
  assert proc.stderr.strip().splitlines()[-1] == (
      f"error: pax:{tmp_path / 'nowhere'}: no such folder; give a Pax job's checkpoints/ folder "
      "or one of its checkpoint_<step> folders."), describe(proc)
  assert not job.exists()


def test_pax_s_lm_starts_a_run_and_a_checkpoint_of_other_layers_writes_nothing(tmp_path):
  write_pax_checkpoint(str(tmp_path / "src" / "checkpoints"), 500,
                       praxis_lm_params(np.random.default_rng(3), False, True), ocdbt=False)
  shape = ["--set", f"MODEL_DIMS={D}", "--set", f"DIMS_PER_HEAD={HEAD_DIM}", "--set",
           f"HIDDEN_DIMS={FF}", "--set", f"VOCAB_SIZE={VOCAB}", "--set", "ATTEN_LOGIT_CAP=50",
           "--set", "SOFTMAX_CAP_LOGITS=30", "--set", "NUM_TRAIN_STEPS=2",
           f"--init_from=pax:{tmp_path / 'src'}"]
  proc = run_cli(["--exp=LmCloudSpmdTiny", f"--job_log_dir={tmp_path / 'job'}", *shape, "--set",
                  "USE_BIAS=True"], tmp_path)
  assert proc.returncode == 0, describe(proc)
  assert ("starting from the parameters of pax:" in proc.stderr
          and "(21 parameters taken, 0 of them renamed, 0 freshly initialised)" in proc.stderr), \
      describe(proc)
  job = tmp_path / "no_bias"
  proc = run_cli(["--exp=LmCloudSpmdTiny", f"--job_log_dir={job}", *shape], tmp_path)
  assert proc.returncode == 2, describe(proc)
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "error: the Pax checkpoint in ") and "has variables this model has no place for (lm." \
      "transformer.repeat.sub.x_layers_0.self_attention.key.b" in proc.stderr, describe(proc)
  assert not job.exists()


@pytest.mark.parametrize("family", ["llama", "lm"])
def test_a_pax_checkpoint_fills_a_pipelined_model_s_stages_with_the_same_layers(tmp_path, family):
  """Read into 2 stages of 2 layers, then unpipelined and unrolled (the decoding twin): the
  weights read straight into an unrolled model; Pax's own pipelined stack is refused."""
  from paxlike import decoding
  from paxlike.errors import UserError
  from paxlike.interop import hf_files, pax

  rng = np.random.default_rng(5)
  if family == "llama":
    pytest.importorskip("transformers")
    tree = pax_params(_hf_model(4, 2), False, False)
    make = lambda **kw: _paxlike_model(4, 2, True).clone(num_layers=LAYERS, **kw)  # noqa: E731
  else:
    tree = praxis_lm_params(rng, False, False)
    make = lambda **kw: _lm(True, False).clone(**kw)  # noqa: E731
  write_pax_checkpoint(str(tmp_path / "src"), 0, tree, ocdbt=False)
  staged = make(num_stages=2, num_microbatches=2)
  params = hf_files.materialize(pax.lazy_params(str(tmp_path / "src"), None, staged))
  _, unrolled = decoding.decoding_model(staged, params)
  direct = hf_files.materialize(pax.lazy_params(str(tmp_path / "src"), None,
                                                make(use_repeated_layer=False)))
  assert jax.tree.structure(unrolled) == jax.tree.structure(direct)
  for a, b in zip(jax.tree.leaves(unrolled), jax.tree.leaves(direct), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  piped = {"lm": {**tree["lm"], "transformer": {"pipeline": tree["lm"]["transformer"]}}}
  write_pax_checkpoint(str(tmp_path / "piped"), 0, piped, ocdbt=False)
  with pytest.raises(UserError, match=r"holds a pipelined stack \(lm\.transformer\.pipeline"):
    pax.lazy_params(str(tmp_path / "piped"), None, make())
