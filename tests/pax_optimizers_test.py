"""Pax's optimizer and schedule configs, Pax's modules and idioms, as Pax users write them.

The experiments subclass paxlike's shipped tiny LM (lm_cloud.LmCloudSpmdTiny,
made smaller still) and set `task_p.train.learner.optimizer` the way Pax's
c4.py and nvidia.py do; what is checked is what a user notices: the learning
rate the run logs, the loss going down, a refusal in one line naming the
field, a warning for a knob its branch does not read.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO_ROOT, describe, parse_trained_line, registrations_undone, run_cli

from paxlike import config, experiment, mesh, registry, trainer
from paxlike.errors import UserError
from paxlike.partitioning import SpmdPartitioner
from paxlike.pax import (
    base_hyperparams,
    optimizers,
    pax_fiddle,
    py_utils,
    schedules,
    seqio_input,
    trainer_lib,
)
from paxlike.pax.layers import glam, grok
from paxlike.pax.tasks.lm import model_params
from paxlike.pax.tasks.lm.params import lm_cloud


class TinyLm(lm_cloud.LmCloudSpmdTiny):
  """The shipped tiny LM, smaller: one layer of 32 dims, 16 tokens, 8 rows per step."""

  NUM_LAYERS = 1
  MODEL_DIMS = 32
  MAX_SEQ_LEN = 16
  PERCORE_BATCH_SIZE = 1


def _cosine_adam(task_p, learning_rate=1e-2):
  """The optimizer as nvidia.py's NVIDIA1_3B.task() sets it (Adam branch)."""
  lp = task_p.train.learner
  lp.loss_name = "total_loss"
  lp.optimizer = pax_fiddle.Config(
      optimizers.Adam, beta1=0.9, beta2=0.95, weight_decay=1e-3, epsilon=1e-8,
      epsilon_root=0.0, clip_gradient_norm_to_value=1.0, clip_threshold=1.0)
  lp.optimizer.learning_rate = learning_rate
  lp.optimizer.lr_schedule = pax_fiddle.Config(
      schedules.LinearRampupCosineDecay, warmup_steps=2, decay_start=4, decay_end=12,
      min_ratio=0.1, max=1.0)


class AdamCosine(TinyLm):
  def task(self):
    task_p = super().task()
    _cosine_adam(task_p)
    return task_p


class AdafactorDefault(TinyLm):
  def task(self):
    task_p = super().task()
    model_params.set_default_adafactor(task_p, 2e-2, 1e-3, warmup_steps=0, decay_start=0,
                                       decay_end=1000)
    return task_p


def _build(cls, overrides=()):
  exp = experiment.instantiate(cls, list(overrides))
  return experiment.build_checked(exp)


def _train(cls, tmp_path, steps):
  """Trains cls in this process on one device; the step history (every step summarised)."""
  configs = _build(cls, [f"NUM_TRAIN_STEPS={steps}", "SUMMARY_INTERVAL_STEPS=1"])
  task = config.build(configs.task)
  inp = config.build(configs.datasets[0])
  inp.bind_host(1, 0)
  partitioner = SpmdPartitioner(mesh.build([1, 1, 1], None, devices=jax.devices()[:1]))
  options = trainer.TrainOptions(enable_summary_writer=False, async_checkpoint=False,
                                 measure_hardware_flops=False)
  (tmp_path / "job").mkdir()
  result = trainer.train(task, inp, partitioner, str(tmp_path / "job"), options)
  return task, {h["step"]: h for h in result.history}


def _cosine_rate(step, lr=1e-2, warmup=2, start=4, end=12, min_ratio=0.1):
  """praxis's LinearRampupCosineDecay x learning_rate, written out."""
  if step < warmup:
    return lr * step / warmup
  if step < start:
    return lr
  t = min(step - start, end - start) / (end - start)
  return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


# ------------------------------------------------------- optimizers honoured


def test_adam_config_and_cosine_schedule_give_the_logged_rate_and_train(tmp_path):
  task, history = _train(AdamCosine, tmp_path, steps=8)
  schedule = task.learner.lr_schedule()
  for step in (0, 1, 2, 3, 4, 7, 12, 30):
    assert float(schedule(step)) == pytest.approx(_cosine_rate(step), rel=1e-5, abs=1e-9)
  # The rate logged at step s is the one its update used: the schedule at s - 1.
  for step in range(1, 9):
    assert history[step]["learning_rate"] == pytest.approx(_cosine_rate(step - 1), abs=1e-7)
  losses = [history[s]["loss"] for s in range(1, 9)]
  assert losses[-1] < losses[0] - 0.3, losses
  # clip_gradient_norm_to_value=1.0 and a grad_norm logged above it: clipping is the
  # optimizer's (the grad_norm summary is of the raw gradients).
  assert isinstance(task.learner.optimizer, optimizers.Adam)


