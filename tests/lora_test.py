"""LoRA (Pax's USE_LORA, LORA_RANK, LORA_TARGET_LAYERS): adapters on a decoder, trained alone.

Model-level: a fresh adapter changes nothing, LORA_TARGET_LAYERS picks the
projections, and merge_lora folds trained adapters into weights that give the
same logits. Runs: a LoRA fine-tune from a base job changes only the adapters
and keeps optimizer slots for them only; a Llama LoRA fine-tune from a
Hugging Face checkpoint exports weights transformers loads with the same
logits; bad knobs are one line.
"""

from __future__ import annotations

import re

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO_ROOT, describe, parse_trained_line, run_cli

from paxlike import experiment, registry
from paxlike.errors import UserError
from paxlike.initial import flat_names
from paxlike.layers.linear import LORA_NAMES, merge_lora
from paxlike.models.language_model import LanguageModel
from paxlike.models.llama import LlamaModel

BATCH = {"ids": (np.arange(32).reshape(2, 16) * 7 % 61).astype(np.int32),
         "weights": np.ones((2, 16), np.float32)}
BATCH["labels"] = np.roll(BATCH["ids"], -1, axis=1)


def _model(family: str, **kw):
  if family == "lm":
    return LanguageModel(vocab_size=64, model_dims=32, num_layers=2, num_heads=4,
                         dim_per_head=8, hidden_dims=64, use_gated_activation=True, **kw)
  return LlamaModel(vocab_size=64, model_dims=32, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=8, hidden_dims=48, max_seq_len=16, **kw)


def _without_lora(params):
  flat = flax.traverse_util.flatten_dict(params)
  return flax.traverse_util.unflatten_dict(
      {k: v for k, v in flat.items() if not re.fullmatch(LORA_NAMES, "/".join(k))})


def _with_trained_adapters(params):
  """params with every lora_b drawn (x 0.3): adapters that move the model's function."""
  keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(params))))
  return jax.tree_util.tree_map_with_path(
      lambda path, x: jax.random.normal(next(keys), x.shape) * 0.3
      if str(path[-1].key).endswith("lora_b") else x, params)


def _logits(model, params):
  return np.asarray(model.apply({"params": params}, jnp.asarray(BATCH["ids"])))


@pytest.mark.parametrize("family,scanned,targets", [
    ("lm", True, "all"), ("lm", False, "attention"), ("lm", True, "mlp"),
    ("llama", True, "all"), ("llama", False, "attention")])
def test_adapters_start_neutral_sit_where_asked_and_merge_into_the_weights(family, scanned,
                                                                           targets):
  model = _model(family, lora_rank=4, lora_target_layers=targets, use_repeated_layer=scanned)
  params = flax.linen.unbox(model.init(jax.random.key(0), BATCH, method="fprop")["params"])
  adapted = {n.rsplit("/", 1)[0] for n in flat_names(params) if re.fullmatch(LORA_NAMES, n)}
  attention = {n for n in adapted if "attention" in n or "self_attn" in n}
  assert bool(attention) == (targets in ("all", "attention")), sorted(adapted)
  assert bool(adapted - attention) == (targets in ("all", "mlp")), sorted(adapted)
  # The output projection has one too (praxis's proj_tpl is the output's as well): the
  # LM's `post` weight lives in the attention module itself.
  assert any(n.endswith(("/attention", "/o_proj")) for n in attention) == bool(attention)

  plain = _model(family, use_repeated_layer=scanned)
  np.testing.assert_array_equal(_logits(model, params), _logits(plain, _without_lora(params)))

  # A trained adapter moves the logits, and merged into its weight moves them the same.
  trained = _with_trained_adapters(params)
  lora_logits = _logits(model, trained)
  assert np.abs(lora_logits - _logits(model, params)).max() > 1e-2
  np.testing.assert_allclose(_logits(plain, merge_lora(trained)), lora_logits, atol=2e-5)


