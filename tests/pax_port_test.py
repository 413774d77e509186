"""A module written as Pax users write them, importing from paxlike.pax, runs.

The module is written into a temporary directory, dry-run in process on a
[1, 2, 2] mesh, then trained through the CLI on 4 fake devices for 3 steps
whose cadence comes from the task() edits under task_p.train.
"""

from __future__ import annotations

import re
import sys
import textwrap

import pytest
from conftest import REPO_ROOT, describe, parse_trained_line, registrations_undone, run_cli

HEADER = """\
from jax import numpy as jnp
import numpy as np
from paxlike.pax import base_experiment
from paxlike.pax import base_input
from paxlike.pax import experiment_registry
from paxlike.pax import layers
from paxlike.pax import pax_fiddle
from paxlike.pax import tasks_lib
from paxlike.pax.tasks.lm import model_params
"""

# Rows count up modulo the vocabulary: each next token is the current one plus one.
INPUT = """
{decorator}class CountingInput(base_input.BaseInput):
  seq_len: int = 16
  vocab_size: int = 64

  def __post_init__(self):
    super().__post_init__()
    self._step = 0

  def get_next(self):
    rng = np.random.default_rng([self.seed, self._step, max(self.infeed_host_index, 0)])
    self._step += 1
    start = rng.integers(self.vocab_size, size=(self.batch_size, 1))
    rows = (start + np.arange(self.seq_len + 1)) % self.vocab_size
    return {{"ids": rows[:, :-1].astype(np.int32), "labels": rows[:, 1:].astype(np.int32),
            "weights": np.ones((self.batch_size, self.seq_len), np.float32)}}

  def reset(self):
    self._step = 0
"""

EXPERIMENT = """
class CountingData(base_experiment.BaseExperiment):
  PERCORE_BATCH_SIZE = 0.5  # a global batch of 2 on 4 devices
  MAX_SEQ_LEN = 16

  def datasets(self):
    import jax
    batch_size = round(self.PERCORE_BATCH_SIZE * jax.local_device_count())
    return [pax_fiddle.Config(CountingInput, batch_size=batch_size, seq_len=self.MAX_SEQ_LEN,
                              vocab_size=self.VOCAB_SIZE, is_training=True)]


@experiment_registry.register
class PaxIdiomLm(model_params.TransformerLmSpmdAdafactor, CountingData):
  NUM_LAYERS = 2
  MODEL_DIMS = 32
  NUM_HEADS = None
  DIMS_PER_HEAD = 8
  VOCAB_SIZE = 64
  FPROP_DTYPE = jnp.float32
  {activation}
  USE_REPEATED_LAYER = True
  CHECKPOINT_POLICY = layers.AutodiffCheckpointType.SAVE_NOTHING
  ICI_MESH_SHAPE = [1, 2, 2]

  def task(self) -> tasks_lib.SingleTask.HParams:
    task_p = super().task()
    model_params.set_default_adam(task_p, 1e-2, self.WEIGHT_DECAY, warmup_steps=1,
                                  decay_start=2, decay_end=100)
    task_p.train.num_train_steps = 3
    task_p.train.save_interval_steps = 2
    task_p.train.summary_interval_steps = 1
    task_p.train.learner.repeat_prefix_sep = '_'
    return task_p
"""


def write_module(tmp_path, *, dataclass_decorator: bool, activation_cls: bool) -> None:
  head = HEADER + ("import dataclasses\n" if dataclass_decorator else "")
  text = head + INPUT.format(decorator="@dataclasses.dataclass\n" if dataclass_decorator else "")
  text += EXPERIMENT.format(activation="ACTIVATION_CLS = layers.GELU" if activation_cls
                            else 'ACTIVATION = "gelu"')
  (tmp_path / "pax_idiom.py").write_text(textwrap.dedent(text))


def params_line(job, name: str) -> str:
  text = (job / "model_params.txt").read_text()
  found = re.findall(rf"^task\.{re.escape(name)}\b.*$", text, re.M)
  assert found, f"no task.{name} in model_params.txt:\n{text}"
  return found[0]


def dry_run_and_train(tmp_path, monkeypatch):
  """Dry-runs pax_idiom.PaxIdiomLm (in process) and trains it on 4 devices; the job dir."""
  from paxlike import dry_run, experiment, registry

  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "pax_idiom", raising=False)  # each test writes its own
  with registrations_undone():
    exp = experiment.instantiate(registry.get("pax_idiom.PaxIdiomLm"))
    report = dry_run.analyse(exp)
  assert report["mesh"] == {"replica": 1, "data": 2, "mdl": 2}
  assert report["params"] > 0
  job = tmp_path / "job"
  proc = run_cli(["--exp=pax_idiom.PaxIdiomLm", f"--job_log_dir={job}"], cwd=tmp_path,
                 devices=4, pythonpath=[tmp_path, REPO_ROOT])
  assert proc.returncode == 0, describe(proc)
  trained = parse_trained_line(proc.stdout)
  assert trained["final_step"] == 3, describe(proc)  # task_p.train.num_train_steps = 3
  # task_p.train.summary_interval_steps = 1: a summary at step 2 too (neither first nor last).
  assert re.search(r"\bstep 2 loss ", proc.stdout + proc.stderr), describe(proc)
  return job