def test_sharded_adafactor_of_set_default_adafactor_trains(tmp_path):
  task, history = _train(AdafactorDefault, tmp_path, steps=8)
  assert isinstance(task.learner.optimizer, optimizers.ShardedAdafactor)
  assert history[1]["learning_rate"] == pytest.approx(2e-2)  # warmup_steps=0: full rate
  losses = [history[s]["loss"] for s in range(1, 9)]
  assert losses[-1] < losses[0] - 0.3, losses


def _one_update(opt_cfg, grads, params, steps=1):
  opt = config.build(opt_cfg)
  tx = opt.transformation()
  state = tx.init(params)
  updates = None
  for _ in range(steps):
    updates, state = tx.update(grads, state, params)
  return updates


def test_sharded_adafactor_steps_follow_praxis_formulas():
  constant = pax_fiddle.Config(schedules.Constant)
  params = {"w": jnp.asarray(np.linspace(-1.0, 1.0, 12).reshape(4, 3), jnp.float32)}
  grads = {"w": jnp.asarray(np.linspace(-2.75, 2.75, 12).reshape(4, 3), jnp.float32)}
  g, p = np.asarray(grads["w"]), np.asarray(params["w"])
  cfg = pax_fiddle.Config(optimizers.ShardedAdafactor, decay_method="adam", decay_adam=0.99,
                          factored=False, clip_threshold=None, learning_rate=0.1,
                          lr_schedule=constant)
  # First step: the second moment is g^2, so each weight moves by the rate, against g.
  np.testing.assert_allclose(_one_update(cfg, grads, params)["w"], -0.1 * np.sign(g), rtol=1e-5)
  # Decoupled weight decay adds rate x decay x weight.
  cfg.weight_decay = 0.5
  np.testing.assert_allclose(_one_update(cfg, grads, params)["w"],
                             -0.1 * (np.sign(g) + 0.5 * p), rtol=1e-5)
  # Momentum (beta1) kept in float32: the first step moves (1 - beta1) of it.
  cfg.weight_decay, cfg.beta1, cfg.quantized_dtype = None, 0.9, "float32"
  np.testing.assert_allclose(_one_update(cfg, grads, params)["w"], -0.01 * np.sign(g),
                             rtol=1e-5)
  # Update clipping: an RMS of 1 clipped to 0.5 halves the move.
  cfg.beta1, cfg.clip_threshold = 0.0, 0.5
  np.testing.assert_allclose(_one_update(cfg, grads, params)["w"], -0.05 * np.sign(g),
                             rtol=1e-5)
  # Factored second moments on a matrix: row and column means of g^2.
  cfg.clip_threshold, cfg.factored, cfg.sort_factored_second_moment_dims = None, True, False
  vr, vc = (g * g).mean(axis=1), (g * g).mean(axis=0)
  x = g / np.sqrt(vr / vr.mean())[:, None] / np.sqrt(vc)[None, :]
  np.testing.assert_allclose(_one_update(cfg, grads, params)["w"], -0.1 * x, rtol=1e-4)


def test_adam_config_is_praxis_adam():
  """praxis's sharded Adam with epsilon_root, update capping and weight decay, 2 steps."""
  params = {"w": jnp.asarray(np.linspace(-1.0, 1.0, 6).reshape(2, 3), jnp.float32)}
  grads = {"w": jnp.asarray(np.linspace(-0.3, 0.2, 6).reshape(2, 3), jnp.float32)}
  cfg = pax_fiddle.Config(optimizers.Adam, beta1=0.8, beta2=0.9, epsilon=1e-3,
                          epsilon_root=1e-4, clip_threshold=0.5, weight_decay=0.1,
                          learning_rate=0.2, lr_schedule=pax_fiddle.Config(schedules.Constant))
  g, p = np.asarray(grads["w"]), np.asarray(params["w"])
  m = v = 0.0
  for t in (1, 2):
    m, v = 0.8 * m + 0.2 * g, 0.9 * v + 0.1 * g * g
    u = (m / (1 - 0.8 ** t)) / (np.sqrt(v / (1 - 0.9 ** t) + 1e-4) + 1e-3)
  u = u / max(1.0, np.sqrt((u * u).mean()) / 0.5)
  expected = -0.2 * (u + 0.1 * p)
  np.testing.assert_allclose(_one_update(cfg, grads, params, steps=2)["w"], expected,
                             rtol=1e-5)


