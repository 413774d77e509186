"""paxlike.interop.hf and T5Model against transformers' T5 (the reference).

A small random T5ForConditionalGeneration (Flan-T5's shape: gated-gelu,
untied head, heads x d_kv != d_model) is saved with save_pretrained, imported,
and compared with transformers on a padded batch: encoder output, logits,
greedy generation; then exported back and reloaded by transformers.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

# transformers (and torch) are the reference; the test extra installs them under
# Python 3.11, where a CPU torch wheel exists (see setup.cfg).
pytest.importorskip("torch")
pytest.importorskip("transformers")

VOCAB, D, HEADS, D_KV, D_FF, ENC_LAYERS, DEC_LAYERS = 100, 32, 3, 16, 48, 3, 2
ENC_LENS = (9, 5, 2)  # rows of different lengths: padding (id 0) after each
DEC_LEN = 6


def _hf_model(activation: str, tie: bool, seed: int):
  import torch
  from transformers import T5Config, T5ForConditionalGeneration

  torch.manual_seed(seed)
  config = T5Config(vocab_size=VOCAB, d_model=D, d_kv=D_KV, num_heads=HEADS, d_ff=D_FF,
                    num_layers=ENC_LAYERS, num_decoder_layers=DEC_LAYERS,
                    feed_forward_proj=activation, tie_word_embeddings=tie, dropout_rate=0.0,
                    decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
  model = T5ForConditionalGeneration(config).eval()
  if not tie:
    # transformers 5 ties lm_head to shared even for tie_word_embeddings=False; a head of
    # its own (Flan-T5's) makes the untied path observable.
    model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, D) * D ** -0.5)
  # EOS a little more likely, so some greedy rows end early (stop and pad handling).
  with torch.no_grad():
    model.lm_head.weight[1] *= 3.0
  return model


def _paxlike_model(activation: str = "gated-gelu", tie: bool = False, scanned: bool = False):
  from paxlike.models.t5 import T5Model

  return T5Model(vocab_size=VOCAB, model_dims=D, num_encoder_layers=ENC_LAYERS,
                 num_decoder_layers=DEC_LAYERS, num_heads=HEADS, dim_per_head=D_KV,
                 hidden_dims=D_FF, activation=activation, tie_embeddings=tie,
                 use_repeated_layer=scanned)


def _batch() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(0)
  enc = rng.integers(2, VOCAB, (len(ENC_LENS), max(ENC_LENS)))
  for r, n in enumerate(ENC_LENS):
    enc[r, n:] = 0
  dec = rng.integers(2, VOCAB, (len(ENC_LENS), DEC_LEN))
  dec[:, 0] = 0  # decoder_start_token_id
  return {"encoder_input_tokens": enc.astype(np.int32),
          "decoder_input_tokens": dec.astype(np.int32)}


def _hf_forward(model, batch):
  import torch

  enc = torch.tensor(batch["encoder_input_tokens"], dtype=torch.long)
  with torch.no_grad():
    out = model(input_ids=enc, attention_mask=(enc != 0).long(),
                decoder_input_ids=torch.tensor(batch["decoder_input_tokens"], dtype=torch.long))
  return out.encoder_last_hidden_state.numpy(), out.logits.numpy()


@pytest.fixture(scope="module")
def flan(tmp_path_factory):
  """(directory, HF model, HF encoder output, HF logits) of a Flan-T5-shaped model."""
  model = _hf_model("gated-gelu", tie=False, seed=0)
  path = str(tmp_path_factory.mktemp("flan"))
  model.save_pretrained(path)
  return path, model, *_hf_forward(model, _batch())


def _paxlike_forward(model, params, batch):
  import jax

  both = jax.jit(lambda p, b: model.apply({"params": p}, b, method=lambda m, b: (m.encode(b),
                                                                                  m(b))))
  encoded, logits = both(params, batch)
  return np.asarray(encoded), np.asarray(logits)


@pytest.mark.parametrize("scanned", [False, True], ids=["unrolled", "scanned"])
def test_flan_t5_import_matches_transformers(flan, scanned):
  from paxlike.interop import hf

  path, _, hf_encoded, hf_logits = flan
  model = _paxlike_model(scanned=scanned)
  params = hf.import_params(path, model)
  batch = _batch()
  encoded, logits = _paxlike_forward(model, params, batch)
  real = batch["encoder_input_tokens"] != 0
  enc_diff = np.abs(encoded - hf_encoded)[real].max()
  logit_diff = np.abs(logits - hf_logits).max()
  assert enc_diff < 1e-4, f"encoder output differs from transformers by {enc_diff}"
  assert logit_diff < 1e-4, f"logits differ from transformers by {logit_diff}"
  assert np.abs(hf_logits).max() > 1.0  # the comparison is not between near-zero numbers


def test_import_gives_the_model_init_tree(flan):
  """The imported tree has exactly the paths, shapes and dtype of the model's own init."""
  import jax
  import jax.numpy as jnp
  from flax import linen as nn

  from paxlike.interop import hf

  for scanned in (False, True):
    model = _paxlike_model(scanned=scanned)
    params = hf.import_params(flan[0], model)
    init = jax.eval_shape(lambda m=model: m.init(jax.random.key(0), jax.tree.map(
        jnp.asarray, {**_batch(), "decoder_target_tokens": _batch()["decoder_input_tokens"],
                      "decoder_loss_weights": np.ones((3, DEC_LEN), np.float32)}),
        method="fprop"))["params"]
    want = jax.tree.map(lambda x: (x.shape, x.dtype), nn.meta.unbox(init))
    got = jax.tree.map(lambda x: (x.shape, x.dtype), params)
    assert got == want