def test_pax_idiom_module_dry_runs_and_trains_three_steps(tmp_path, monkeypatch):
  """As Pax writes it: a BaseInput with annotated fields and no @dataclass, ACTIVATION_CLS."""
  write_module(tmp_path, dataclass_decorator=False, activation_cls=True)
  job = dry_run_and_train(tmp_path, monkeypatch)
  # task_p.train.save_interval_steps = 2: a checkpoint at 2, and the last one at 3.
  steps = sorted(p.name for p in (job / "checkpoints").glob("checkpoint_*"))
  assert steps == ["checkpoint_00000002", "checkpoint_00000003"]
  # set_default_adam replaced the Adafactor template's learner with praxis's Adam config.
  assert params_line(job, "train.learner.optimizer.beta2").endswith("= 0.99")
  assert params_line(job, "train.learner.optimizer.lr_schedule.decay_end").endswith("= 100")
  assert re.search(r"\b5\.0$",
                   params_line(job, "train.learner.optimizer.clip_gradient_norm_to_value"))
  # NUM_HEADS = None: the heads are MODEL_DIMS / DIMS_PER_HEAD = 32 / 8.
  assert re.search(r"\b4$", params_line(job, "model.num_heads"))
  assert params_line(job, "model.activation").endswith("'gelu'")  # ACTIVATION_CLS = layers.GELU


def test_set_default_adafactor_and_pax_train_edits_reach_the_built_task():
  from paxlike import config
  from paxlike.errors import UserError
  from paxlike.pax import optimizers, schedules
  from paxlike.pax.tasks.lm import model_params

  class Exp(model_params.TransformerLmSpmdAdafactor):
    pass

  task_p = Exp().task()
  # The template's own learner is Pax's set_default_adafactor, editable as in Pax.
  task_p.train.learner.optimizer.lr_schedule.decay_end = 50000
  opt = config.build(task_p).learner.optimizer
  assert isinstance(opt, optimizers.ShardedAdafactor)
  assert (opt.decay_method, opt.beta1, opt.decay_adam, opt.learning_rate) == (
      "adam", 0.9, 0.99, 2.5e-4)
  assert (opt.lr_schedule.warmup_steps, opt.lr_schedule.decay_end) == (4000, 50000)
  model_params.set_default_adam(task_p, 3e-4, 0.0)
  task_p.train.learner.optimizer.lr_schedule.warmup_steps = 10  # Pax edits it afterwards
  task_p.train.num_train_steps = 1e3  # Pax writes step counts as floats
  task_p.train.save_max_to_keep = 3
  task_p.train.random_seed = 7  # Pax's name for the seed
  task = config.build(task_p)
  assert task.train.seed == 7
  opt, train = task.learner.optimizer, task.train
  assert isinstance(opt, optimizers.Adam)
  assert (opt.learning_rate, opt.weight_decay, opt.beta2, opt.clip_threshold) == (
      3e-4, 0.0, 0.99, 1.0)
  sched = opt.lr_schedule
  assert isinstance(sched, schedules.LinearRampupExponentialDecay)
  assert (sched.warmup_steps, sched.decay_start, sched.decay_end, sched.min_ratio) == (
      10, 4001, 300000, 0.1)
  assert opt.clip_gradient_norm_to_value == 5.0
  assert task.learner.lr_schedule()(10) == pytest.approx(3e-4)  # the peak, after warmup
  assert (train.num_train_steps, train.max_checkpoints_to_keep) == (1000, 3)
  model_params.set_default_adafactor(task_p, 1e-3, 1e-2, decay_end=50000,
                                     clip_gradient_norm_to_value=2.0)
  opt = config.build(task_p).learner.optimizer
  assert isinstance(opt, optimizers.ShardedAdafactor)
  assert (opt.decay_method, opt.beta1, opt.decay_adam, opt.weight_decay) == ("adam", 0.9, 0.99,
                                                                            1e-2)
  assert (opt.lr_schedule.decay_end, opt.clip_gradient_norm_to_value) == (50000, 2.0)
  task_p.train.num_train_steps = 2.5
  with pytest.raises(UserError, match="num_train_steps must be a whole number"):
    config.build(task_p)


def test_pipelined_template_ported_by_its_imports_dry_runs(tmp_path):
  (tmp_path / "pax_pipe.py").write_text(textwrap.dedent("""\
      from paxlike.pax import experiment_registry
      from paxlike.pax.tasks.lm import model_params
      from paxlike.pax.tasks.lm.params import lm_cloud


      @experiment_registry.register
      class Pipe(model_params.TransformerLmSpmdPipelineAdafactor, lm_cloud.SyntheticDataset):
        NUM_STAGES = 2
        MICROBATCH_SIZE = 2
        NUM_LAYERS = 4
        MODEL_DIMS = 64
        DIMS_PER_HEAD = 16
        VOCAB_SIZE = 256
        MAX_SEQ_LEN = 32
        PERCORE_BATCH_SIZE = 2
        ICI_MESH_SHAPE = [2, 1, 1, 1]
      """))
  job = tmp_path / "job"
  proc = run_cli(["--exp=pax_pipe.Pipe", f"--job_log_dir={job}", "--mode=dry_run"],
                 cwd=tmp_path, pythonpath=[tmp_path, REPO_ROOT])
  assert proc.returncode == 0, describe(proc)
  assert "Traceback" not in proc.stderr

