"""Pax's GPU configs (paxml/contrib/gpu/scripts_gpu/configs.py), their imports rewritten.

The first part writes a module in that file's idiom (a GPT-3 class on
synthetic data whose MODEL_CLASS is CustomMetricsLM, with the mixins and the
task() edits the file makes) and runs it; the second reads Pax's own file from
$PAXLIKE_PAXREF/gpu_configs.py (default /work/paxref), as pax_pipeline_files_test
reads lm_cloud.py, c4.py and nvidia.py, and is skipped where it is absent.
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import (
  describe,
  parse_trained_line,
  registrations_undone,
  run_cli,
  write_tfds,
)
from pax_pipeline_files_test import (
  PAXREF,
  Pax,
  _count,
  _import_ports,
  _model_of,
  _on_devices,
  pax_param_count,
)

from paxlike import config, experiment, flops, registry
from paxlike.errors import UserError
from paxlike.models.language_model import LanguageModel
from paxlike.pax.contrib.gpu.scripts_gpu.models import CustomMetricsLM

GPU_IDIOM = """\
import fiddle as fdl
from jax import numpy as jnp
from paxlike.pax import experiment_registry
from paxlike.pax.contrib.gpu.scripts_gpu.checkpoint_utils import CheckpointRestoreMixin
from paxlike.pax.contrib.gpu.scripts_gpu.lora_utils import LoRAMixin
from paxlike.pax.contrib.gpu.scripts_gpu.models import CustomMetricsLM
from paxlike.pax.contrib.gpu.scripts_gpu.tasks import PileUnsupervisedDataset
from paxlike.pax.tasks.lm.params.c4 import TransformerLmSpmdAdam
from paxlike.pax.tasks.lm.params.lm_cloud import SyntheticDataset
from paxlike.pax.layers import transformers


class TinyGptBase(TransformerLmSpmdAdam, LoRAMixin, CheckpointRestoreMixin):
  MODEL_CLASS = CustomMetricsLM
  USE_REPEATED_LAYER = False
  ICI_MESH_SHAPE = [1, 1, 1]
  FPROP_DTYPE = jnp.float32
  MAX_STEPS = 40
  MAX_SEQ_LEN = 32
  VOCAB_SIZE = 256
  PERCORE_BATCH_SIZE = 8
  NUM_LAYERS = 2
  NUM_HEADS = 4
  MODEL_DIMS = 64
  HIDDEN_DIMS = 256
  DIMS_PER_HEAD = 16
  TRAINABLE_POSITION_EMB = True
  USE_BIAS = True
  LEARNING_RATE = 3e-3
  LR_SCHEDULE = 'linear_rampup_cosine_decay'
  LR_COS_WARMUP = 4
  LR_COS_DECAY_START = 5
  LR_COS_DECAY_END = 40
  SUMMARY_INTERVAL_STEPS = 20

  def task(self):
    self.TRAINABLE_PE_MAX_SEQ_LEN = self.MAX_SEQ_LEN
    task_p = super().task()
    task_p.train.num_train_steps = self.MAX_STEPS
    task_p.train.compute_steps_per_sec_interval_steps = self.SUMMARY_INTERVAL_STEPS
    stacked_p = task_p.model.lm_tpl.stacked_transformer_tpl
    if issubclass(fdl.get_callable(stacked_p), transformers.StackedTransformerRepeated):
      stacked_p = stacked_p.block
    layer_p = stacked_p.transformer_layer_params_tpl
    layer_p.ln_tpl.reductions_in_fp32 = True
    layer_p.tr_fflayer_tpl.ln_tpl.reductions_in_fp32 = True
    task_p.model.lm_tpl.final_ln_tpl.reductions_in_fp32 = True
    task_p.model.apply_eval_sample_weights = True
    task_p = self.configure_lora(task_p)
    return self.configure_checkpoint_restore(task_p)


@experiment_registry.register
class TinySynthetic(TinyGptBase, SyntheticDataset):
  pass


@experiment_registry.register
class TinyPile(TinyGptBase, PileUnsupervisedDataset):
  pass
