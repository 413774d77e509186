"""BERT's masked LM (praxis's BertModel on paxlike's LM): bidirectional attention, the
corruption's shares, a loss on the masked tokens only, label smoothing, Pax's BERT
templates and their knobs, and the shipped BertTiny learning."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import describe, expected_param_count, parse_trained_line, run_cli

from paxlike import config, experiment, registry
from paxlike import train_state as ts
from paxlike.errors import UserError
from paxlike.layers.masking import MlmMasking, jax_samplers, numpy_samplers
from paxlike.models.bert import BertModel
from paxlike.models.language_model import LanguageModel, softmax_cross_entropy

DIMS = {"vocab_size": 64, "model_dims": 32, "num_layers": 2, "num_heads": 4, "dim_per_head": 8,
        "hidden_dims": 64, "use_repeated_layer": False, "packed_input": True}


def _params(model, batch):
  return model.init(jax.random.key(0), batch, method="fprop")["params"]


def test_every_token_sees_the_tokens_after_it_as_bert_and_not_as_the_lm():
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 64, (2, 12)), jnp.int32)
  later = ids.at[:, -1].set((ids[:, -1] + 1) % 64)
  for model, sees_ahead in ((BertModel(**DIMS), True), (LanguageModel(**DIMS), False)):
    params = _params(model, {"labels": ids, "weights": jnp.ones(ids.shape), "ids": ids})
    first = [model.apply({"params": params}, x)[:, 0] for x in (ids, later)]
    assert bool(jnp.any(jnp.abs(first[0] - first[1]) > 1e-6)) == sees_ahead, type(model)


def test_the_loss_is_scored_on_the_masked_positions_only():
  rng = np.random.default_rng(1)
  labels = jnp.asarray(rng.integers(1, 64, (2, 10)), jnp.int32)
  masked_pos = jnp.zeros((2, 10)).at[0, 3].set(1.0).at[1, 7].set(1.0)
  batch = {"labels": labels, "masked_ids": jnp.where(masked_pos > 0, 5, labels),
           "masked_pos": masked_pos, "paddings": jnp.zeros((2, 10))}
  model = BertModel(**DIMS)
  params = _params(model, batch)
  loss, metrics = model.apply({"params": params}, batch, method="fprop")
  assert float(metrics["num_tokens"]) == 2.0 and float(metrics["num_real_tokens"]) == 20.0
  # The target of an unmasked position does not count; a masked one's does.
  unmasked = {**batch, "labels": labels.at[0, 0].set((labels[0, 0] + 1) % 64)}
  masked = {**batch, "labels": labels.at[0, 3].set((labels[0, 3] + 1) % 64)}
  # (the input ids stay: only the scored target moves)
  loss_u, _ = model.apply({"params": params}, {**unmasked, "masked_ids": batch["masked_ids"]},
                          method="fprop")
  loss_m, _ = model.apply({"params": params}, masked, method="fprop")
  assert float(loss_u) == pytest.approx(float(loss), rel=1e-6)
  assert float(loss_m) != pytest.approx(float(loss), rel=1e-4)


@pytest.mark.parametrize("kind", ["numpy", "jax"])
def test_the_corruption_picks_15_percent_of_the_tokens_80_10_10_and_never_padding(kind):
  masking = MlmMasking(vocab_size=1000, mask_token_id=3)
  rng = np.random.default_rng(2)
  ids = rng.integers(10, 1000, (64, 256)).astype(np.int32)
  paddings = np.zeros(ids.shape, np.float32)
  paddings[:, 200:] = 1.0
  if kind == "numpy":
    out, picked = masking.apply(ids, paddings, *numpy_samplers(np.random.default_rng(3)))
  else:
    out, picked = jax.jit(lambda i, p, k: masking.apply(i, p, *jax_samplers(k)))(
        jnp.asarray(ids), jnp.asarray(paddings), jax.random.key(3))
  out, picked = np.asarray(out), np.asarray(picked)
  assert picked[:, 200:].sum() == 0 and (out[:, 200:] == ids[:, 200:]).all()
  n = picked.sum()
  assert 0.14 < n / picked[:, :200].size < 0.16
  assert (out[picked == 0] == ids[picked == 0]).all()
  as_mask = (out == 3) & (picked > 0)
  changed = (out != ids) & (out != 3)
  kept = (out == ids) & (picked > 0)
  assert 0.77 < as_mask.sum() / n < 0.83
  assert 0.07 < changed.sum() / n < 0.13
  assert 0.07 < kept.sum() / n < 0.13


@pytest.mark.parametrize("classes, scale", [(7, 1.0), (32000, 30.0)])
def test_label_smoothing_is_praxis_s_targets(classes, scale):
  """Against float64 numpy, from a small vocabulary to BERT's with logits near its cap of 30."""
  rng = np.random.default_rng(4)
  logits = (scale * np.tanh(rng.standard_normal((3, 5, classes)))).astype(np.float32)
  labels = rng.integers(classes, size=(3, 5))
  p = 0.1
  targets = np.full(logits.shape, p / (classes - 1))
  np.put_along_axis(targets, labels[..., None], 1 - p, axis=-1)
  x = logits.astype(np.float64)
  log_probs = x - x.max(-1, keepdims=True)
  log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
  plain, smoothed = softmax_cross_entropy(jnp.asarray(logits), jnp.asarray(labels), p)
  np.testing.assert_allclose(np.asarray(smoothed), -(targets * log_probs).sum(-1), rtol=1e-5)
  want_plain = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(plain), want_plain, rtol=1e-5)
  unsmoothed = softmax_cross_entropy(jnp.asarray(logits), jnp.asarray(labels))
  for got in unsmoothed:
    np.testing.assert_allclose(np.asarray(got), want_plain, rtol=1e-5)