# ------------------------------------------------------------------ refusals


def _one_line(e: pytest.ExceptionInfo) -> str:
  text = str(e.value)
  assert "\n" not in text and "object at 0x" not in text, text
  return text


def test_an_unmodelled_optimizer_field_is_refused_naming_it():
  class Ema(TinyLm):
    def task(self):
      task_p = super().task()
      _cosine_adam(task_p)
      task_p.train.learner.optimizer.ema_decay = 0.999
      return task_p

  with pytest.raises(UserError) as e:
    config.build(_build(Ema).task)
  assert "ema_decay=0.999" in _one_line(e)


def test_a_field_praxis_does_not_have_is_refused_naming_it():
  class Typo(TinyLm):
    def task(self):
      task_p = super().task()
      task_p.train.learner.optimizer = pax_fiddle.Config(optimizers.Adam, beta3=0.9)
      return task_p

  with pytest.raises(UserError) as e:
    _build(Typo)
  assert "beta3" in _one_line(e)


class NotAnOptimizer:
  def __init__(self, rate: float = 0.1) -> None:
    self.rate = rate


def test_an_optimizer_paxlike_cannot_run_is_refused_by_its_class_name():
  class Other(TinyLm):
    def task(self):
      task_p = super().task()
      task_p.train.learner.optimizer = pax_fiddle.Config(NotAnOptimizer)
      return task_p

  with pytest.raises(UserError) as e:
    config.build(_build(Other).task)
  assert "a NotAnOptimizer" in _one_line(e)


def test_a_learner_field_a_praxis_optimizer_does_not_read_is_refused_at_its_default_too():
  # Learner's learning_rate defaults to 1e-3: a task() setting it to 1e-3 still set a field
  # nothing reads (the rate is lp.optimizer.learning_rate), and is told so, article and all.
  class DefaultRate(TinyLm):
    def task(self):
      task_p = super().task()
      task_p.train.learner.learning_rate = 1e-3
      return task_p

  class ZeroDecay(AdafactorDefault):
    def task(self):
      task_p = super().task()
      task_p.train.learner.weight_decay = 0.0
      return task_p

  with pytest.raises(UserError) as e:
    config.build(_build(DefaultRate).task)
  assert _one_line(e) == (
      "learner.learning_rate=0.001 is not read when learner.optimizer is an Adam, which "
      "says the rate, schedule and clipping itself; set it on the optimizer "
      "(lp.optimizer.learning_rate, lp.optimizer.lr_schedule, ...).")
  with pytest.raises(UserError) as e:
    config.build(_build(ZeroDecay).task)
  assert _one_line(e).startswith(
      "learner.weight_decay=0.0 is not read when learner.optimizer is a ShardedAdafactor, ")


def test_shipped_pax_templates_set_no_learner_field_their_optimizer_does_not_read():
  # The refusal above counts a field as set when its config has it set; the templates
  # that make the learner a praxis optimizer set that alone, so their runs build.
  registry.import_shipped()
  pax_style = []
  for name in registry.list_names():
    learner = registry.get(name)().task().train.learner
    if isinstance(learner.optimizer, fdl.Buildable):
      pax_style.append(name)
      assert set(fdl.ordered_arguments(learner)) == {"optimizer"}, name
  assert "experiments.lm.lm_cloud.LmCloudSpmdTiny" in pax_style
  for name in ("LmCloudSpmdTiny", "LmCloudSpmdPipelineTiny", "LmCloudTransformerAdamTiny",
               "BertTiny", "ArithmeticAdditionTiny"):
    full = next(n for n in pax_style if n.endswith("." + name))
    task = config.build(_build(registry.get(full)).task)
    assert type(task.learner.optimizer).__name__ == "Adam", name


