"""The Llama family (paxlike.models.llama, paxlike.interop.hf_llama) against transformers.

A random tiny LlamaForCausalLM (4 query heads over 2 KV heads, Llama 3.1
rope scaling, untied, head_dim != hidden / heads) and a Qwen2-style one (q/k/v
biases, tied embeddings) are saved with save_pretrained, imported, and
compared with transformers: logits on a padded batch, greedy generation,
export -> from_pretrained. Model-only checks (KV-cached decode against the
full pass, packed rows against unpacked ones) need no transformers.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO_ROOT, describe, run_cli

VOCAB, D, HEADS, KV_HEADS, HEAD_DIM, FF, LAYERS = 64, 32, 4, 2, 12, 48, 2
ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8}
LENS = (10, 7, 3)  # rows of a padded batch (pad id 0 after each)


def _paxlike_model(qwen: bool = False, scanned: bool = True):
  from paxlike.models.llama import LlamaModel

  return LlamaModel(vocab_size=VOCAB, model_dims=D, num_layers=LAYERS, num_heads=HEADS,
                    num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, hidden_dims=FF,
                    tie_embeddings=qwen, rope_theta=1e6 if qwen else 5e5,
                    rope_scaling=None if qwen else ROPE, norm_epsilon=1e-6 if qwen else 1e-5,
                    qkv_bias=qwen, max_seq_len=64, use_repeated_layer=scanned)


def _hf_model(qwen: bool = False):
  import torch
  from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

  torch.manual_seed(1 if qwen else 0)
  common = dict(vocab_size=VOCAB, hidden_size=D, intermediate_size=FF, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                max_position_embeddings=64, eos_token_id=1, pad_token_id=0, bos_token_id=None)
  if qwen:
    model = Qwen2ForCausalLM(Qwen2Config(**common, rope_theta=1e6, rms_norm_eps=1e-6,
                                         tie_word_embeddings=True))
    with torch.no_grad():  # transformers initialises biases to 0: make them matter
      for layer in model.model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
          proj.bias.normal_(0.0, 0.5)
  else:
    model = LlamaForCausalLM(LlamaConfig(**common, rope_theta=5e5, rope_scaling=dict(ROPE),
                                         rms_norm_eps=1e-5, tie_word_embeddings=False))
  with torch.no_grad():  # a larger scale than 0.02 init: logits far from uniform
    for p in model.parameters():
      if p.ndim == 2:
        p.mul_(4.0)
  return model.eval()


def _batch() -> tuple[np.ndarray, np.ndarray]:
  """(ids [3, 10] padded with 0, real-token mask)."""
  ids = np.random.default_rng(0).integers(2, VOCAB, (len(LENS), max(LENS))).astype(np.int32)
  real = np.arange(max(LENS))[None] < np.asarray(LENS)[:, None]
  return np.where(real, ids, 0), real


def _hf_logits(model, ids: np.ndarray, real: np.ndarray) -> np.ndarray:
  import torch

  with torch.no_grad():
    return model(torch.tensor(ids, dtype=torch.long),
                 attention_mask=torch.tensor(real, dtype=torch.long)).logits.numpy()


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  path = tmp_path_factory.mktemp("llama")
  model = _hf_model()
  model.save_pretrained(str(path))
  return str(path), model


@pytest.mark.parametrize("scanned", [True, False])
def test_llama_import_matches_transformers(llama_dir, scanned):
  from paxlike.interop import hf

  path, hf_model = llama_dir
  model = _paxlike_model(scanned=scanned)
  params = hf.import_params(path, model)
  init = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))
  assert jax.tree.structure(params) == jax.tree.structure(nn_unbox(init["params"]))
  ids, real = _batch()
  logits = np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(ids)))
  diff = np.abs(logits - _hf_logits(hf_model, ids, real))[real].max()
  assert diff < 1e-4, f"logits differ from transformers by {diff}"


def nn_unbox(tree):
  import flax.linen as nn

  return nn.meta.unbox(tree)


def test_greedy_decode_matches_transformers_generate(llama_dir):
  import torch

  from paxlike import decoding
  from paxlike.interop import hf

  path, hf_model = llama_dir
  model = _paxlike_model()
  params = hf.import_params(path, model)
  prompt, new = 5, 8
  ids, _ = _batch()
  ids = ids[:2, :prompt]
  with torch.no_grad():
    want = hf_model.generate(torch.tensor(ids, dtype=torch.long), do_sample=False,
                             max_new_tokens=new, eos_token_id=1, pad_token_id=0,
                             attention_mask=torch.ones(ids.shape, dtype=torch.long)
                             ).numpy()[:, prompt:]
  buffer = np.zeros((2, prompt + new), np.int32)
  buffer[:, :prompt] = ids
  batch = {"ids": jnp.asarray(buffer), "prompt_lens": jnp.full((2,), prompt, jnp.int32)}
  settings = decoding.DecodeSettings(max_decode_length=new, eos_id=1, pad_id=0)
  out = jax.jit(lambda p, b: model.decode(p, b, jax.random.key(0), settings))(params, batch)
  got = np.asarray(out.tokens)[:, 0, :new]
  np.testing.assert_array_equal(got[:, :want.shape[1]], want)


def test_export_reloads_in_transformers(llama_dir, tmp_path):
  from transformers import AutoModelForCausalLM

  from paxlike.interop import hf

  path, hf_model = llama_dir
  model = _paxlike_model()
  hf.export_params(hf.import_params(path, model), model, str(tmp_path / "out"))
  reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
  assert type(reloaded).__name__ == "LlamaForCausalLM"
  ids, real = _batch()
  diff = np.abs(_hf_logits(reloaded, ids, real) - _hf_logits(hf_model, ids, real))[real].max()
  assert diff < 1e-5, f"exported model's logits differ by {diff}"


def test_export_keeps_the_sources_context_length(llama_dir, tmp_path):
  """A fine-tune on rows shorter than the source's context (MAX_SEQ_LEN 32 here, 64 in the
  source's config.json, which the job's vocabulary/ keeps) exports the source's 64."""
  import types

  from paxlike.export import hf as hf_export
  from paxlike.interop import hf

  path, _ = llama_dir
  short = _paxlike_model().clone(max_seq_len=32)
  vocab = types.SimpleNamespace(files={"config.json": os.path.join(path, "config.json")})
  assert hf_export.source_positions(vocab) == 64
  assert hf_export.source_positions(types.SimpleNamespace(files={})) is None
  hf.export_params(hf.import_params(path, short), short, str(tmp_path / "out"),
                   hf_export.source_positions(vocab))
  config = json.loads((tmp_path / "out" / "config.json").read_text())
  assert config["max_position_embeddings"] == 64
  hf.export_params(hf.import_params(path, short), short, str(tmp_path / "bare"))
  assert json.loads((tmp_path / "bare" / "config.json").read_text())[
      "max_position_embeddings"] == 32  # no source: the model's own length