TINY_LM = ["--exp=LmCloudSpmdTiny", "--set", "SUMMARY_INTERVAL_STEPS=5", "--set",
           "CHECKPOINT_EVERY_N_STEPS=100", "--set", "EVAL_INTERVAL_STEPS=0"]


def _restored_params(job, step=None):
  """(step, the stored state as host arrays) of job's checkpoint at step (None: the latest)."""
  from paxlike import checkpoints

  ckpt = checkpoints.Checkpointer(str(job / "checkpoints"), read_only=True)
  step = max(ckpt.all_steps()) if step is None else step
  state, _ = ckpt.restore_host(step)
  ckpt.close()
  return step, state


def test_a_lora_fine_tune_changes_only_its_adapters_and_keeps_slots_for_them(tmp_path):
  base = tmp_path / "base"
  proc = run_cli([*TINY_LM, f"--job_log_dir={base}", "--set", "NUM_TRAIN_STEPS=10"], tmp_path)
  assert proc.returncode == 0, describe(proc)
  lora = tmp_path / "lora"
  proc = run_cli([*TINY_LM, f"--job_log_dir={lora}", "--set", "NUM_TRAIN_STEPS=20",
                  "--set", "USE_LORA=True", "--set", "LORA_RANK=4", "--set",
                  "LEARNING_RATE=0.01", f"--init_from=paxlike:{base}"], tmp_path)
  assert proc.returncode == 0, describe(proc)
  trained = parse_trained_line(proc.stdout)
  assert trained["last_loss"] < trained["first_loss"] - 0.05, describe(proc)
  assert re.search(r"training [\d,]+ of them \(\d+\.\d+%\)", proc.stderr), describe(proc)

  _, base_state = _restored_params(base)
  step, lora_state = _restored_params(lora)
  assert step == 20
  base_params, lora_params = flat_names(base_state["params"]), flat_names(lora_state["params"])
  adapters = {n for n in lora_params if re.fullmatch(LORA_NAMES, n)}
  assert adapters and set(lora_params) - adapters == set(base_params)
  for name, value in base_params.items():
    np.testing.assert_array_equal(lora_params[name], value, err_msg=name)
  assert all(np.abs(lora_params[n]).max() > 0 for n in adapters if n.endswith("lora_b"))
  # Adam's two moments for the adapters only: the frozen weights hold no slots.
  adapter_size = sum(lora_params[n].size for n in adapters)
  slot_size = sum(np.asarray(x).size for x in jax.tree.leaves(lora_state["opt_state"]))
  assert 2 * adapter_size <= slot_size < 2 * adapter_size + 64, (slot_size, adapter_size)

  # A later run of the job takes its adapters; one that drops them is told which knobs differ.
  proc = run_cli([*TINY_LM, f"--job_log_dir={lora}", "--set", "USE_LORA=False",
                  "--mode=export", "--export_format=stablehlo"], tmp_path)
  assert proc.returncode == 2, describe(proc)
  assert "differ in USE_LORA, LORA_RANK or LORA_TARGET_LAYERS" in proc.stderr.splitlines()[-1]


def test_a_llama_lora_fine_tune_exports_merged_weights_transformers_loads(tmp_path):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from llama_test import ROPE, TINY, _batch, _hf_logits, _hf_model, _paxlike_model
  from transformers import AutoModelForCausalLM

  hf_dir = tmp_path / "hf"
  _hf_model().save_pretrained(str(hf_dir))
  job = tmp_path / "job"
  common = ["--exp=LlamaTiny", f"--job_log_dir={job}", f"--init_from=hf:{hf_dir}", *TINY,
            "--set", "NUM_KV_HEADS=2", "--set", "ROPE_THETA=500000.0",
            "--set", f"ROPE_SCALING={ROPE!r}", "--set",
            "USE_LORA=True", "--set", "LORA_RANK=2", "--set", "NUM_TRAIN_STEPS=6",
            "--set", "LEARNING_RATE=0.01"]
  proc = run_cli(common, tmp_path, pythonpath=[REPO_ROOT])
  assert proc.returncode == 0, describe(proc)
  proc = run_cli([*common, "--mode=export", "--export_format=hf"], tmp_path,
                 pythonpath=[REPO_ROOT])
  assert proc.returncode == 0, describe(proc)
  out = re.search(r"exported step 6 as hf to (\S+)", proc.stdout)
  assert out, describe(proc)

  _, state = _restored_params(job)
  model = _paxlike_model().clone(lora_rank=2)
  ids, real = _batch()
  ours = np.asarray(model.apply({"params": state["params"]}, jnp.asarray(ids)))
  reloaded = AutoModelForCausalLM.from_pretrained(out.group(1)).eval()
  theirs = _hf_logits(reloaded, ids, real)
  assert np.abs(theirs - ours)[real].max() < 1e-4
  # The fine-tune moved the function: the export is not the checkpoint it started from.
  assert np.abs(theirs - _hf_logits(_hf_model(), ids, real))[real].max() > 1e-3