"""


@pytest.fixture
def gpu_idiom(tmp_path, monkeypatch):
  """The module above as `pax_gpu_idiom`, imported; its registrations undone after."""
  (tmp_path / "pax_gpu_idiom.py").write_text(GPU_IDIOM)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "pax_gpu_idiom", raising=False)
  with registrations_undone():
    yield tmp_path


def _built(name: str, **knobs):
  """The built task of pax_gpu_idiom.NAME, in a subclass that sets these knobs."""
  cls = registry.get(f"pax_gpu_idiom.{name}")
  exp = experiment.instantiate(type(name, (cls,), knobs) if knobs else cls)
  return config.build(experiment.build_checked(exp).task)


def test_the_gpu_idiom_builds_custom_metrics_lm_with_its_edits(gpu_idiom):
  task = _built("TinySynthetic")
  assert type(task.model) is CustomMetricsLM and task.model.apply_eval_sample_weights
  assert (task.train.num_train_steps, task.train.compute_steps_per_sec_interval_steps) == (40, 20)
  assert task.model.trainable_position_emb and task.model.trainable_pe_max_seq_len == 32
  # task() ties the steps/s window to the summary interval, so another interval is accepted.
  assert _built("TinySynthetic", SUMMARY_INTERVAL_STEPS=10).train.summary_interval_steps == 10


def test_the_gpu_idiom_trains_and_the_loss_goes_down(gpu_idiom):
  job = gpu_idiom / "job"
  proc = run_cli(["--exp=pax_gpu_idiom.TinySynthetic", f"--job_log_dir={job}"],
                 cwd=gpu_idiom, pythonpath=[gpu_idiom])
  assert proc.returncode == 0, describe(proc)
  trained = parse_trained_line(proc.stdout)
  assert trained["final_step"] == 40, describe(proc)
  assert trained["last_loss"] < 0.7 * trained["first_loss"], describe(proc)
  assert "task.model.apply_eval_sample_weights: bool = True" in (
      job / "model_params.txt").read_text()
  assert re.search(r"^MODEL_CLASS : .*\.CustomMetricsLM$",
                   (job / "experiment_cls_vars.txt").read_text(), re.M)


def test_the_gpu_idiom_with_use_lora_trains_adapters_alone(gpu_idiom):
  task = _built("TinySynthetic", USE_LORA=True, LORA_RANK=4, LORA_TARGET_LAYERS="attention")
  assert (task.model.lora_rank, task.model.lora_target_layers) == (4, "attention")
  params = {"transformer": {"x_layers_0": {"attention": {"query": {"w": 1, "lora_a": 2}}}},
            "softmax": {"logits_ffn": {"w": 3}}}
  assert jax.tree.leaves(task.learner.trainable(params)) == [2]


@pytest.mark.parametrize("knobs,expected", [
    ({"USE_LORA": True, "LORA_TARGET_LAYERS": "ffn"},
     r"^LORA_TARGET_LAYERS='ffn' is not one of \['all', 'attention', 'mlp'\]"),
    ({"MODEL_CLASS": dict}, r"^MODEL_CLASS='dict': this template builds paxlike's LanguageModel"),
])
def test_what_the_gpu_idiom_cannot_run_is_refused_by_name(gpu_idiom, knobs, expected):
  with pytest.raises(UserError, match=expected):
    _built("TinySynthetic", **knobs)


def test_the_pile_mixin_without_vocab_path_is_refused_before_anything_is_written(
    gpu_idiom, monkeypatch):
  pytest.importorskip("seqio")
  monkeypatch.delenv("VOCAB_PATH", raising=False)
  job = gpu_idiom / "job"
  proc = run_cli(["--exp=pax_gpu_idiom.TinyPile", f"--job_log_dir={job}"], cwd=gpu_idiom,
                 pythonpath=[gpu_idiom])
  assert proc.returncode == 2, describe(proc)
  assert proc.stderr.strip().splitlines()[-1] == (
      "error: Pax's GPU data mixins tokenize with the SentencePiece model that the VOCAB_PATH "
      "environment variable names; set VOCAB_PATH=/path/to/spm.model."), describe(proc)
  assert not job.exists()


def test_a_steps_per_sec_window_other_than_the_summary_interval_is_refused():
  from paxlike.task import TrainSettings

  with pytest.raises(UserError, match=r"compute_steps_per_sec_interval_steps = 10: paxlike "
                                      r"measures steps/s over each summary interval, "
                                      r"summary_interval_steps = 100"):
    TrainSettings(compute_steps_per_sec_interval_steps=10)


def test_custom_metrics_lm_refuses_the_eval_outputs_it_does_not_compute():
  dims = dict(vocab_size=16, model_dims=8, num_layers=1, num_heads=1, dim_per_head=8,
              hidden_dims=16)
  with pytest.raises(UserError, match=r"^CustomMetricsLM return_predictions=True: paxlike "
                                      r"does not compute these eval outputs"):
    CustomMetricsLM(**dims, return_predictions=True)
  with pytest.raises(UserError, match=r"^CustomMetricsLM eval_task='boolq' needs "
                                      r"boolq_yn_tokens, the ids of 'yes' and 'no', one token "
                                      r"each; got \[\[3, 9\], \[4\]\]"):
    CustomMetricsLM(**dims, eval_task="boolq", boolq_yn_tokens=[[3, 9], [4]])
  # Pax's jnp.array([TRUE_TOKEN, FALSE_TOKEN]) of one-token encodings: a pair of ids.
  model = CustomMetricsLM(**dims, eval_task="boolq", boolq_yn_tokens=jnp.array([[3], [4]]))
  assert model.yes_no_tokens == (3, 4) and not model.strict_accuracy


def test_boolqs_accuracy_compares_the_answers_logit_with_the_other_answers():
  """praxis's boolq_acc: at each weighted position the label, 'yes' (3) or 'no' (4), must
  have the higher of the two logits; what the argmax is elsewhere does not matter."""
  from paxlike.models.language_model import weighted_loss

  logits = jnp.zeros((3, 2, 6)).at[:, :, 5].set(9.0)  # argmax 5: never an answer
  logits = logits.at[0, 1, 3].set(2.0).at[1, 1, 4].set(1.0).at[1, 1, 3].set(1.5)
  labels = jnp.array([[0, 3], [0, 4], [0, 3]])
  weights = jnp.array([[0, 1], [0, 1], [0, 0]], jnp.float32)  # the last row pads the batch
  _, m = weighted_loss(logits, labels, weights, yes_no=(3, 4))
  assert (float(m["yes_no_correct"]), float(m["num_examples"])) == (1.0, 2.0)
  assert float(m["accuracy"]) == 0.0


def test_lambadas_strict_accuracy_counts_rows_predicted_whole():
  """praxis's acc_strict: a row counts when every weighted token's argmax is its label;
  rows without weight (padding) count for nothing."""
  from paxlike.models.language_model import weighted_loss

  labels = jnp.array([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
  logits = jax.nn.one_hot(jnp.array([[0, 2, 3], [1, 0, 3], [0, 0, 0]]), 4)  # argmax per token
  weights = jnp.array([[0, 1, 1], [0, 1, 1], [0, 0, 0]], jnp.float32)
  _, m = weighted_loss(logits, labels, weights, strict=True)
  assert (float(m["strict_correct"]), float(m["num_examples"])) == (1.0, 2.0)
  model = CustomMetricsLM(vocab_size=16, model_dims=8, num_layers=1, num_heads=1,
                          dim_per_head=8, hidden_dims=16, eval_task="lambada")
  assert model.strict_accuracy and not LanguageModel(
      vocab_size=16, model_dims=8, num_layers=1, num_heads=1, dim_per_head=8,
      hidden_dims=16).strict_accuracy


def test_apply_eval_sample_weights_drops_the_padding_rows_from_the_loss():
  """praxis's merge of per-example and per-token weights: a row whose eval_sample_weights is
  0 counts for nothing, so the loss is that of the other row alone."""
  model = LanguageModel(vocab_size=32, model_dims=16, num_layers=1, num_heads=2, dim_per_head=8,
                        hidden_dims=32, apply_eval_sample_weights=True)
  rng = np.random.default_rng(0)
  batch = {"ids": jnp.asarray(rng.integers(0, 32, (2, 8)), jnp.int32),
           "labels": jnp.asarray(rng.integers(0, 32, (2, 8)), jnp.int32),
           "weights": jnp.ones((2, 8), jnp.float32)}
  params = model.init(jax.random.key(0), batch["ids"])

  def loss(b):
    return float(model.apply(params, b, method=model.fprop)[0])

  padded = loss({**batch, "eval_sample_weights": jnp.asarray([1.0, 0.0])})
  row0 = loss({k: v[:1] for k, v in batch.items()})
  assert padded == pytest.approx(row0, rel=1e-5)
  assert loss(batch) != pytest.approx(row0, rel=1e-3)  # without them, both rows count


def test_a_layer_norm_reducing_in_its_input_dtype_is_refused():
  from paxlike.pax.tasks.lm import model_params

  class Exp(model_params.TransformerLmSpmdAdafactor):
    MAX_SEQ_LEN = 16
    PERCORE_BATCH_SIZE = 1

    def task(self):
      task_p = super().task()
      task_p.model.lm_tpl.final_ln_tpl.reductions_in_fp32 = False
      return task_p

  with pytest.raises(UserError, match=r"final_ln_tpl\.reductions_in_fp32 = False: .*leave it at "
                                      r"True"):
    experiment.task_config(experiment.instantiate(Exp))


# ------------------------------------------------------ Pax's own file, where present

GPU_CONFIGS = PAXREF / "gpu_configs.py"
GPT3_GPU = dict(gpt3=True, position_table=2048, stages=1, microbatches=1, devices=0)
SYNTHETIC = {  # class: (Pax's dims, devices = ICI x DCN, global batch = PERCORE x devices)
    "Synthetic126M": (Pax(12, 768, 12, 64, 50304, **GPT3_GPU), 64, 256),
    "Synthetic5B": (Pax(24, 4096, 32, 128, 50304, **GPT3_GPU), 256, 2048),
    "Synthetic175B": (Pax(96, 12288, 96, 128, 50257, **GPT3_GPU), 256, 1536),
}


@pytest.fixture(scope="module")
def gpu_configs(tmp_path_factory):
  if not GPU_CONFIGS.is_file():
    pytest.skip(f"Pax's GPU configs are not at {GPU_CONFIGS} (set PAXLIKE_PAXREF)")
  yield from _import_ports(tmp_path_factory.mktemp("pax_gpu"), (GPU_CONFIGS.stem,))


def test_the_gpu_configs_typo_is_refused_by_name(gpu_configs):
  """GPT126MBase sets R_COS_MIN_RATIO = 0.1 (Pax's name is LR_COS_MIN_RATIO, whose template
  default is also 0.1): Pax ignores it silently."""
  with pytest.raises(UserError, match=r"^R_COS_MIN_RATIO = 0\.1 on GPT126MBase: nothing reads "
                                      r"it; did you mean LR_COS_MIN_RATIO"):
    _model_of(registry.get("pax_gpu_configs.Synthetic126M"))


def _typo_read(name: str) -> type:
  """The file's class NAME (GLaM's are not registered), in a subclass whose task() reads
  R_COS_MIN_RATIO where the class has it."""

  class TypoRead(getattr(sys.modules["pax_gpu_configs"], name)):
    def task(self):
      assert getattr(self, "R_COS_MIN_RATIO", 0.1) == 0.1  # read, so not refused
      return super().task()

  return TypoRead


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_gpu_synthetic_class_has_paxs_count_and_batch(gpu_configs, monkeypatch, name):
  pax, devices, batch = SYNTHETIC[name]
  cls = _typo_read(name)
  exp = experiment.instantiate(cls)
  assert math.prod(exp.ICI_MESH_SHAPE) * math.prod(exp.DCN_MESH_SHAPE) == devices
  _on_devices(monkeypatch, devices)
  _, model, rows = _model_of(cls)
  assert type(model) is CustomMetricsLM
  assert (model.num_layers, rows, _count(model)) == (pax.layers, batch, pax_param_count(pax))


def test_gpu_glam_has_paxs_blocks_experts_and_count(gpu_configs, monkeypatch):
  """GLaM126M64E: 12 layers in 6 two-layer blocks, the first of each with 64 top-2 experts
  (praxis's default ReLU, not gated) routed in 64 groups, the second a gated-GELU dense
  layer; RMS norms, no biases, a relative position bias per layer, GShard's softmax."""
  model = _glam_model(monkeypatch, "PileGLaM126M64E", 64)
  assert (model.num_layers, model.moe_layers, model.num_experts, model.num_groups,
          model.expert_capacity_factor, model.moe_activation, model.moe_gated_activation,
          model.activation, model.use_gated_activation, model.norm_type) == (
              12, (0, 2, 4, 6, 8, 10), 64, 64, 2.0, "relu", False, "gelu", True, "rmsnorm")
  assert (model.use_repeated_layer, model.relative_bias, model.query_scale,
          model.attention_extra_logit, model.gshard_softmax, model.z_loss_weight,
          model.loss_over_labels_size, model.use_position_emb, model.report_strict_acc) == (
              False, (32, 128), False, 0.0, True, 0.0, True, False, True)
  assert model.moe_load_balance_loss_weight == pytest.approx(0.01 / 6)
  pax = _glam_count(layers=12, d=768, f=3072, experts=64, heads=12)
  assert _count(model) == pax
  assert flops.param_count(model.flops_dims(8)) == pax


def _seqio_test_vocab(monkeypatch) -> None:
  """VOCAB_PATH at seqio's test SentencePiece model (skips without the seqio extra)."""
  seqio = pytest.importorskip("seqio")
  monkeypatch.setenv("VOCAB_PATH", str(Path(seqio.__file__).parent / "test_data" /
                                       "sentencepiece" / "sentencepiece.model"))


def _glam_model(monkeypatch, name: str, devices: int):
  """configs.py's GLaM class NAME's model, as its task() builds it on `devices` devices."""
  _seqio_test_vocab(monkeypatch)
  _on_devices(monkeypatch, devices)
  return _model_of(_typo_read(name))[1]


def _glam_count(layers: int, d: int, f: int, experts: int, heads: int, v: int = 50304) -> int:
  """praxis's GLaM: per layer q, k, v, out (4 x d x d), a [32, heads] bias table and two RMS
  scales; every other layer a gated dense feed-forward (3 x d x f), the rest a [d, experts]
  router and experts of two bias-free matrices; the final RMS scale and the tied table."""
  attention = 4 * d * d + 32 * heads + 2 * d
  half = layers // 2
  return (layers * attention + half * 3 * d * f + half * (d * experts + experts * 2 * d * f)
          + d + v * d)


def test_gpu_glam_64b_has_paxs_count_on_its_512_devices(gpu_configs, monkeypatch):
  """GLaM64B64E (GLaM's 64B/64E, about 1.2 T parameters): 64 layers in scanned blocks of an
  MoE and a dense layer, 64 experts over the 64-way data axis, 64 routing groups."""
  model = _glam_model(monkeypatch, "PileGLaM64B64E", 512)
  assert (model.num_layers, model.num_experts, model.num_groups, model.use_repeated_layer,
          model.expert_shards) == (64, 64, 64, True, 64)
  assert _count(model) == _glam_count(layers=64, d=8192, f=32768, experts=64, heads=64) == (
      1_142_891_356_160)


@pytest.mark.parametrize("repeated,field", [(True, "layer_input_dropout_prob"),
                                            (False, "input_dropout_prob")])
def test_a_stacks_input_dropout_lands_where_praxis_applies_it(repeated, field):
  """GPT5BBase's edit: on a repeated stack's one-layer block, praxis drops the input of every
  layer; on a plain stack, the stack's input once."""
  import fiddle as fdl

  from paxlike.pax.layers import transformers
  from paxlike.pax.tasks.lm import model_params

  class Exp(model_params.TransformerLmSpmdAdafactor):
    MAX_SEQ_LEN = 16
    PERCORE_BATCH_SIZE = 1
    USE_REPEATED_LAYER = repeated

    def task(self):
      task_p = super().task()
      stacked_p = task_p.model.lm_tpl.stacked_transformer_tpl
      if issubclass(fdl.get_callable(stacked_p), transformers.StackedTransformerRepeated):
        stacked_p = stacked_p.block
      stacked_p.input_dropout_prob = 0.1
      return task_p

  model = config.build(experiment.task_config(experiment.instantiate(Exp))).model
  other = ({"input_dropout_prob", "layer_input_dropout_prob"} - {field}).pop()
  assert (getattr(model, field), getattr(model, other)) == (0.1, 0.0)


@pytest.mark.parametrize("field", ["input_dropout_prob", "layer_input_dropout_prob"])
@pytest.mark.parametrize("repeated", [True, False])
def test_input_dropout_drops_while_training_only(field, repeated):
  model = LanguageModel(vocab_size=32, model_dims=16, num_layers=2, num_heads=2, dim_per_head=8,
                        hidden_dims=32, use_repeated_layer=repeated, **{field: 0.5})
  ids = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 8)), jnp.int32)
  batch = {"ids": ids, "labels": ids, "weights": jnp.ones((2, 8), jnp.float32)}
  params = model.init(jax.random.key(0), ids)

  def loss(key=None):
    rngs = {} if key is None else {"dropout": jax.random.key(key)}
    return float(model.apply(params, batch, method=model.fprop, rngs=rngs)[0])

  plain = LanguageModel(vocab_size=32, model_dims=16, num_layers=2, num_heads=2, dim_per_head=8,
                        hidden_dims=32, use_repeated_layer=repeated)
  assert loss() == pytest.approx(float(plain.apply(params, batch, method=plain.fprop)[0]))
  assert loss(1) != pytest.approx(loss(), rel=1e-4)
  assert loss(1) != pytest.approx(loss(2), rel=1e-4)