def test_greedy_decode_matches_transformers_generate(flan):
  import jax
  import torch

  from paxlike.decoding import DecodeSettings
  from paxlike.interop import hf

  path, hf_model, _, _ = flan
  steps = 8
  batch = {"encoder_input_tokens": _batch()["encoder_input_tokens"]}
  enc = torch.tensor(batch["encoder_input_tokens"], dtype=torch.long)
  with torch.no_grad():
    want = hf_model.generate(input_ids=enc, attention_mask=(enc != 0).long(), do_sample=False,
                             num_beams=1, max_new_tokens=steps).numpy()[:, 1:]
  model = _paxlike_model(scanned=True)
  params = hf.import_params(path, model)
  settings = DecodeSettings(max_decode_length=steps)
  out = jax.jit(lambda p, b: model.decode(p, b, jax.random.key(0), settings))(params, batch)
  got = np.asarray(out.tokens)[:, 0]
  assert got.shape == (len(ENC_LENS), steps)

  def upto_eos(row):
    row = list(row)
    return row[:row.index(1) + 1] if 1 in row else row

  for r in range(len(got)):
    assert upto_eos(got[r]) == upto_eos(want[r]), f"row {r}: {got[r]} vs transformers {want[r]}"
  assert any(1 in upto_eos(w) and len(upto_eos(w)) < steps for w in want), (
      "no row ended early: the EOS handling went untested")


def test_export_reloads_in_transformers(flan, tmp_path):
  import torch
  from transformers import T5ForConditionalGeneration

  from paxlike.interop import hf

  path, _, _, hf_logits = flan
  model = _paxlike_model(scanned=True)
  hf.export_params(hf.import_params(path, model), model, str(tmp_path / "out"))
  reloaded, info = T5ForConditionalGeneration.from_pretrained(str(tmp_path / "out"),
                                                              output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert not info["mismatched_keys"], info
  _, logits = _hf_forward(reloaded.eval(), _batch())
  diff = np.abs(logits - hf_logits).max()
  assert diff < 1e-5, f"exported model's logits differ by {diff}"
  assert not torch.equal(reloaded.lm_head.weight, reloaded.shared.weight)


def test_sharded_checkpoint_imports_the_same_params(flan, tmp_path):
  import jax

  from paxlike.interop import hf

  path, hf_model, _, _ = flan
  sharded = tmp_path / "sharded"
  hf_model.save_pretrained(str(sharded), max_shard_size="20KB")
  shards = [f for f in os.listdir(sharded) if f.startswith("model-")]
  assert len(shards) > 2 and (sharded / "model.safetensors.index.json").exists(), shards
  model = _paxlike_model()
  single, split = hf.import_params(path, model), hf.import_params(str(sharded), model)
  assert jax.tree.structure(single) == jax.tree.structure(split)
  jax.tree.map(np.testing.assert_array_equal, single, split)


def test_tied_relu_t5_matches_transformers(tmp_path):
  from paxlike.interop import hf

  hf_model = _hf_model("relu", tie=True, seed=1)
  hf_model.save_pretrained(str(tmp_path))
  model = _paxlike_model("relu", tie=True)
  params = hf.import_params(str(tmp_path), model)
  assert "logits_dense" not in params["decoder"]
  batch = _batch()
  hf_encoded, hf_logits = _hf_forward(hf_model, batch)
  encoded, logits = _paxlike_forward(model, params, batch)
  real = batch["encoder_input_tokens"] != 0
  enc_diff = np.abs(encoded - hf_encoded)[real].max()
  logit_diff = np.abs(logits - hf_logits).max()
  assert enc_diff < 1e-4, f"encoder output differs from transformers by {enc_diff}"
  assert logit_diff < 1e-4, f"logits differ from transformers by {logit_diff}"


def test_bfloat16_checkpoint_imports_as_float32(flan, tmp_path):
  import torch

  from paxlike.interop import hf

  _, hf_model, _, _ = flan
  half = _hf_model("gated-gelu", tie=False, seed=0).to(torch.bfloat16)
  half.save_pretrained(str(tmp_path))
  params = hf.import_params(str(tmp_path), _paxlike_model())
  want = hf_model.shared.weight.detach().to(torch.bfloat16).float().numpy()
  assert params["token_embedder"]["embedding"].dtype == np.float32
  np.testing.assert_array_equal(params["token_embedder"]["embedding"], want)


# ------------------------------------------------------------------ errors


def _write_config(directory, **changes):
  os.makedirs(directory, exist_ok=True)
  config = {**_paxlike_model().hf_config(), **changes}
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f)


