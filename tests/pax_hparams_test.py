"""Pax's hyperparameters: nothing a user writes is ignored, Pax's names and meanings.

Mostly in-process (experiment classes built here); a few CLI runs check the
exit status and that a refused run leaves no job_log_dir behind.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import REPO_ROOT, TINY, describe, run_cli

from paxlike import config, experiment, registry
from paxlike.errors import UserError
from paxlike.inputs.base_input import BaseInput
from paxlike.layers.transformer import AutodiffCheckpointType
from paxlike.learners import Learner
from paxlike.training_experiment import pax_batch_size

# A tiny LM so the builds stay cheap.
SMALL = ["NUM_LAYERS=1", "MODEL_DIMS=16", "NUM_HEADS=2", "VOCAB_SIZE=32", "MAX_SEQ_LEN=8",
         "PERCORE_BATCH_SIZE=1"]


def _tiny_cls():
  return registry.get(TINY)


def _build(cls, overrides=()):
  exp = experiment.instantiate(cls, list(overrides))
  return exp, experiment.build_checked(exp)


# ------------------------------------------------------------ nothing ignored


def test_unread_attributes_on_a_user_class_are_refused_naming_each():
  class MyExp(_tiny_cls()):
    NUM_STAGES = 4  # Pax's pipelining: only the pipelined templates read it
    TRAIN_SEED = 7  # paxlike's old name
    WARMUP_STEPZ = 10  # a typo nothing reads

  with pytest.raises(UserError) as e:
    _build(MyExp)
  lines = str(e.value).splitlines()
  assert len(lines) == 3, lines
  by_name = {line.split(" ")[0]: line for line in lines}
  assert by_name["NUM_STAGES"].startswith("NUM_STAGES = 4 on MyExp: nothing reads it;")
  assert "only a pipelined experiment reads it" in by_name["NUM_STAGES"]
  assert "TransformerLmSpmdPipelineAdafactor" in by_name["NUM_STAGES"]
  assert "paxlike calls it TRAINING_SEED" in by_name["TRAIN_SEED"]
  assert "WARMUP_STEPZ = 10 on MyExp: nothing reads it" in by_name["WARMUP_STEPZ"]


def test_unread_set_is_refused_and_old_names_point_to_paxs():
  # The tiny experiment uses the cosine schedule: the exponential one's knobs do nothing.
  with pytest.raises(UserError, match=r"--set LR_LRED_WARMUP=5: nothing reads it; "
                     r"LR_SCHEDULE='linear_rampup_cosine_decay' does not read it"):
    _build(_tiny_cls(), [*SMALL, "LR_LRED_WARMUP=5"])
  with pytest.raises(UserError, match="paxlike calls it CHECKPOINT_MAX_TO_KEEP"):
    _build(_tiny_cls(), ["MAX_CKPT_TO_KEEP=3"])


def test_a_user_mixins_own_attribute_read_by_its_datasets_passes(tmp_path):
  tokens = tmp_path / "tokens.npy"
  np.save(tokens, np.arange(64, dtype=np.int32))
  base = _tiny_cls()

  class TokensMixin(experiment.BaseExperiment):
    TOKENS_NPY = str(tokens)

    def datasets(self):
      ds = base.datasets(self)
      assert np.load(self.TOKENS_NPY).size == 64
      return ds

  class MyExp(TokensMixin, base):
    pass

  _, configs = _build(MyExp, SMALL)
  assert configs.datasets

  class Unread(base):  # the same attribute with nothing reading it is refused
    TOKENS_NPY = str(tokens)

  with pytest.raises(UserError, match="TOKENS_NPY = .* on Unread: nothing reads it"):
    _build(Unread, SMALL)


class _Sets300(registry.get(TINY)):
  def task(self):
    task_p = super().task()
    task_p.train.num_train_steps = 300
    return task_p


def test_a_set_that_task_overwrites_is_refused_naming_the_task():
  with pytest.raises(UserError, match=r"--set NUM_TRAIN_STEPS=3 is overwritten by "
                     r".*_Sets300\.task\(\), which sets task\.train\.num_train_steps = 300"):
    _build(_Sets300, [*SMALL, "NUM_TRAIN_STEPS=3"])
  # Without the --set the task()'s value stands; another --set is not affected.
  _, configs = _build(_Sets300, [*SMALL, "LEARNING_RATE=0.01"])
  assert configs.task.train.num_train_steps == 300
  assert configs.task.train.learner.optimizer.learning_rate == 0.01


def test_a_task_that_derives_a_field_from_the_set_key_is_not_refused():
  class Derives(registry.get(TINY)):
    def task(self):
      task_p = super().task()
      task_p.model.hidden_dims = 3 * self.MODEL_DIMS  # --set MODEL_DIMS reaches it
      return task_p

  _, configs = _build(Derives, [*SMALL, "MODEL_DIMS=32"])
  assert configs.task.model.hidden_dims == 96


def test_set_of_a_task_path_applies_after_task():
  _, configs = _build(_Sets300, [*SMALL, "train.num_train_steps=3",
                                 "train.learner.optimizer.clip_gradient_norm_to_value=2.5"])
  assert configs.task.train.num_train_steps == 3
  assert configs.task.train.learner.optimizer.clip_gradient_norm_to_value == 2.5
  with pytest.raises(UserError, match="the task config has no train.num_trian_steps"):
    _build(_Sets300, ["train.num_trian_steps=3"])


def test_a_task_edit_of_a_missing_path_is_one_sentence_naming_it():
  class EditsMissing(registry.get(TINY)):
    def task(self):
      task_p = super().task()
      task_p.model.lm_tpl.softmax_tpl.z_loss = 1e-4  # praxis calls it z_loss_weight
      return task_p

  with pytest.raises(UserError) as e:
    _build(EditsMissing)
  msg = str(e.value)
  assert "EditsMissing.task()" in msg and "z_loss" in msg
  assert "task_p.model.lm_tpl.softmax_tpl.z_loss = 1e-4" in msg  # the user's line
  assert "\n" not in msg


class _DefaultAdam(registry.get(TINY)):
  """Pax's LmCloudSpmd.task(): set_default_adam replaces the template's optimizer."""

  def task(self):
    from paxlike.pax.tasks.lm import model_params

    task_p = super().task()
    model_params.set_default_adam(task_p, self.LEARNING_RATE, self.WEIGHT_DECAY)
    return task_p


def test_a_string_set_that_task_replaces_is_refused_quoting_the_users_value():
  # set_default_adam's exponential schedule replaces whatever LR_SCHEDULE picks.
  for value in ("constant", "linear_rampup_cosine_decay"):
    with pytest.raises(UserError) as e:
      _build(_DefaultAdam, [*SMALL, f"LR_SCHEDULE={value}"])
    assert str(e.value) == (
        f"--set LR_SCHEDULE='{value}' is overwritten by _DefaultAdam.task(), which replaces "
        "task.train.learner.optimizer.lr_schedule with its own LinearRampupExponentialDecay "
        "config; stop task() from replacing it.")
  with pytest.raises(UserError, match=r"^--set OPTIMIZER='sgd' is overwritten by "
                     r"_DefaultAdam\.task\(\), which replaces task\.train\.learner\.optimizer "
                     r"with its own Adam config") as e:
    _build(_DefaultAdam, [*SMALL, "OPTIMIZER=sgd"])
  assert "\n" not in str(e.value)


def test_an_adam_knob_under_a_replaced_optimizer_names_the_replacement():
  # The template's Adafactor leaves ADAM_EPSILON unread, but so does the Adam that
  # set_default_adam puts in its place: the reason is task()'s, not OPTIMIZER's.
  # (Pax's LmCloudSpmdPipeline: the Adafactor template, set_default_adam in task().)
  class AdafactorTemplate(_DefaultAdam):
    OPTIMIZER = "adafactor"

  with pytest.raises(UserError) as e:
    _build(AdafactorTemplate, [*SMALL, "ADAM_EPSILON=1e-7"])
  assert str(e.value) == (
      "--set ADAM_EPSILON=1e-07: nothing reads it; _DefaultAdam.task() replaces "
      "task.train.learner.optimizer with its own Adam config, which does not read it.")
  # The schedule's knobs sit inside the replaced optimizer too.
  with pytest.raises(UserError, match=r"^--set LR_LRED_WARMUP=5: nothing reads it; "
                     r"_DefaultAdam\.task\(\) replaces task\.train\.learner\.optimizer "):
    _build(AdafactorTemplate, [*SMALL, "LR_LRED_WARMUP=5"])
  # Without the replacement the template's own reason stands.
  with pytest.raises(UserError, match=r"OPTIMIZER='adafactor' is not Adam"):
    _build(registry.get(TINY), [*SMALL, "OPTIMIZER=adafactor", "ADAM_EPSILON=1e-7"])


def test_a_not_used_reason_names_the_users_value_not_a_probe():
  # Checking LR_SCHEDULE against task() builds the template with other schedules; the
  # reason LR_LRED_WARMUP is not read is still the user's schedule.
  with pytest.raises(UserError) as e:
    _build(_Sets300, [*SMALL, "LR_LRED_WARMUP=5", "LR_SCHEDULE=constant"])
  assert str(e.value) == ("--set LR_LRED_WARMUP=5: nothing reads it; "
                          "LR_SCHEDULE='constant' does not read it.")


class _Frozen(registry.get(TINY)):
  """A task() that ignores every --set: it builds the template from the class's values."""

  def task(self):
    saved = {k: self.__dict__.pop(k) for k in self._overrides}
    try:
      return super().task()
    finally:
      self.__dict__.update(saved)