def test_schedule_and_adafactor_settings_praxis_requires_are_refused():
  with pytest.raises(UserError) as e:  # praxis's max defaults to 0: unset
    config.build(pax_fiddle.Config(schedules.LinearRampupExponentialDecay, warmup_steps=1,
                                   decay_start=2, decay_end=10))
  assert "max=0.0" in _one_line(e)
  with pytest.raises(UserError) as e:
    config.build(pax_fiddle.Config(optimizers.ShardedAdafactor,
                                   lr_schedule=pax_fiddle.Config(schedules.Constant)))
  assert "decay_method" in _one_line(e)
  with pytest.raises(UserError) as e:
    config.build(pax_fiddle.Config(optimizers.Adam))  # no lr_schedule
  assert "lr_schedule" in _one_line(e)


# ---------------------------------------------------- known but inactive knobs


class AdaTemplate(TinyLm):
  """A Pax-style template whose optimizer branch is a knob, as nvidia.py's NVIDIA1_3B."""

  USE_ADAFACTOR = False
  CLIP_THRESHOLD = 1.0

  def task(self):
    task_p = super().task()
    lp = task_p.train.learner
    if self.USE_ADAFACTOR:
      lp.optimizer = pax_fiddle.Config(optimizers.ShardedAdafactor, decay_method="adam",
                                       beta1=0.9, decay_adam=0.99)
    else:
      lp.optimizer = pax_fiddle.Config(optimizers.Adam, clip_threshold=self.CLIP_THRESHOLD)
    lp.optimizer.learning_rate = 1e-3
    lp.optimizer.lr_schedule = pax_fiddle.Config(schedules.Constant)
    return task_p


def test_a_knob_its_branch_does_not_read_is_a_warning_naming_the_setting(capsys):
  class UsesAdafactor(AdaTemplate):
    USE_ADAFACTOR = True
    CLIP_THRESHOLD = 2.0  # read only on the Adam branch
    LR_LRED_WARMUP = 5  # task() replaces the template's optimizer, and its schedule

  configs = _build(UsesAdafactor)
  assert isinstance(config.build(configs.task).learner.optimizer, optimizers.ShardedAdafactor)
  out = capsys.readouterr().out
  clip = next(line for line in out.splitlines() if "CLIP_THRESHOLD" in line)
  assert clip.startswith("warning: CLIP_THRESHOLD = 2.0 on UsesAdafactor is not used: "
                         "AdaTemplate.task() reads it only in the else branch of "
                         "`if self.USE_ADAFACTOR`"), clip
  assert "USE_ADAFACTOR=True" in clip
  assert re.search(r"warning: LR_LRED_WARMUP = 5 on UsesAdafactor is not used: "
                   r"AdaTemplate\.task\(\) replaces task\.train\.learner\.optimizer with its "
                   r"own ShardedAdafactor config, which does not read it\.", out), out


def test_a_zero_adam_knob_runs_as_set_and_says_what_pax_would_run(capsys):
  exp = experiment.instantiate(registry.get("LmCloudSpmdTiny"),
                               ["ADAM_BETA1=0", "CLIP_GRADIENT_NORM_TO_VALUE=0"])
  optimizer = config.build(exp.task()).learner.optimizer
  assert optimizer.beta1 == 0 and optimizer.clip_gradient_norm_to_value == 0
  out = capsys.readouterr().out
  assert ("warning: LmCloudSpmdTiny: paxlike runs ADAM_BETA1=0 (Pax: 0.9), "
          "CLIP_GRADIENT_NORM_TO_VALUE=0 (Pax: 5.0) as set") in out, out


def test_a_set_of_an_inactive_knob_and_an_unknown_name_are_refused():
  class UsesAdafactor(AdaTemplate):
    USE_ADAFACTOR = True

  with pytest.raises(UserError, match=r"--set CLIP_THRESHOLD=3.0: nothing reads it; "
                     r"AdaTemplate.task\(\) reads it only in the else branch"):
    _build(UsesAdafactor, ["CLIP_THRESHOLD=3.0"])

  class Unknown(AdaTemplate):
    CLIP_THRESHHOLD = 2.0  # no template reads this name

  with pytest.raises(UserError, match="CLIP_THRESHHOLD = 2.0 on Unknown: nothing reads it"):
    _build(Unknown)


# ----------------------------------------- Pax's modules, inputs and early stop