def test_qwen2_with_biases_and_tied_embeddings_matches_transformers(tmp_path):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from transformers import AutoModelForCausalLM

  from paxlike.interop import hf

  hf_model = _hf_model(qwen=True)
  hf_model.save_pretrained(str(tmp_path / "qwen"))
  model = _paxlike_model(qwen=True)
  params = hf.import_params(str(tmp_path / "qwen"), model)
  assert "lm_head" not in params and "b" in params["layers"]["self_attn"]["q_proj"]
  ids, real = _batch()
  want = _hf_logits(hf_model, ids, real)
  logits = np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(ids)))
  diff = np.abs(logits - want)[real].max()
  assert diff < 1e-4, f"logits differ from transformers by {diff}"
  hf.export_params(params, model, str(tmp_path / "out"))
  reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
  assert type(reloaded).__name__ == "Qwen2ForCausalLM"
  diff = np.abs(_hf_logits(reloaded, ids, real) - want)[real].max()
  assert diff < 1e-5, f"exported model's logits differ by {diff}"


# ------------------------------------------------------------ model only


def _random_params(model):
  init = jax.jit(lambda key: model.init(key, jnp.zeros((1, 4), jnp.int32))["params"])
  return nn_unbox(init(jax.random.key(0)))


@pytest.mark.parametrize("scanned", [True, False])
def test_kv_cached_decode_equals_recomputing_the_prefix(scanned):
  from paxlike import decoding

  model = _paxlike_model(scanned=scanned)
  params = _random_params(model)
  ids, _ = _batch()
  ids = jnp.asarray(np.where(ids == 0, 5, ids))
  full = np.asarray(model.apply({"params": params}, ids))
  prompt = 4
  batch = {"ids": ids, "prompt_lens": jnp.full((ids.shape[0],), prompt, jnp.int32)}
  _, variables = jax.jit(lambda p, b: model.apply(
      {"params": p}, b, decoding.DecodeSettings(), method="prefill", mutable=["cache"]))(
          params, batch)
  extend = jax.jit(lambda p, c, t, i: model.apply({"params": p, "cache": c}, t, i,
                                                  method="extend", mutable=["cache"]))
  cache = variables["cache"]
  for index in range(prompt, ids.shape[1]):  # feed the real next tokens one by one
    logits, mutated = extend(params, cache, ids[:, index], jnp.asarray(index))
    cache = mutated["cache"]
    np.testing.assert_allclose(np.asarray(logits), full[:, index], atol=2e-5, rtol=1e-5)
  kv = jax.tree.leaves(cache)[0]
  # The cache holds only KV heads, as [batch, kv_heads, slots * length, head_dim] (one slot).
  assert kv.shape[-4:] == (ids.shape[0], KV_HEADS, ids.shape[1], HEAD_DIM), kv.shape