# ------------------------------------ Pax's Pile and LAMBADA classes on local TFDS copies

WORDS = "the a cat dog sat ran on under mat log big small red blue and then".split()


def _write_gpu_configs(root: Path) -> None:
  """Pax's configs.py as root/pax_gpu_configs.py: its import lines rewritten and the
  R_COS_MIN_RATIO line, which paxlike refuses, dropped (skips where the file is absent)."""
  if not GPU_CONFIGS.is_file():
    pytest.skip(f"Pax's GPU configs are not at {GPU_CONFIGS} (set PAXLIKE_PAXREF)")
  from pax_pipeline_files_test import rewrite_imports

  text = rewrite_imports(GPU_CONFIGS.read_text())
  (root / "pax_gpu_configs.py").write_text(
      "\n".join(line for line in text.splitlines() if "R_COS_MIN_RATIO" not in line))


def _write_pile_and_lambada(data_dir) -> None:
  """TFDS datasets named and shaped as Pax's GPU builders write them (ThePile and MyLambada,
  1.0.0, config 'lm'), under data_dir."""
  import tensorflow_datasets as tfds

  rng = np.random.default_rng(0)

  def text() -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(5, 30))))

  write_tfds(data_dir, "the_pile", "1.0.0", {"text": tfds.features.Text()},
             {"train": [{"text": text()} for _ in range(400)],
              "validation": [{"text": text()} for _ in range(16)]}, config="lm")
  passages = [{"inputs": text(), "targets": " " + str(rng.choice(WORDS))} for _ in range(20)]
  write_tfds(data_dir, "my_lambada", "1.0.0",
             {"inputs": tfds.features.Text(), "targets": tfds.features.Text()},
             {"test": passages}, config="lm")