@pytest.mark.parametrize("knobs,expected", [
    ({"USE_LORA": True, "LORA_TARGET_LAYERS": "mlps"},
     r"^LORA_TARGET_LAYERS='mlps' is not one of \['all', 'attention', 'mlp'\]\.$"),
    ({"USE_LORA": True, "LORA_RANK": 0}, r"^LORA_RANK must be a positive integer, got 0\.$"),
])
def test_bad_lora_knobs_are_one_line(knobs, expected):
  cls = registry.get("LmCloudSpmdTiny")
  with pytest.raises(UserError, match=expected):
    experiment.build_checked(experiment.instantiate(type("Bad", (cls,), knobs)))


def test_a_rank_set_without_use_lora_is_refused_in_one_line(tmp_path):
  proc = run_cli([*TINY_LM, f"--job_log_dir={tmp_path / 'job'}", "--set", "LORA_RANK=4"],
                 tmp_path)
  assert proc.returncode == 2, describe(proc)
  assert "LORA_RANK" in proc.stderr.strip().splitlines()[-1]
  assert "USE_LORA is False" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("family", ["lm", "llama", "t5"])
def test_frozen_weights_get_no_gradient_and_mfu_counts_what_lora_computes(family):
  from paxlike import flops, steps
  from paxlike import train_state as ts
  from paxlike.learners import Learner
  from paxlike.models.t5 import T5Model

  batch = {"ids": jnp.zeros((8, 64), jnp.int32), "labels": jnp.zeros((8, 64), jnp.int32),
           "weights": jnp.ones((8, 64))}
  if family == "t5":
    batch = {"encoder_input_tokens": jnp.ones((8, 64), jnp.int32),
             "decoder_input_tokens": jnp.ones((8, 32), jnp.int32),
             "decoder_target_tokens": jnp.ones((8, 32), jnp.int32),
             "decoder_loss_weights": jnp.ones((8, 32))}

  def compiled_flops(model, lora: bool) -> tuple[float, object]:
    learner = Learner(bprop_variable_inclusion=[LORA_NAMES] if lora else ())
    tx = learner.transform()
    abstract, _ = ts.logical_specs(model, tx, batch)
    step = jax.jit(steps.make_train_step(model, tx, learner.lr_schedule()))
    cost = step.lower(abstract, batch, jax.random.key(0)).compile().cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["flops"], abstract

  dims = dict(vocab_size=512, model_dims=256, num_layers=2, use_repeated_layer=False)
  if family == "lm":
    make = lambda **kw: LanguageModel(num_heads=4, dim_per_head=64, hidden_dims=1024,  # noqa: E731
                                      use_gated_activation=True, combine_qkv=True, **dims, **kw)
  elif family == "llama":
    make = lambda **kw: LlamaModel(num_heads=4, num_kv_heads=2, head_dim=64,  # noqa: E731
                                   hidden_dims=768, max_seq_len=64, **dims, **kw)
  else:
    make = lambda **kw: T5Model(vocab_size=512, model_dims=256, num_encoder_layers=2,  # noqa: E731
                                num_decoder_layers=2, num_heads=4, dim_per_head=64,
                                hidden_dims=768, **kw)
  full, lora = make(), make(lora_rank=8)
  full_flops, _ = compiled_flops(full, False)
  lora_flops, abstract = compiled_flops(lora, True)
  adapters = sum(v.size for n, v in flat_names(abstract.params).items()
                 if re.fullmatch(LORA_NAMES, n))
  if family == "t5":  # every adapter is passed through by 64 encoder or 32 decoder positions
    encoder = sum(v.size for n, v in flat_names(abstract.params).items()
                  if re.fullmatch(LORA_NAMES, n) and re.match(
                      r"encoder/|.*encoder_decoder_attention/(key|value)/", n))
    assert flops._enc_dec_adapters(lora.flops_dims(64, 32), 64, 32) == (
        64 * encoder + 32 * (adapters - encoder))
  else:
    assert lora.flops_dims(64).adapter_params == adapters
  # Without the frozen weights' own gradients the compiled step does about 4/6 of the
  # weights' work (the attention's stays), and the model FLOPs that MFU divides say so too.
  model_ratio = lora.model_flops_per_step(batch) / full.model_flops_per_step(batch)
  assert 0.65 < model_ratio < 0.8
  assert abs(lora_flops / full_flops - model_ratio) < 0.05, (lora_flops / full_flops, model_ratio)