class _FrozenLora(_Frozen):
  USE_LORA = True


# A value other than LmCloudSpmdTiny's for each knob with a fixed set of values (each of
# experiment._string_choices), and for an enum member, an activation class and a dtype.
OTHER_VALUES = {
    "LR_SCHEDULE": ["LR_SCHEDULE=constant"],
    "OPTIMIZER": ["OPTIMIZER=adafactor"],
    "ACTIVATION": ["ACTIVATION=gelu"],
    "CHECKPOINT_POLICY": ["CHECKPOINT_POLICY=SAVE_DOT_ONLY"],
    "NORM_POLICY": ["NORM_POLICY=post"],
    "EMBEDDING_LOOKUP_STYLE": ["EMBEDDING_LOOKUP_STYLE=matmul"],
    "LORA_TARGET_LAYERS": ["LORA_TARGET_LAYERS=mlp"],  # on _FrozenLora
    "ACTIVATION_CLS": ["ACTIVATION_CLS=GELU"],
    "FPROP_DTYPE": ["FPROP_DTYPE=bfloat16"],
}


@pytest.mark.parametrize("key", sorted(OTHER_VALUES))
def test_a_set_of_any_kind_that_task_ignores_is_refused(key):
  """Each knob is probed with another value the template takes (not `value + '_'`, which no
  template takes, so a --set of any string knob used to pass unchecked)."""
  assert {k for k in OTHER_VALUES if experiment._string_choices(k)} == {
      "LR_SCHEDULE", "OPTIMIZER", "ACTIVATION", "CHECKPOINT_POLICY", "NORM_POLICY",
      "EMBEDDING_LOOKUP_STYLE", "LORA_TARGET_LAYERS"}
  with pytest.raises(UserError, match=rf"(^|\n)--set {key}=\S+ is overwritten by "
                     r"_Frozen\.task\(\)"):
    _build(_FrozenLora if key.startswith("LORA_") else _Frozen, OTHER_VALUES[key])