def test_bert_s_loss_is_smoothed_and_its_log_pplx_is_not():
  rng = np.random.default_rng(5)
  labels = jnp.asarray(rng.integers(1, 64, (2, 10)), jnp.int32)
  masked_pos = jnp.zeros((2, 10)).at[:, 2:5].set(1.0)
  batch = {"labels": labels, "masked_ids": jnp.where(masked_pos > 0, 5, labels),
           "masked_pos": masked_pos, "paddings": jnp.zeros((2, 10))}
  plain, smoothed = BertModel(**DIMS), BertModel(**DIMS, label_smoothing_prob=0.1)
  params = _params(plain, batch)
  (loss0, m0), (loss1, m1) = (m.apply({"params": params}, batch, method="fprop")
                              for m in (plain, smoothed))
  assert float(m1["log_pplx"]) == pytest.approx(float(m0["log_pplx"]), rel=1e-6)
  assert float(loss0) == pytest.approx(float(m0["log_pplx"]), rel=1e-6)
  assert abs(float(loss1) - float(loss0)) > 1e-3


def test_pax_bert_templates_keep_paxs_values_under_paxs_names():
  exp = experiment.instantiate(registry.get("experiments.lm.bert.BertSpmdL4H128"))
  exp.validate()
  model = config.build(exp.task()).model
  assert isinstance(model, BertModel)
  assert (exp.ICI_MESH_SHAPE, model.fprop_dtype, model.combine_qkv) == (
      [1, 4, 2], jnp.bfloat16, True)
  assert (model.softmax_cap_logits, model.atten_logit_cap, model.use_bias) == (30.0, 50.0, False)
  assert model.softmax_weight_init == ("gaussian", pytest.approx(128 ** -0.5))
  assert (exp.LR_LRED_DECAY_END, exp.CHECKPOINT_MAX_TO_KEEP) == (100000, 10)
  pmap = experiment.instantiate(registry.get("experiments.lm.bert.BertAdamL4H128"),
                                ["ENABLE_BFLOAT16=False", "DECAY_END=400000"])
  model = config.build(pmap.task()).model
  assert (pmap.ICI_MESH_SHAPE, model.fprop_dtype, model.combine_qkv) == (None, jnp.float32,
                                                                         False)
  assert pmap.LR_LRED_DECAY_END == 400000
  batch = {"labels": jax.ShapeDtypeStruct((1, 8), jnp.int32)}
  params = jax.eval_shape(lambda: ts.init_params(model, jax.random.key(0),
                                                 model.init_batch(batch)))
  assert ts.count_params(params) == expected_param_count(4, 128, 512, 32000, 16)


@pytest.mark.parametrize(("override", "message"), [
    ("FPROP_DTYPE=float32", "BertTiny's FPROP_DTYPE is Pax's ENABLE_BFLOAT16; set "
     "ENABLE_BFLOAT16."),
    ("MASK_TOKEN_ID=-1", "BertTiny: the masked-LM corruption needs a mask_token_id >= 0, "
     "got -1."),
])
def test_bad_bert_knobs_are_one_line(override, message):
  with pytest.raises(UserError) as err:
    experiment.instantiate(registry.get("experiments.lm.bert.BertTiny"), [override]).validate()
  assert str(err.value) == message


def test_bert_tiny_learns_to_restore_masked_tokens_on_the_pmap_loop(tmp_path):
  # 120 steps: on XLA's optimised CPU backend they save more than its slower compile costs.
  proc = run_cli(["--exp=BertTiny", f"--job_log_dir={tmp_path / 'job'}",
                  "--set", "NUM_TRAIN_STEPS=120"], cwd=tmp_path, optimized=True)
  assert proc.returncode == 0, describe(proc)
  trained = parse_trained_line(proc.stdout)
  assert trained["last_loss"] < trained["first_loss"] - 0.7, trained
  # It generates nothing: exporting the trained job is one sentence, and writes nothing.
  before = sorted(p.name for p in (tmp_path / "job").iterdir())
  proc = run_cli(["--exp=BertTiny", f"--job_log_dir={tmp_path / 'job'}", "--mode=export",
                  "--export_format=stablehlo"], cwd=tmp_path)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, describe(proc)
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "error: a BERT masked language model (BertModel) does not generate text"), describe(proc)
  assert sorted(p.name for p in (tmp_path / "job").iterdir()) == before


def test_a_mesh_the_devices_do_not_fill_is_named_by_paxs_mesh_shape(tmp_path):
  job = tmp_path / "job"
  proc = run_cli(["--exp=BertSpmdL4H128", f"--job_log_dir={job}"], cwd=tmp_path)
  assert proc.returncode == 2, describe(proc)
  assert proc.stderr.strip().splitlines()[-1] == (
      "error: the mesh MESH_SHAPE=[1, 4, 2] x DCN_MESH_SHAPE=[1, 1, 1] needs 8 devices but 1 "
      "is available; change the mesh shape or the device count."), describe(proc)
  assert not job.exists()