@pytest.mark.parametrize("targets", ["all", "attention"])
def test_flan_t5_adapters_start_neutral_and_export_merged_to_transformers(targets, tmp_path):
  """T5 (encoder, decoder, cross-attention): LoRA logits, merged and exported, reloaded."""
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from hf_interop_test import _batch, _hf_forward, _hf_model, _paxlike_forward, _paxlike_model
  from transformers import T5ForConditionalGeneration

  from paxlike import decoding
  from paxlike.interop import hf

  path = str(tmp_path / "flan")
  _hf_model("gated-gelu", tie=False, seed=0).save_pretrained(path)
  model = _paxlike_model(scanned=True).clone(lora_rank=3, lora_target_layers=targets)
  params = hf.import_params(path, _paxlike_model(scanned=True))
  fresh = flax.linen.unbox(model.init(jax.random.key(0), _batch())["params"])
  adapters = {k: v for k, v in flax.traverse_util.flatten_dict(fresh).items()
              if re.fullmatch(LORA_NAMES, "/".join(k))}
  assert any("encoder_decoder_attention" in "/".join(k) for k in adapters)
  assert any("mlp" in "/".join(k) for k in adapters) == (targets == "all")
  with_adapters = flax.traverse_util.unflatten_dict(
      {**flax.traverse_util.flatten_dict(params), **adapters})
  batch = _batch()
  _, plain_logits = _paxlike_forward(_paxlike_model(scanned=True), params, batch)
  np.testing.assert_array_equal(_paxlike_forward(model, with_adapters, batch)[1], plain_logits)

  trained = _with_trained_adapters(with_adapters)
  _, lora_logits = _paxlike_forward(model, trained, batch)
  assert np.abs(lora_logits - plain_logits).max() > 1e-2
  export_model, export_params = decoding.decoding_model(model, trained)
  assert export_model.lora_rank == 0
  hf.export_params(export_params, export_model, str(tmp_path / "out"))
  reloaded = T5ForConditionalGeneration.from_pretrained(str(tmp_path / "out")).eval()
  np.testing.assert_allclose(_hf_forward(reloaded, batch)[1], lora_logits, atol=1e-4)