def test_an_enum_set_that_task_ignores_is_refused():
  class PaxPolicy(_Frozen):  # Pax's files write the policy as praxis's enum
    CHECKPOINT_POLICY = AutodiffCheckpointType.SAVE_NOTHING

  with pytest.raises(UserError) as e:
    _build(PaxPolicy, ["CHECKPOINT_POLICY=SAVE_DOT_ONLY"])
  assert str(e.value) == (
      "--set CHECKPOINT_POLICY=AutodiffCheckpointType.SAVE_DOT_ONLY is overwritten by "
      "_Frozen.task(), which sets task.model.checkpoint_policy = "
      "AutodiffCheckpointType.SAVE_NOTHING; use --set "
      "model.checkpoint_policy=AutodiffCheckpointType.SAVE_DOT_ONLY to set the field after "
      "task(), or stop task() from setting it.")


def test_every_shipped_string_knob_is_probed_within_its_set_or_is_free_form():
  """A string knob with a fixed set of values needs its set in experiment._string_choices,
  or its --set goes unchecked against task(); the others here take any string."""
  free_form = {"INIT_FROM", "GENERATOR", "SCORER", "INPUT_KEY", "TARGET_KEY",
               "EMB_W_DATA_DIMS"}
  registry.import_shipped()
  strings = set()
  for name in registry.list_names():
    exp = registry.get(name)()
    strings |= {h.name for h in experiment.hparams(exp) if isinstance(h.value, str)}
  assert {k for k in strings if not experiment._string_choices(k)} <= free_form