PAX_MODULE = """\
import jax
from jax import numpy as jnp
from paxlike.pax import base_experiment
from paxlike.pax import base_hyperparams
from paxlike.pax import base_input
from paxlike.pax import experiment_registry
from paxlike.pax import pax_fiddle
from paxlike.pax import tasks_lib
from paxlike.pax import trainer_lib
from paxlike.pax.tasks.lm import input_generator
from paxlike.pax.tasks.lm import model_params


class AdaptedSyntheticData(base_experiment.BaseExperiment):
  PERCORE_BATCH_SIZE = 1
  MAX_SEQ_LEN = 16

  def _dataset(self, is_training):
    input_p = input_generator.SyntheticLmData.HParams()
    input_p.batch_size = round(self.PERCORE_BATCH_SIZE * jax.local_device_count())
    input_p.seq_len = self.MAX_SEQ_LEN
    return pax_fiddle.Config(base_input.LingvoInputAdaptor, input=input_p,
                             is_training=is_training, num_infeed_hosts=jax.process_count())

  def datasets(self):
    return [self._dataset(is_training=True), self._dataset(is_training=False)]


class StopAtPplx(base_hyperparams.FiddleBaseParameterizable):
  target_log_pplx: float | None = None

  def __call__(self, metrics: dict[str, float], running_mode: trainer_lib.RunningMode,
               global_step: int, is_last_ckpt: bool, checkpoint_path) -> bool:
    print(f"early stop asked at {global_step}: {sorted(metrics)} {running_mode}")
    return metrics["eval_test_eval/metrics/log_pplx"] <= self.target_log_pplx


@experiment_registry.register
class Adapted(model_params.TransformerLmSpmdAdafactor, AdaptedSyntheticData):
  NUM_LAYERS = 1
  MODEL_DIMS = 32
  DIMS_PER_HEAD = 8
  VOCAB_SIZE = 256
  FPROP_DTYPE = jnp.float32
  ICI_MESH_SHAPE = [1, 2, 1]

  def task(self) -> tasks_lib.SingleTask.HParams:
    task_p = super().task()
    model_params.set_default_adam(task_p, 1e-2, self.WEIGHT_DECAY, warmup_steps=0,
                                  decay_start=0, decay_end=100)
    task_p.train.num_train_steps = 6
    task_p.train.eval_interval_steps = 2
    task_p.train.summary_interval_steps = 1
    task_p.early_stopping_fn = pax_fiddle.Config(StopAtPplx, target_log_pplx=100.0)
    return task_p
"""


def test_lingvo_adaptor_config_dry_runs_trains_evals_and_stops_early(tmp_path, monkeypatch):
  from paxlike import dry_run

  (tmp_path / "pax_adapted.py").write_text(PAX_MODULE)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "pax_adapted", raising=False)
  with registrations_undone():
    exp = experiment.instantiate(registry.get("pax_adapted.Adapted"))
    configs = experiment.build_checked(exp)
    report = dry_run.analyse(exp)
  # The adaptor's configs are read as the synthetic inputs they wrap, its fields on them.
  train_cfg, eval_cfg = configs.datasets
  assert (train_cfg.is_training, eval_cfg.is_training, eval_cfg.name) == (True, False, "eval")
  assert report["global_batch"] == 8 and report["features"]["ids"] == [16]
  job = tmp_path / "job"
  proc = run_cli(["--exp=pax_adapted.Adapted", f"--job_log_dir={job}"], cwd=tmp_path,
                 devices=2, pythonpath=[tmp_path, REPO_ROOT])
  assert proc.returncode == 0, describe(proc)
  # The first eval (step 2) reaches the target: the hook stops the run there.
  assert parse_trained_line(proc.stdout)["final_step"] == 2, describe(proc)
  asked = next(line for line in proc.stdout.splitlines() if line.startswith("early stop"))
  assert asked.startswith("early stop asked at 2: ["), asked
  assert "'eval_test_eval/metrics/log_pplx'" in asked and "RunningMode.TRAIN|EVAL" in asked
  assert re.search(r"^eval_test_eval at step 2: loss [\d.]+ log_pplx", proc.stdout, re.M), \
      describe(proc)
  assert (job / "checkpoints" / "checkpoint_00000002").is_dir()