def test_bprop_variable_exclusion_freezes_what_it_names_and_bad_patterns_are_one_line():
  from paxlike import steps
  from paxlike import train_state as ts
  from paxlike.learners import Learner

  model = _model("lm")
  learner = Learner(learning_rate=1e-2, bprop_variable_exclusion=[r"softmax/.*", r".*/ffn1/w"])
  tx = learner.transform()
  state = ts.init_fn(model, tx, BATCH)(jax.random.key(0))
  step = jax.jit(steps.make_train_step(model, tx, learner.lr_schedule()))
  new, metrics = step(state, BATCH, jax.random.key(1))
  assert np.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
  before, after = flat_names(state.params), flat_names(new.params)
  frozen = {n for n in before if n.startswith("softmax/") or n.endswith("/ffn1/w")}
  assert frozen and all(np.array_equal(before[n], after[n]) for n in frozen)
  assert all(not np.array_equal(before[n], after[n]) for n in set(before) - frozen
             if not n.endswith(("lora_b", "/b", "bias")))
  with pytest.raises(UserError, match=r"leave no parameter to train; the names are those "
                                      r"model_analysis.txt lists \(final_norm/bias, "):
    Learner(bprop_variable_inclusion=["softmax/.*"],
            bprop_variable_exclusion=["softmax/.*"]).trainable(state.params)
  # A pattern in praxis's names (ff_layer) freezes nothing here: refused, not ignored.
  with pytest.raises(UserError, match=r"^learner.bprop_variable_exclusion entry '.\*ff_layer"
                                      r".\*' matches no parameter; the names are those "
                                      r"model_analysis.txt lists \(final_norm/bias, "):
    Learner(bprop_variable_exclusion=[r".*ff_layer.*", r".*/ffn1/w"]).check_names(state.params)
  learner.check_names(state.params)  # the patterns above match
  with pytest.raises(UserError, match=r"^learner.bprop_variable_exclusion entry '\(' is not a "
                                      "regular expression"):
    Learner(bprop_variable_exclusion="(")


def test_llama32_1b_at_rank_16_keeps_adam_slots_for_its_adapters_only():
  """The fine-tuning page's figures, from the abstract state (nothing allocated)."""
  from paxlike import config
  from paxlike import train_state as ts

  def state(*sets):
    exp = experiment.instantiate(registry.get("Llama32_1B"), ["ICI_MESH_SHAPE=[1,1,1]", *sets])
    task = config.build(exp.task())
    batch = {"ids": jnp.zeros((1, 64), jnp.int32), "labels": jnp.zeros((1, 64), jnp.int32),
             "weights": jnp.ones((1, 64))}
    return ts.logical_specs(task.model, task.learner.transform(), batch)[0]

  full, lora = state(), state("USE_LORA=True", "LORA_RANK=16")
  assert ts.count_params(full.params) == 1_235_814_400
  assert ts.count_params(lora.params) == 1_235_814_400 + 11_272_192
  assert ts.count_params(full.opt_state) == 2 * 1_235_814_400 + 2  # + two step counters
  assert ts.count_params(lora.opt_state) == 2 * 11_272_192 + 2


@pytest.mark.parametrize("exp", ["LmCloudTransformerAdamTiny", "LlamaPipelineTiny"],
                         ids=["pmap", "pipeline"])
def test_lora_trains_only_adapters_in_the_pmap_loop_and_a_pipeline(exp, tmp_path):
  job = tmp_path / "job"
  proc = run_cli([f"--exp={exp}", f"--job_log_dir={job}", "--set", "USE_LORA=True", "--set",
                  "LORA_RANK=4", "--set", "NUM_TRAIN_STEPS=6", "--set",
                  "CHECKPOINT_EVERY_N_STEPS=3", "--set", "CHECKPOINT_MAX_TO_KEEP=2"],
                 tmp_path, devices=2)
  assert proc.returncode == 0, describe(proc)
  assert sorted(p.name for p in (job / "checkpoints").glob("checkpoint_*")) == [
      "checkpoint_00000003", "checkpoint_00000006"]
  at3, at6 = (flat_names(_restored_params(job, s)[1]["params"]) for s in (3, 6))
  adapters = {n for n in at3 if re.fullmatch(LORA_NAMES, n)}
  assert adapters and all(not np.array_equal(at3[n], at6[n]) for n in adapters
                          if n.endswith("lora_b"))
  assert all(np.array_equal(at3[n], at6[n]) for n in set(at3) - adapters)