# GPT126MBase cut to a CPU's size; its data, converter, model class and optimizer are Pax's.
SMALL_GPT = ["NUM_LAYERS=2", "MODEL_DIMS=64", "HIDDEN_DIMS=256", "NUM_HEADS=4",
             "DIMS_PER_HEAD=16", "PERCORE_BATCH_SIZE=8", "MAX_SEQ_LEN=128", "VOCAB_SIZE=64",
             "ICI_MESH_SHAPE=[1,1,1]", "DCN_MESH_SHAPE=[1,1,1]", "FPROP_DTYPE=float32"]


@pytest.mark.one_python("3.11")
def test_paxs_pile_class_trains_and_its_lambada_class_evaluates_the_job(tmp_path, monkeypatch):
  """Pax's run_pile_singlenode.sh then run_lambada_singlenode.sh, on local TFDS copies: the
  file as written but for its import lines and the R_COS_MIN_RATIO line paxlike refuses."""
  _seqio_test_vocab(monkeypatch)
  _write_gpu_configs(tmp_path)
  _write_pile_and_lambada(tmp_path / "tfds")
  small = [a for knob in SMALL_GPT for a in ("--set", knob)]
  common = ["--job_log_dir=job", f"--tfds_data_dir={tmp_path / 'tfds'}", *small]
  proc = run_cli(["--exp=pax_gpu_configs.Pile126M", *common, "--set", "MAX_STEPS=40",
                  "--set", "EVAL_INTERVAL_STEPS=40", "--set", "LEARNING_RATE=3e-3",
                  "--set", "LR_COS_WARMUP=2", "--set", "LR_COS_DECAY_START=3"],
                 tmp_path, pythonpath=[tmp_path])
  assert proc.returncode == 0, describe(proc)
  trained = parse_trained_line(proc.stdout)
  assert trained["last_loss"] < 0.6 * trained["first_loss"], describe(proc)
  assert "eval_test_PileValidation at step 40:" in proc.stdout
  assert "eval_sample_weights" not in proc.stderr  # the SeqIO rows carry them, as Pax's do

  proc = run_cli(["--exp=pax_gpu_configs.Lambada126M", *common, "--mode=eval"], tmp_path,
                 pythonpath=[tmp_path])
  assert proc.returncode == 0, describe(proc)
  line = re.search(r"^eval LambadaValidation at step 40: .*$", proc.stdout, re.M)
  assert line and "num_examples 20.0000" in line.group(0), describe(proc)
  strict = float(re.search(r"acc_strict (\S+)", line.group(0)).group(1))
  assert 0.0 <= strict <= 1.0
  # An eval-only class does not train, in one line.
  proc = run_cli(["--exp=pax_gpu_configs.Lambada126M", *common], tmp_path,
                 pythonpath=[tmp_path])
  assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
      "error: Lambada126M is an eval-only experiment"), describe(proc)