# ------------------------------------------------ Pax's knobs that state a fact


def test_num_gpus_is_checked_against_the_mesh_not_refused(capsys):
  """Pax's nvidia.py sets NUM_GPUS, which nothing reads in Pax: a class runs as written,
  with a warning when the mesh (which decides) takes another count; a --set is refused
  unless it holds, and None claims nothing."""
  class Gpus(_tiny_cls()):  # ICI_MESH_SHAPE [1, 1, 1]
    NUM_GPUS = 1

  class Stale(_tiny_cls()):
    NUM_GPUS = 64

  _build(Gpus)
  _build(Stale, ["NUM_GPUS=1"])
  _build(Stale, ["NUM_GPUS=None"])
  assert "NUM_GPUS" not in capsys.readouterr().out
  _build(Stale)
  assert ("warning: NUM_GPUS = 64 on Stale does not hold: the run takes 1 device "
          "(ICI_MESH_SHAPE [1, 1, 1]); Pax reads NUM_GPUS nowhere, and paxlike only checks "
          "it: the mesh decides.") in capsys.readouterr().out
  with pytest.raises(UserError) as e:
    _build(Gpus, ["NUM_GPUS=8"])
  assert str(e.value) == (
      "--set NUM_GPUS=8: the run takes 1 device (ICI_MESH_SHAPE [1, 1, 1]); Pax reads "
      "NUM_GPUS nowhere, and paxlike only checks it: the mesh decides; set the mesh's shapes "
      "instead (or --set NUM_GPUS=None).")


def test_num_gpus_of_a_pmap_run_is_checked_once_the_devices_are_known():
  # A pmap run takes every device: before the backend starts (a dry run) nothing is known,
  # after it (main builds the experiment then) the count is checked like a mesh's.
  class PmapGpus(_tiny_cls()):
    ICI_MESH_SHAPE = None
    NUM_GPUS = 8

  experiment.build_checked(experiment.instantiate(PmapGpus, ["NUM_GPUS=4"]))
  experiment.build_checked(experiment.instantiate(PmapGpus, ["NUM_GPUS=4"]), device_count=4)
  with pytest.raises(UserError) as e:
    experiment.build_checked(experiment.instantiate(PmapGpus, ["NUM_GPUS=4"]), device_count=1)
  assert str(e.value).startswith(
      "--set NUM_GPUS=4: the run takes 1 device (pmap: every device); Pax reads NUM_GPUS "
      "nowhere, and paxlike only checks it: the devices decide; set the devices it runs on "
      "instead (or --set NUM_GPUS=None)."), str(e.value)


def test_enable_bfloat16_on_an_lm_is_checked_against_fprop_dtype(capsys):
  """Only Pax's BERT templates read ENABLE_BFLOAT16 (paxlike's too); on an LM it is checked
  against FPROP_DTYPE, which decides, in Pax too."""
  class Bf16(_tiny_cls()):
    ENABLE_BFLOAT16 = True
    FPROP_DTYPE = jnp.bfloat16

  class Says(_tiny_cls()):  # FPROP_DTYPE float32
    ENABLE_BFLOAT16 = True

  _build(Bf16, SMALL)
  assert "ENABLE_BFLOAT16" not in capsys.readouterr().out
  _build(Says, SMALL)
  assert ("warning: ENABLE_BFLOAT16 = True on Says does not hold: FPROP_DTYPE is float32; "
          "an LM's activations take FPROP_DTYPE, in Pax too (only its BERT templates read "
          "ENABLE_BFLOAT16).") in capsys.readouterr().out
  with pytest.raises(UserError, match=r"^--set ENABLE_BFLOAT16=False: FPROP_DTYPE is bfloat16;"
                     r".* set FPROP_DTYPE instead \(or --set ENABLE_BFLOAT16=None\)\.$"):
    _build(Bf16, [*SMALL, "ENABLE_BFLOAT16=False"])