def test_seqio_input_imports_without_tensorflow_and_maps_paxs_fields(monkeypatch):
  code = ("import sys, paxlike.pax.seqio_input; "
          "print(sorted(m for m in ('tensorflow', 'seqio') if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=REPO_ROOT, check=True).stdout
  assert out.strip() == "[]"

  cfg = seqio_input.SeqIOInput.HParams(
      name="C4Validation", mixture_name="c4_lm", split_name="validation",
      task_feature_lengths={"targets": 16}, is_training=False, reset_for_eval=True,
      feature_converter=seqio_input.LanguageModelFeatures(pack=False), input_random_seed=4321,
      batch_size=2, drop_remainder=False, annotate_padding_fields=True)
  monkeypatch.setitem(sys.modules, "seqio", None)  # as without the seqio extra
  with pytest.raises(UserError) as e:
    config.build(cfg)
  assert "pip install -e '.[seqio]'" in _one_line(e)

  class FakeSeqio:
    @staticmethod
    def get_mixture_or_task(name):
      return name

  from paxlike.inputs import seqio_input as core_seqio
  monkeypatch.setattr(core_seqio, "_seqio", lambda: FakeSeqio)
  inp = config.build(cfg)
  # Pax's repeat=None on an eval input is a finite input; the seed is input_random_seed.
  assert (inp.feature_converter, inp.pack, inp.repeat, inp.seed) == (
      "decoder", False, False, 4321)
  # What paxlike's converters cannot produce is refused when data is read, not when the
  # input is built: a dry run (C4 from TFDS, offline) needs only the shapes.
  cfg.feature_converter = seqio_input.LanguageModelFeatures(target_has_suffix=True)
  inp = config.build(cfg)
  assert {k: v.shape for k, v in inp.peek_specs().items()} == {
      "ids": (2, 16), "labels": (2, 16), "weights": (2, 16), "prompt_lens": (2,),
      "eval_sample_weights": (2,)}
  with pytest.raises(UserError) as e:
    inp.get_next()
  assert "target_has_suffix=True" in _one_line(e)


def type_name(cfg) -> str:
  import fiddle as fdl

  return fdl.get_callable(cfg).__name__


def test_paxs_helper_modules():
  m = py_utils.NestedMap(map_1d=("data",), inner=py_utils.NestedMap(x=1))
  m.extra = 3
  assert (m.map_1d, m["extra"], m.inner.x) == (("data",), 3, 1)
  assert jax.tree.leaves(jax.tree.map(lambda v: v * 2, py_utils.NestedMap(a=1, b=2))) == [2, 4]
  assert trainer_lib.RunningMode.detect(True, True, False) == (
      trainer_lib.RunningMode.TRAIN | trainer_lib.RunningMode.EVAL)

  class Fn(base_hyperparams.FiddleBaseParameterizable):
    target: float | None = None

  assert base_hyperparams.instantiate(Fn.HParams(target=2.0)).target == 2.0
  grok_dims = dict(vocab_size=8, model_dim=8, ff_dim=8, attention_num_heads=2,
                   attention_num_groups=1, attention_key_value_dim=4, num_transformer_layers=2,
                   moe=True, e_dim=4)
  # use_fp8, as praxis's builder: FP8 einsums on the projections and the experts.
  block = grok.GrokUniTransformerLmHParams(**grok_dims, use_fp8=True).stacked_transformer_tpl.block
  assert [type_name(c) for c in (
      block.transformer_layer_params_tpl.tr_atten_tpl.proj_tpl.einsum_tpl,
      block.moe_layer_tpl.einsum_tpl, block.moe_layer_tpl.einsum_gated_tpl)] == [
          "Fp8EinsumOp", "Fp8EinsumOp", "Fp8EinsumGatedOp"]
  # Pipelined, as praxis's builders: each stage's template holds its share of the layers.
  stage = grok.GrokUniTransformerLmHParams(
      **grok_dims, num_pipeline_stages=2).stacked_transformer_tpl.pipeline_stage
  assert (stage.num_layers, stage.moe_layers) == (1, [0])
  stage = glam.GlamUniTransformerLmHParams(
      vocab_size=8, model_dim=8, ff_dim=8, attention_num_heads=2, attention_key_value_dim=4,
      num_transformer_layers=8, moe=True, e_dim=4,
      num_pipeline_stages=2).stacked_transformer_tpl.pipeline_stage
  assert (stage.num_layers, stage.moe_layers) == (4, [0, 2])
  with pytest.raises(UserError, match="must split the layers evenly"):
    grok.GrokUniTransformerLmHParams(**grok_dims, num_pipeline_stages=3)
  stacked = pax_fiddle.Config(Fn)
  model_params.maybe_setup_moe_params(stacked)  # no experts: nothing to do, as in Pax