# ------------------------------------------------ Pax's LLaMA classes on the Llama family

LLAMA = {  # class: Hugging Face's parameter count of the same Llama (untied, GQA for 70B)
    "LLaMA7B": 6_738_415_616, "LLaMA13B": 13_015_864_320, "LLaMA70B": 68_976_648_192}


def _yes_no_vocab(directory: Path, monkeypatch) -> Path:
  """A small SentencePiece model in which 'yes' and 'no' are one token each, as in LLaMA's,
  trained here; VOCAB_PATH names it."""
  import sentencepiece as spm

  corpus = directory / "corpus.txt"
  rng = np.random.default_rng(1)
  corpus.write_text("\n".join(" ".join(rng.choice(WORDS, size=12)) for _ in range(300)))
  spm.SentencePieceTrainer.train(
      input=str(corpus), model_prefix=str(directory / "spm"), vocab_size=40,
      user_defined_symbols=["\u2581yes", "\u2581no"], pad_id=0, bos_id=1, eos_id=2, unk_id=3,
      hard_vocab_limit=False,
      minloglevel=2)
  monkeypatch.setenv("VOCAB_PATH", str(directory / "spm.model"))
  return directory / "spm.model"


@pytest.mark.parametrize("name", sorted(LLAMA))
def test_paxs_llama_classes_build_the_llama_family_with_its_counts(gpu_configs, monkeypatch,
                                                                    tmp_path, name):
  pytest.importorskip("seqio")
  from paxlike.pax.contrib.gpu.scripts_gpu.models import CustomMetricsLlama

  _yes_no_vocab(tmp_path, monkeypatch)
  cls = registry.get(f"pax_gpu_configs.{name}")
  exp = experiment.instantiate(cls)
  _on_devices(monkeypatch, math.prod(exp.ICI_MESH_SHAPE) * math.prod(exp.DCN_MESH_SHAPE))
  _, model, _ = _model_of(cls)
  assert type(model) is CustomMetricsLlama and _count(model) == LLAMA[name]
  # LLaMA7B's task(): BoolQ's eval metric on the vocabulary's 'yes' and 'no' ids.
  assert (model.eval_task, model.boolq_yn_tokens) == ("boolq", (4, 5))
  assert model.apply_eval_sample_weights and model.fprop_dtype == jnp.bfloat16
  assert model.num_kv_heads == (8 if name == "LLaMA70B" else model.num_heads)