def test_every_shipped_experiment_reads_what_it_sets():
  registry.import_shipped()
  refused = {}
  for name in registry.list_names():
    exp = experiment.instantiate(registry.get(name), [])
    try:
      experiment.build_checked(exp)
    except UserError as e:
      refused[name] = str(e)
  assert not refused, refused


# ------------------------------------------------------------------ schedules


def _lred(step, warmup, start, end, min_ratio, peak):
  """praxis's LinearRampupExponentialDecay multiplier, typed from its definition."""
  if warmup and step < warmup:
    return peak * step / warmup
  if step < start:
    return peak
  if step >= end:
    return peak * min_ratio
  return peak * math.exp(math.log(min_ratio) * (step - start) / (end - start))


def _cos(step, warmup, start, end, min_ratio, peak):
  """praxis's LinearRampupCosineDecay multiplier."""
  if warmup and step < warmup:
    return peak * step / warmup
  if step < start:
    return peak
  if step >= end:
    return peak * min_ratio
  lo = peak * min_ratio
  return lo + (peak - lo) * 0.5 * (1 + math.cos(math.pi * (step - start) / (end - start)))


@pytest.mark.parametrize("schedule,formula", [("linear_rampup_exponential_decay", _lred),
                                              ("linear_rampup_cosine_decay", _cos)])
