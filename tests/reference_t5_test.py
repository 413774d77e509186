"""benchmarks/reference_t5.py against transformers' T5, and its train step.

The reference is the yardstick paxlike's T5 is timed (and checked) against,
so its math is pinned here to transformers' T5ForConditionalGeneration: a
small random HF model's weights are converted into the reference's tree and
both must give the same logits.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from benchmarks import reference_t5 as ref  # noqa: E402

VOCAB, D_MODEL, HEADS, D_KV, D_FF = 96, 32, 4, 12, 40  # heads x d_kv = 48 != d_model
ENC_LAYERS, DEC_LAYERS = 3, 2
BUCKETS, MAX_DISTANCE = 32, 32
# Lengths past every stack's exact buckets (8 encoder, 16 decoder), so the log-spaced ones and
# the max-distance cap are exercised.
ENC_LEN, DEC_LEN = 40, 36
ATOL = 1e-4


@functools.cache
def hf_model(feed_forward_proj: str, tie: bool, seed: int = 0):
  """A small random T5ForConditionalGeneration, dropout off, in eval mode (built once)."""
  torch.manual_seed(seed)
  config = transformers.T5Config(
      vocab_size=VOCAB, d_model=D_MODEL, d_kv=D_KV, d_ff=D_FF, num_layers=ENC_LAYERS,
      num_decoder_layers=DEC_LAYERS, num_heads=HEADS, relative_attention_num_buckets=BUCKETS,
      relative_attention_max_distance=MAX_DISTANCE, feed_forward_proj=feed_forward_proj,
      tie_word_embeddings=tie, dropout_rate=0.0, pad_token_id=0, eos_token_id=1,
      decoder_start_token_id=0)
  model = transformers.T5ForConditionalGeneration(config)
  if not tie:
    # transformers 5 shares lm_head's storage with `shared` even for tie_word_embeddings=False
    # (it only drops the output scaling), so give the head weights of its own: the reference
    # must read decoder/logits_dense/kernel, not the embedding.
    model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, D_MODEL) * D_MODEL ** -0.5)
  # A non-trivial norm scale, so a mixed-up norm cannot hide behind ones.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("layer_norm.weight"):
        p.mul_(1.0 + 0.1 * torch.randn_like(p))
  return model.eval()


def ref_config(model, use_repeated_layer: bool, **kwargs) -> ref.T5RefConfig:
  c = model.config
  return ref.T5RefConfig(
      vocab_size=c.vocab_size, model_dims=c.d_model, num_encoder_layers=c.num_layers,
      num_decoder_layers=c.num_decoder_layers, num_heads=c.num_heads, dim_per_head=c.d_kv,
      hidden_dims=c.d_ff, activation="gated-gelu" if c.is_gated_act else "relu",
      tie_embeddings=c.scale_decoder_outputs,
      relative_attention_num_buckets=c.relative_attention_num_buckets,
      relative_attention_max_distance=c.relative_attention_max_distance,
      layer_norm_epsilon=c.layer_norm_epsilon, use_repeated_layer=use_repeated_layer, **kwargs)


def params_from_hf(model, cfg: ref.T5RefConfig) -> ref.Params:
  """HF's state dict -> the reference's (= paxlike's) parameter tree, float32 numpy."""
  sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
  d, n, h = cfg.model_dims, cfg.num_heads, cfg.dim_per_head

  def attn(prefix):
    # torch Linear weight is [out, in]; q/k/v's out is heads*d_kv, o's in is.
    return {"query": {"kernel": sd[prefix + "q.weight"].T.reshape(d, n, h)},
            "key": {"kernel": sd[prefix + "k.weight"].T.reshape(d, n, h)},
            "value": {"kernel": sd[prefix + "v.weight"].T.reshape(d, n, h)},
            "out": {"kernel": sd[prefix + "o.weight"].T.reshape(n, h, d)}}

  def mlp(prefix):
    if cfg.activation == "gated-gelu":
      names = ("wi_0", "wi_1", "wo")
    else:
      names = ("wi", "wo")
    return {k: {"kernel": sd[f"{prefix}DenseReluDense.{k}.weight"].T} for k in names}

  def enc_layer(i):
    b = f"encoder.block.{i}.layer."
    return {"pre_attention_layer_norm": {"scale": sd[b + "0.layer_norm.weight"]},
            "attention": attn(b + "0.SelfAttention."),
            "pre_mlp_layer_norm": {"scale": sd[b + "1.layer_norm.weight"]},
            "mlp": mlp(b + "1.")}

  def dec_layer(i):
    b = f"decoder.block.{i}.layer."
    return {"pre_self_attention_layer_norm": {"scale": sd[b + "0.layer_norm.weight"]},
            "self_attention": attn(b + "0.SelfAttention."),
            "pre_cross_attention_layer_norm": {"scale": sd[b + "1.layer_norm.weight"]},
            "encoder_decoder_attention": attn(b + "1.EncDecAttention."),
            "pre_mlp_layer_norm": {"scale": sd[b + "2.layer_norm.weight"]},
            "mlp": mlp(b + "2.")}

  def layers(make, num):
    per_layer = [make(i) for i in range(num)]
    if cfg.use_repeated_layer:
      return {"layers": jax.tree.map(lambda *xs: np.stack(xs), *per_layer)}
    return {f"layers_{i}": p for i, p in enumerate(per_layer)}

  rel = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"  # [buckets, heads]
  params = {
      "token_embedder": {"embedding": sd["shared.weight"]},
      "encoder": {"relpos_bias": {"rel_embedding": sd["encoder." + rel]},
                  **layers(enc_layer, cfg.num_encoder_layers),
                  "encoder_norm": {"scale": sd["encoder.final_layer_norm.weight"]}},
      "decoder": {"relpos_bias": {"rel_embedding": sd["decoder." + rel]},
                  **layers(dec_layer, cfg.num_decoder_layers),
                  "decoder_norm": {"scale": sd["decoder.final_layer_norm.weight"]}},
  }
  if not cfg.tie_embeddings:
    params["decoder"]["logits_dense"] = {"kernel": sd["lm_head.weight"].T}
  return jax.tree.map(jnp.asarray, params)


def padded_batch(seed: int = 0) -> dict[str, np.ndarray]:
  """Three rows, the encoder inputs padded to different lengths (one not at all)."""
  rng = np.random.default_rng(seed)
  b = 3
  enc = rng.integers(1, VOCAB, (b, ENC_LEN), dtype=np.int32)
  for row, length in enumerate((ENC_LEN, 23, 7)):
    enc[row, length:] = 0
  targets = rng.integers(1, VOCAB, (b, DEC_LEN), dtype=np.int32)
  weights = np.ones((b, DEC_LEN), np.float32)
  for row, length in enumerate((DEC_LEN, 30, 11)):
    targets[row, length:] = 0
    weights[row, length:] = 0.0
  dec = np.concatenate([np.zeros((b, 1), np.int32), targets[:, :-1]], axis=1)  # shifted right
  return {"encoder_input_tokens": enc, "decoder_input_tokens": dec,
          "decoder_target_tokens": targets, "decoder_loss_weights": weights}


def hf_outputs(model, batch):
  """HF's (encoder output, logits, loss), the padding masked via attention_mask."""
  enc = torch.from_numpy(batch["encoder_input_tokens"]).long()
  labels = np.where(batch["decoder_loss_weights"] > 0, batch["decoder_target_tokens"], -100)
  with torch.no_grad():
    out = model(input_ids=enc, attention_mask=(enc != 0).long(),
                decoder_input_ids=torch.from_numpy(batch["decoder_input_tokens"]).long(),
                labels=torch.from_numpy(labels).long())
  return out.encoder_last_hidden_state.numpy(), out.logits.numpy(), float(out.loss)


def assert_matches_hf(model, use_repeated_layer: bool) -> None:
  cfg = ref_config(model, use_repeated_layer)
  params = params_from_hf(model, cfg)
  batch = padded_batch()
  hf_encoded, hf_logits, hf_loss = hf_outputs(model, batch)
  # One compile for both: jit's time dominates this test.
  encoded, logits, loss = jax.jit(
      lambda p, b: (*ref.forward(cfg, p, b), ref.loss_fn(cfg, p, b)[0]))(params, batch)
  encoded, logits = np.asarray(encoded), np.asarray(logits)
  assert logits.shape == hf_logits.shape == (3, DEC_LEN, VOCAB)
  # Padded encoder positions too: HF masks padding as keys only, as the reference does.
  np.testing.assert_allclose(encoded, hf_encoded, atol=ATOL, rtol=0)
  np.testing.assert_allclose(logits, hf_logits, atol=ATOL, rtol=0)
  np.testing.assert_allclose(float(loss), hf_loss, atol=ATOL, rtol=0)
  # The logits are not near-constant, so the tolerance means something.
  assert np.std(hf_logits) > 0.3


@pytest.mark.parametrize("use_repeated_layer", [False, True], ids=["unrolled", "repeated"])
def test_gated_gelu_untied_logits_match_transformers(use_repeated_layer):
  assert_matches_hf(hf_model("gated-gelu", tie=False), use_repeated_layer)


def test_relu_tied_logits_match_transformers():
  assert_matches_hf(hf_model("relu", tie=True, seed=1), use_repeated_layer=True)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_buckets_match_transformers(bidirectional):
  from transformers.models.t5.modeling_t5 import T5Attention

  q_len, k_len = 300, 700
  for buckets, max_distance in ((32, 128), (32, 32), (64, 256)):
    rel = torch.arange(k_len)[None, :] - torch.arange(q_len)[:, None]
    want = T5Attention._relative_position_bucket(rel, bidirectional, buckets, max_distance)
    got = ref.relative_position_buckets(q_len, k_len, bidirectional, buckets, max_distance)
    np.testing.assert_array_equal(got, want.numpy())


def test_train_step_lowers_loss():
  cfg = ref.T5RefConfig(
      vocab_size=VOCAB, model_dims=D_MODEL, num_encoder_layers=ENC_LAYERS,
      num_decoder_layers=DEC_LAYERS, num_heads=HEADS, dim_per_head=D_KV, hidden_dims=D_FF,
      relative_attention_max_distance=MAX_DISTANCE, use_repeated_layer=True,
      checkpoint_policy="SAVE_CONTEXT_AND_OUT_PROJ", learning_rate=3e-3, warmup_steps=5,
      clip_gradient_norm_to_value=1.0)
  state = ref.init_state(cfg, ref.init_params(cfg, jax.random.key(0)))
  batch = jax.tree.map(jnp.asarray, padded_batch(seed=1))
  # make_train_step's own jit, compiled without XLA's backend optimisations: they would take
  # most of this test's time, and the loss going down does not depend on them.
  step = ref.make_train_step(cfg).lower(state, batch).compile(
      {"xla_backend_optimization_level": 0})
  losses = []
  for _ in range(30):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  assert set(metrics) >= {"loss", "grad_norm", "learning_rate"}
  assert int(state["step"]) == 30
  assert float(metrics["learning_rate"]) == pytest.approx(3e-3)
  assert np.isfinite(losses).all()
  assert losses[-1] < 0.5 * losses[0], losses


def test_bfloat16_loss_close_to_transformers():
  """The benchmark's usual dtype (weights float32, compute bfloat16) stays near HF's loss."""
  model = hf_model("gated-gelu", tie=False)
  cfg = ref_config(model, use_repeated_layer=True, dtype=jnp.bfloat16)
  batch = padded_batch()
  loss, _ = jax.jit(lambda p, b: ref.loss_fn(cfg, p, b))(params_from_hf(model, cfg), batch)
  assert float(loss) == pytest.approx(hf_outputs(model, batch)[2], rel=2e-2)


def test_params_from_paxlike_keeps_the_tree():
  cfg = ref.T5RefConfig(
      vocab_size=VOCAB, model_dims=D_MODEL, num_encoder_layers=ENC_LAYERS,
      num_decoder_layers=DEC_LAYERS, num_heads=HEADS, dim_per_head=D_KV, hidden_dims=D_FF)
  shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                        ref.init_params(cfg, jax.random.key(0)))
  assert ref.params_from_paxlike(cfg, {"params": shapes}) == shapes
  assert shapes["encoder"]["layers"]["attention"]["query"]["kernel"].shape == (
      ENC_LAYERS, D_MODEL, HEADS, D_KV)
  unrolled = dataclasses.replace(cfg, use_repeated_layer=False)
  with pytest.raises(ValueError, match="use_repeated_layer"):
    ref.params_from_paxlike(unrolled, shapes)