def test_check_config_names_the_field_and_both_values(tmp_path):
  from paxlike.errors import UserError
  from paxlike.interop import hf

  _write_config(tmp_path, d_model=64)
  with pytest.raises(UserError) as e:
    hf.check_config(hf.read_config(str(tmp_path)), _paxlike_model())
  msg = str(e.value)
  assert "d_model=64" in msg and "MODEL_DIMS=32" in msg and str(tmp_path) in msg, msg

  _write_config(tmp_path / "relu", feed_forward_proj="relu")
  with pytest.raises(UserError, match="feed_forward_proj='relu'.*ACTIVATION='gated-gelu'"):
    hf.check_config(hf.read_config(str(tmp_path / "relu")), _paxlike_model())

  # transformers 5 writes tie_word_embeddings=true with scale_decoder_outputs=false for an
  # untied (Flan-T5) model: that is not a tied one.
  _write_config(tmp_path / "hf5", tie_word_embeddings=True, scale_decoder_outputs=False)
  hf.check_config(hf.read_config(str(tmp_path / "hf5")), _paxlike_model())
  _write_config(tmp_path / "tied", tie_word_embeddings=True, scale_decoder_outputs=True)
  with pytest.raises(UserError, match="TIE_EMBEDDINGS=False"):
    hf.check_config(hf.read_config(str(tmp_path / "tied")), _paxlike_model())
  # generate() would start decoding at 5; paxlike's T5 starts at 0.
  _write_config(tmp_path / "start5", decoder_start_token_id=5)
  with pytest.raises(UserError, match="decoder_start_token_id=5, and paxlike's T5 starts "
                                      "decoding at 0"):
    hf.check_config(hf.read_config(str(tmp_path / "start5")), _paxlike_model())


def test_missing_or_foreign_checkpoints_are_user_errors(flan, tmp_path):
  from safetensors.numpy import load_file, save_file

  from paxlike.errors import UserError
  from paxlike.interop import hf

  model = _paxlike_model()
  with pytest.raises(UserError, match="does not exist"):
    hf.read_config(str(tmp_path / "nowhere"))
  os.makedirs(tmp_path / "empty")
  with pytest.raises(UserError, match="has no config.json"):
    hf.import_params(str(tmp_path / "empty"), model)
  _write_config(tmp_path / "bert", model_type="bert")
  with pytest.raises(UserError, match="model_type='bert'"):
    hf.import_params(str(tmp_path / "bert"), model)
  _write_config(tmp_path / "noweights")
  with pytest.raises(UserError, match="neither model.safetensors"):
    hf.import_params(str(tmp_path / "noweights"), model)

  # A checkpoint that lacks one tensor.
  tensors = load_file(os.path.join(flan[0], "model.safetensors"))
  name = "decoder.block.1.layer.1.EncDecAttention.k.weight"
  del tensors[name]
  _write_config(tmp_path / "partial")
  save_file(tensors, str(tmp_path / "partial" / "model.safetensors"), metadata={"format": "pt"})
  with pytest.raises(UserError, match=name.replace(".", r"\.")):
    hf.import_params(str(tmp_path / "partial"), model)

  # An unreadable shard.
  _write_config(tmp_path / "broken")
  (tmp_path / "broken" / "model.safetensors").write_bytes(b"not a safetensors file")
  with pytest.raises(UserError, match="cannot read the safetensors file"):
    hf.import_params(str(tmp_path / "broken"), model)


def test_export_refuses_a_non_empty_directory(flan, tmp_path):
  from paxlike.errors import UserError
  from paxlike.interop import hf
  from paxlike.models.language_model import LanguageModel

  model = _paxlike_model()
  params = hf.import_params(flan[0], model)
  (tmp_path / "keep.txt").write_text("mine")
  with pytest.raises(UserError, match="not empty"):
    hf.export_params(params, model, str(tmp_path))
  assert sorted(os.listdir(tmp_path)) == ["keep.txt"]
  lm = LanguageModel(vocab_size=8, model_dims=4, num_layers=1, num_heads=1, dim_per_head=4,
                     hidden_dims=8)
  with pytest.raises(UserError, match="LanguageModel has no Hugging Face layout; only the T5 "
                     "and Llama families .*--export_format=stablehlo exports any model"):
    hf.export_params({}, lm, str(tmp_path / "lm"))