def test_packed_rows_equal_the_examples_unpacked():
  model = _paxlike_model()
  params = _random_params(model)
  rng = np.random.default_rng(1)
  a, b = rng.integers(2, VOCAB, 5), rng.integers(2, VOCAB, 4)
  packed = np.concatenate([a, b, [0]])[None].astype(np.int32)
  segments = np.asarray([[1] * 5 + [2] * 4 + [0]], np.int32)
  positions = np.asarray([[0, 1, 2, 3, 4, 0, 1, 2, 3, 0]], np.int32)
  forward = jax.jit(lambda p, *args: model.apply({"params": p}, *args))
  logits = np.asarray(forward(params, jnp.asarray(packed), jnp.asarray(positions),
                              jnp.asarray(segments)))
  for example, cols in ((a, slice(0, 5)), (b, slice(5, 9))):
    alone = np.asarray(forward(params, jnp.asarray(example[None], jnp.int32)))
    np.testing.assert_allclose(logits[0, cols], alone[0], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- refusals


def _write_config(directory, **changes):
  os.makedirs(directory, exist_ok=True)
  config = {**_paxlike_model().hf_config(), **changes}
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f)


def test_config_mismatch_and_unsupported_fields_are_named(tmp_path):
  from paxlike.errors import UserError
  from paxlike.interop import hf

  model = _paxlike_model()
  _write_config(tmp_path / "kv", num_key_value_heads=4)
  with pytest.raises(UserError, match="num_key_value_heads=4 but the experiment has "
                                      "NUM_KV_HEADS=2"):
    hf.check_config(hf.read_config(str(tmp_path / "kv")), model)
  _write_config(tmp_path / "rope", rope_scaling={**ROPE, "factor": 16.0})
  with pytest.raises(UserError, match="rope_scaling=.*ROPE_SCALING="):
    hf.check_config(hf.read_config(str(tmp_path / "rope")), model)
  # transformers 5's rope_parameters form reads the same as rope_theta + rope_scaling.
  _write_config(tmp_path / "v5", rope_theta=None, rope_scaling=None,
                rope_parameters={**ROPE, "rope_theta": 5e5})
  hf.check_config(hf.read_config(str(tmp_path / "v5")), model)
  _write_config(tmp_path / "yarn", rope_scaling={"rope_type": "yarn", "factor": 4.0})
  with pytest.raises(UserError, match="rope_type='yarn' is not supported"):
    hf.check_config(hf.read_config(str(tmp_path / "yarn")), model)
  _write_config(tmp_path / "mistral", model_type="mistral")  # MistralConfig's default: 4096
  with pytest.raises(UserError, match="sliding_window=4096"):
    hf.check_config(hf.read_config(str(tmp_path / "mistral")), model)
  _write_config(tmp_path / "mistral_full", model_type="mistral", sliding_window=None)
  hf.check_config(hf.read_config(str(tmp_path / "mistral_full")), model)


TINY = ["--set", f"NUM_LAYERS={LAYERS}", "--set", f"MODEL_DIMS={D}", "--set", f"NUM_HEADS={HEADS}",
        "--set", f"DIMS_PER_HEAD={HEAD_DIM}", "--set", f"HIDDEN_DIMS={FF}", "--set",
        f"VOCAB_SIZE={VOCAB}", "--set", "NUM_TRAIN_STEPS=2"]


@pytest.mark.parametrize("change", ["sliding_window", "rope_type"])
def test_cli_refuses_unsupported_checkpoints_and_writes_nothing(tmp_path, change):
  hf_dir = tmp_path / "hf"
  if change == "sliding_window":
    _write_config(hf_dir, model_type="qwen2", use_sliding_window=True, sliding_window=16)
  else:
    _write_config(hf_dir, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
  job = tmp_path / "job"
  job.mkdir()
  (job / "notes.txt").write_text("mine")
  proc = run_cli(["--exp=LlamaTiny", f"--job_log_dir={job}", f"--init_from=hf:{hf_dir}", *TINY],
                 tmp_path, pythonpath=[REPO_ROOT])
  assert proc.returncode == 2, describe(proc)
  assert "Traceback" not in proc.stderr
  message = proc.stderr.strip().splitlines()[-1]
  assert change in message, message
  assert sorted(os.listdir(job)) == ["notes.txt"]