def _save_hf_llama(path: Path) -> Path:
  """A Llama of SMALL_LLAMA's shape as transformers saves it (random weights)."""
  import torch
  from transformers import LlamaConfig, LlamaForCausalLM

  torch.manual_seed(0)
  LlamaForCausalLM(LlamaConfig(
      vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=4, head_dim=16, max_position_embeddings=96,
      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1,
      eos_token_id=2, pad_token_id=0)).save_pretrained(str(path))
  return path


@pytest.mark.parametrize("knobs,expected", [
    ({"NUM_TRAIN_STEPS": 5}, r"^NUM_TRAIN_STEPS=5: BaseLLaMA reads MAX_STEPS"),
    ({"NORM_EPSILON": 1e-6}, r"^NORM_EPSILON=1e-06: BaseLLaMA reads RMS_NORM_EPSILON"),
    ({"USE_MQA": True}, r"^USE_MQA=True needs NUM_KV_HEADS"),
    ({"USE_GATED_ACTIVATION": False}, r"LLaMA's feed-forward is SiLU-gated"),
])
def test_what_paxs_llama_template_does_not_build_is_refused_by_name(
    gpu_configs, monkeypatch, tmp_path, knobs, expected):
  pytest.importorskip("seqio")
  _yes_no_vocab(tmp_path, monkeypatch)
  with pytest.raises(UserError, match=expected):
    _model_of(type("Changed", (registry.get("pax_gpu_configs.LLaMA7B"),), knobs))