@pytest.mark.parametrize("warmup", [0, 40])
def test_schedules_follow_praxis_formulas(schedule, formula, warmup):
  lr, start, end, min_ratio, peak = 2e-3, 50, 250, 0.1, 0.8
  sched = Learner(learning_rate=lr, schedule=schedule, warmup_steps=warmup, decay_start=start,
                  decay_end=end, min_ratio=min_ratio, max=peak).lr_schedule()
  for step in (0, warmup // 2, warmup, start, (start + end) // 2, end, end + 100):
    want = lr * formula(step, warmup, start, end, min_ratio, peak)
    assert float(sched(step)) == pytest.approx(want, rel=1e-5, abs=1e-12), step
  # Warmup 0 starts at the full rate (Pax); a warmup starts at 0.
  assert float(sched(0)) == pytest.approx(0.0 if warmup else lr * peak)


def test_schedule_knobs_are_read_under_paxs_names():
  _, configs = _build(_tiny_cls(), [*SMALL, "LR_SCHEDULE=linear_rampup_exponential_decay",
                                    "LR_LRED_WARMUP=0", "LR_LRED_DECAY_START=10",
                                    "LR_LRED_DECAY_END=20", "LR_LRED_MIN_RATIO=0.5",
                                    "LR_LRED_MAX=2.0"])
  sched = fdl.build(configs.task.train.learner).optimizer.lr_schedule  # Pax's template's
  assert (sched.warmup_steps, sched.decay_start, sched.decay_end, sched.min_ratio,
          sched.max) == (0, 10, 20, 0.5, 2.0)
  with pytest.raises(UserError, match="LR_LRED_WARMUP <= LR_LRED_DECAY_START"):
    Learner(schedule="linear_rampup_exponential_decay", warmup_steps=30, decay_start=10,
            decay_end=20)


def test_adam_clip_threshold_clips_each_update_to_that_rms():
  g = {"w": jnp.asarray([3.0, -4.0, 0.5, 2.0]), "b": jnp.asarray([1e-3])}
  params = jax.tree.map(jnp.zeros_like, g)
  eps, lr, thr = 1e-6, 0.1, 0.5

  def first_update(clip, eps_root=0.0):
    tx = Learner(learning_rate=lr, beta1=0.9, beta2=0.99, epsilon=eps, epsilon_root=eps_root,
                 clip_threshold=clip).transform()
    upd, _ = tx.update(g, tx.init(params), params)
    return jax.tree.map(np.asarray, upd)

  for clip in (0.0, thr):
    upd = first_update(clip)
    for k, gk in g.items():
      gk = np.asarray(gk)
      u = gk / (np.abs(gk) + eps)  # Adam's first step after bias correction
      if clip:
        u = u / max(1.0, np.sqrt(np.mean(u ** 2)) / clip)
      np.testing.assert_allclose(upd[k], -lr * u, rtol=1e-5)
  # epsilon_root goes inside the square root.
  upd = first_update(0.0, eps_root=1.0)
  gw = np.asarray(g["w"])
  np.testing.assert_allclose(upd["w"], -lr * gw / (np.sqrt(gw ** 2 + 1.0) + eps), rtol=1e-5)
  assert isinstance(Learner().transform(), optax.GradientTransformation)


# ------------------------------------------------------------- batch sizes


def test_fractional_and_float_percore_batch_sizes_follow_pax():
  assert pax_batch_size("PERCORE_BATCH_SIZE", 0.75, 4) == 3
  assert pax_batch_size("PERCORE_BATCH_SIZE", 4.0, 4) == 16
  assert pax_batch_size("PERCORE_BATCH_SIZE", 4, 4) == 16
  assert pax_batch_size("PERCORE_BATCH_SIZE", 0.5, 4, processes=2) == 2  # global 4
  with pytest.raises(UserError, match="global batch of 1.2 rows, not a whole number"):
    pax_batch_size("PERCORE_BATCH_SIZE", 0.3, 4)
  with pytest.raises(UserError, match="2 hosts cannot share evenly"):
    pax_batch_size("PERCORE_BATCH_SIZE", 0.0625, 8, processes=2)
  with pytest.raises(UserError, match="1.5 rows per host"):
    pax_batch_size("PERCORE_BATCH_SIZE", 1.5, 1)
  # In an experiment, on this test's 8 fake devices: 0.75 x 8 = 6 rows.
  _, configs = _build(_tiny_cls(), [*SMALL[:-1], "PERCORE_BATCH_SIZE=0.75"])
  assert configs.datasets[0].batch_size == 0.75 * jax.local_device_count()


# ----------------------------------------------------------------- BaseInput


class _PaxStyleInput(BaseInput):  # praxis style: annotations, no @dataclass
  seq_len: int = 4
  vocab: list = dataclasses.field(default_factory=lambda: [5, 6])

  def get_next(self):
    return {"ids": np.full((self.batch_size, self.seq_len), self.vocab[0], np.int32)}


@dataclasses.dataclass
class _Decorated(_PaxStyleInput):  # an explicit @dataclass on top still works
  extra: int = 1


def test_base_input_subclass_needs_no_dataclass_decorator():
  inp = fdl.build(fdl.Config(_PaxStyleInput, batch_size=2, seq_len=3, is_training=True))
  assert inp.get_next()["ids"].shape == (2, 3)
  assert inp.vocab == [5, 6]
  dec = fdl.build(fdl.Config(_Decorated, batch_size=1, extra=7, vocab=[9]))
  assert (dec.extra, dec.seq_len, dec.get_next()["ids"][0, 0]) == (7, 4, 9)


# ------------------------------------------------------------------------ CLI

_MODULE = textwrap.dedent("""
    from experiments.lm.lm_cloud import LmCloudSpmdTiny
    from paxlike import experiment_registry

    @experiment_registry.register
    class MyPaxExp(LmCloudSpmdTiny):
      NUM_LAYERS = 1
      MODEL_DIMS = 16
      NUM_HEADS = 2
      VOCAB_SIZE = 32
      MAX_SEQ_LEN = 8
      PERCORE_BATCH_SIZE = 1
      NUM_EXPERTS = 8
""")


@pytest.mark.parametrize("mode", ["train", "dry_run"])
def test_refused_run_exits_2_and_leaves_no_job_dir(tmp_path, mode):
  (tmp_path / "my_pax_exp.py").write_text(_MODULE)
  job = tmp_path / "job"
  proc = run_cli(["--exp=my_pax_exp.MyPaxExp", f"--job_log_dir={job}", f"--mode={mode}",
                  "--set", "ICI_MESH_SHAPE=[1,1,1]"],
                 cwd=tmp_path, pythonpath=[tmp_path, REPO_ROOT])
  assert proc.returncode == 2, describe(proc)
  assert ("NUM_EXPERTS = 8 on MyPaxExp: nothing reads it; no template reads it, in Pax "
          "either: for mixture-of-experts layers, task() sets stacked_p.num_experts"
          ) in proc.stderr, describe(proc)
  assert "Traceback" not in proc.stderr
  assert not job.exists()


def test_target_log_pplx_stops_at_the_first_eval_that_reaches_it():
  from paxlike import trainer

  evals = {"eval_test_a": {"log_pplx": 2.5}, "eval_test_b": {"log_pplx": 1.9}}
  assert trainer._reached_target(2.0, evals, 10)
  assert not trainer._reached_target(1.5, evals, 10)
  assert not trainer._reached_target(None, evals, 10)
  _, configs = _build(_tiny_cls(), [*SMALL, "TARGET_LOG_PPLX=2.0"])
  assert configs.task.train.target_log_pplx == 2.0


def test_target_log_pplx_without_evals_is_refused(tmp_path):
  job = tmp_path / "job"
  proc = run_cli([f"--exp={TINY}", f"--job_log_dir={job}", *[f"--set={s}" for s in SMALL],
                  "--set=TARGET_LOG_PPLX=2.0"], cwd=tmp_path, pythonpath=[REPO_ROOT])
  assert proc.returncode == 2, describe(proc)
  assert "TARGET_LOG_PPLX=2.0 stops training when an eval reaches it" in proc.stderr
  assert not job.exists()


def test_none_learning_rate_and_cosine_steps_follow_paxs_c4_rule():
  """c4.py lets LEARNING_RATE and the cosine schedule's steps be None: they follow from the
  global batch (PERCORE_BATCH_SIZE x devices), 2e-5 up to 3584 rows, warmup 265 x 1536 /
  batch steps, decay from the step after to 108600 x 1536 / batch."""
  import jax

  class Derived(_tiny_cls()):
    LEARNING_RATE = None
    LR_SCHEDULE = "linear_rampup_cosine_decay"
    LR_COS_WARMUP = LR_COS_DECAY_START = LR_COS_DECAY_END = None

  class Unset(_tiny_cls()):
    LR_SCHEDULE = "linear_rampup_exponential_decay"
    LR_LRED_DECAY_END = None

  _, configs = _build(Derived, SMALL)
  opt = fdl.build(configs.task.train.learner).optimizer
  batch = 1 * jax.device_count()  # SMALL: PERCORE_BATCH_SIZE=1
  warmup = -(-265 * 1536 // batch)
  assert opt.learning_rate == 2e-5
  assert (opt.lr_schedule.warmup_steps, opt.lr_schedule.decay_start,
          opt.lr_schedule.decay_end) == (warmup, warmup + 1, -(-108600 * 1536 // batch))
  with pytest.raises(UserError, match=r"^LR_LRED_DECAY_END=None: only LEARNING_RATE and "):
    _build(Unset, SMALL)


def test_a_negative_learning_rate_or_eval_interval_is_one_line():
  from paxlike.task import TrainSettings

  with pytest.raises(UserError, match=r"^LEARNING_RATE=-1\.0 must be 0 or more\.$"):
    _build(_tiny_cls(), [*SMALL, "LEARNING_RATE=-1"])
  with pytest.raises(UserError, match=r"^task.train.eval_interval_steps must be 0 \(no evals "):
    TrainSettings(eval_interval_steps=-1)


def test_a_wrongly_typed_dim_or_a_negative_seed_is_one_line():
  class Typed(_tiny_cls()):
    MODEL_DIMS = "128"

  with pytest.raises(UserError, match=r"^MODEL_DIMS must be a positive number, got '128'\.$"):
    _build(Typed, [])
  with pytest.raises(UserError, match=r"^task.train.seed \(TRAINING_SEED\) must be a whole "):
    config.build(_build(_tiny_cls(), [*SMALL, "TRAINING_SEED=-1"])[1].task)