# LLaMA7B cut to a CPU's size: BoolQ, LoRA and the learning rate as Pax's run_llama_boolq.sh
# sets them for a LoRA run (its constant schedule), with fewer steps.
SMALL_LLAMA = ["NUM_LAYERS=2", "MODEL_DIMS=64", "HIDDEN_DIMS=128", "NUM_HEADS=4",
               "DIMS_PER_HEAD=16", "PERCORE_BATCH_SIZE=8", "MAX_SEQ_LEN=96", "VOCAB_SIZE=64",
               "ICI_MESH_SHAPE=[1,1,1]", "FPROP_DTYPE=float32", "USE_LORA=True",
               "LORA_RANK=4", "LR_SCHEDULE='constant'", "LEARNING_RATE=3e-3"]


@pytest.mark.one_python("3.11")
def test_paxs_llama_class_fine_tunes_on_boolq_with_lora_and_reports_boolq_acc(
    tmp_path, monkeypatch):
  """BoolQ rows whose answer is whether the passage names a cat: LoRA learns it, and the
  eval's boolq_acc says so; MAX_STEPS=0, Pax's default, only evaluates."""
  pytest.importorskip("seqio")
  _write_gpu_configs(tmp_path)
  import tensorflow_datasets as tfds
  _yes_no_vocab(tmp_path, monkeypatch)
  rng = np.random.default_rng(0)

  def row():
    passage = " ".join(rng.choice(WORDS, size=10))
    return {"passage": passage, "question": "is it a cat", "idx": 0,
            "label": int("cat" in passage.split())}

  features = {"passage": tfds.features.Text(), "question": tfds.features.Text(),
              "label": tfds.features.ClassLabel(num_classes=2), "idx": np.int32}
  write_tfds(tmp_path / "tfds", "super_glue", "1.0.2", features,
             {"train": [row() for _ in range(400)], "validation": [row() for _ in range(32)]},
             config="boolq")
  common = ["--exp=pax_gpu_configs.LLaMA7B", "--job_log_dir=job",
            f"--tfds_data_dir={tmp_path / 'tfds'}",
            *[a for knob in SMALL_LLAMA for a in ("--set", knob)]]
  proc = run_cli(common, tmp_path, pythonpath=[tmp_path])
  assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
      "error: LLaMA7B trains 0 steps"), describe(proc)
  if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
    # EVAL_ONLY=1 in Pax's script: zero-shot BoolQ of a Llama's own weights, from INIT_FROM.
    hf_dir = _save_hf_llama(tmp_path / "hf_llama")
    proc = run_cli([*common, "--job_log_dir=zero_shot", "--mode=eval",
                    "--set", f"INIT_FROM='hf:{hf_dir}'"], tmp_path, pythonpath=[tmp_path])
    assert proc.returncode == 0, describe(proc)
    assert f"using the weights of hf:{hf_dir}" in proc.stdout + proc.stderr, describe(proc)
    assert re.search(r"^eval BoolQ at step 0: .*boolq_acc \S+$", proc.stdout, re.M)

  proc = run_cli([*common, "--set", "MAX_STEPS=80", "--set", "EVAL_INTERVAL_STEPS=80"],
                 tmp_path, pythonpath=[tmp_path])
  assert proc.returncode == 0, describe(proc)
  trained = parse_trained_line(proc.stdout)
  assert trained["last_loss"] < 0.2 * trained["first_loss"], describe(proc)
  share = re.search(r"training [\d,]+ of them \(([\d.]+)%\)", proc.stdout + proc.stderr)
  assert share and float(share.group(1)) < 50, describe(proc)  # the LoRA adapters alone
  proc = run_cli([*common, "--mode=eval"], tmp_path, pythonpath=[tmp_path])
  assert proc.returncode == 0, describe(proc)
  line = re.search(r"^eval BoolQ at step 80: .*$", proc.stdout, re.M)
  assert line and "num_examples 32.0000" in line.group(0), describe(proc)
  assert float(re.search(r"boolq_acc (\S+)", line.group(0)).group(1)) >= 0.9
