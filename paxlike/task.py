"""The task an experiment describes: model + train settings (with the learner).

The fields carry Pax's names and places (`task_p.train.num_train_steps`,
`task_p.train.save_interval_steps`, `task_p.train.learner`, ...), so a Pax
experiment's `task()` edits of its task config land on fields the trainer
reads.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable
from typing import Any

from paxlike.errors import UserError
from paxlike.learners import Learner

_BATCH_AXES = ("stage", "replica", "data", "data_expert")


def _check_split_mapping(mapping: Any) -> None:
  """Pax's task.train.inputs_split_mapping, NestedMap(map_1d=(axes,), map_2d=(axes, None)):
  accepted where `axes` are Pax's batch axes in their order, replica and data with stage or
  data_expert or both (Grok_Proxy_PP's (stage, replica, data, data_expert)), whose split
  paxlike's batch sharding and its model's first constraint give; refused otherwise."""
  if mapping is None:
    return
  try:
    one = tuple(mapping["map_1d"])
    axes = one[0] if isinstance(one[0], tuple | list) else (one[0],)
    # map_Nd for N-dim features (imagenet_resnets.py gives map_1d ... map_5d): the rows
    # split over the batch axes, every other dim whole.
    ok = (len(one) == 1 and all(
        re.fullmatch(r"map_[1-9]d", key) and tuple(value) == (one[0],) + (None,) * (
            int(key[4]) - 1) for key, value in mapping.items())
          and list(axes) == [a for a in _BATCH_AXES if a in axes]
          and {"replica", "data"} <= set(axes))
  except (KeyError, TypeError, IndexError):
    ok = False
  if not ok:
    raise UserError(f"task.train.inputs_split_mapping = {mapping!r}: paxlike splits each batch "
                    "over the mesh's batch axes (replica, data, data_expert; stage across "
                    "processes) by its own rules; drop the mapping or name those axes.")


@dataclasses.dataclass
class TrainSettings:
  """Cadence of the training loop and its learner (Pax's `task_p.train`).

  Attributes:
    learner: the optimizer, schedule and clipping (Pax's `task_p.train.learner`).
    num_train_steps: the step the run stops at.
    save_interval_steps: a checkpoint every this many steps.
    save_max_to_keep: how many checkpoints the job directory keeps.
    summary_interval_steps: a training summary every this many steps.
    eval_interval_steps: an eval run every this many steps; 0: none during training.
    seed: the seed of the initial parameters and the step keys.
  """

  learner: Learner = dataclasses.field(default_factory=Learner)
  num_train_steps: int = 1000
  save_interval_steps: int = 1000
  save_max_to_keep: int = 10
  summary_interval_steps: int = 100
  eval_interval_steps: int = 0
  seed: int = 1234
  random_seed: int | None = None  # Pax's name for seed; set, it is the seed
  num_microbatches: int = 1  # gradient accumulation: the batch in k slices, one update
  target_log_pplx: float | None = None  # stop once an eval's log_pplx is at or below it
  # Pax's fields for what paxlike always does; the other value is refused, not ignored.
  # Pax's: False (its default) also evaluates the next training batch at every eval
  # interval, into summaries/eval_train; True skips that.
  eval_skip_train: bool = False
  # An experiment with no training input (eval or decode only) initialises the model from
  # the shapes its get_input_specs_provider_params() gives; False (Pax's eval-only
  # configs): from its first eval or decode input's. With a training input it changes
  # nothing: the parameters' shapes do not depend on the batch.
  always_use_train_for_model_init: bool = True
  # Pax's split of the input over the batch axes: paxlike splits the batch over them by its
  # own rules (_check_split_mapping).
  inputs_split_mapping: Any = None
  # paxlike measures steps/s (and MFU) over each summary interval; None or that interval.
  compute_steps_per_sec_interval_steps: int | None = None
  # Pax's: each summary is the summary step's own values (None or 1: nothing accumulated).
  summary_accumulate_interval_steps: int | None = None
  # Pax's: every summary also writes vars/<parameter>, the root mean square of each
  # parameter after the step (paxlike.steps). Pax's default is True; paxlike's False, so a
  # run's summaries hold only what it asks for.
  variable_norm_summary: bool = False
  # Pax's decode cadence during training: with decode inputs, a decode every this many
  # steps (paxlike decodes at the end, and at every eval with --decode_during_train).
  decode_interval_steps: int | None = None

  def __post_init__(self) -> None:
    _check_split_mapping(self.inputs_split_mapping)
    if self.random_seed is not None:
      if self.seed not in (1234, self.random_seed):
        raise UserError(f"task.train.random_seed = {self.random_seed!r} differs from "
                        f"task.train.seed = {self.seed!r} (TRAINING_SEED); both name the run's "
                        "seed, so set one of them.")
      self.seed = self.random_seed
    if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
      raise UserError(f"task.train.seed (TRAINING_SEED) must be a whole number 0 or more, got "
                      f"{self.seed!r}.")
    # Pax writes num_train_steps as a float (its default is 1e7); a step count is whole.
    for name in ("num_train_steps", "save_interval_steps", "summary_interval_steps",
                 "eval_interval_steps", "save_max_to_keep"):
      value = getattr(self, name)
      if isinstance(value, float) and value.is_integer():
        setattr(self, name, int(value))
      elif not isinstance(value, int) or isinstance(value, bool):
        raise UserError(f"task.train.{name} must be a whole number, got {value!r}.")
    if self.eval_interval_steps < 0:
      raise UserError(f"task.train.eval_interval_steps must be 0 (no evals while training) or "
                      f"more, got {self.eval_interval_steps}.")
    if self.num_train_steps < 0:  # 0: an evaluation-only task (Pax's LLaMA MAX_STEPS = 0)
      raise UserError(f"task.train.num_train_steps must be 0 or more, got "
                      f"{self.num_train_steps}.")
    for name in ("save_interval_steps", "summary_interval_steps", "save_max_to_keep"):
      if getattr(self, name) <= 0:
        raise UserError(f"task.train.{name} must be positive, got {getattr(self, name)}.")
    if self.summary_accumulate_interval_steps not in (None, 1):
      raise UserError(f"task.train.summary_accumulate_interval_steps = "
                      f"{self.summary_accumulate_interval_steps!r}: paxlike writes each summary "
                      "step's own values; set it to 1 or drop it.")
    if self.decode_interval_steps is not None and (
        not isinstance(self.decode_interval_steps, int) or self.decode_interval_steps < 0):
      raise UserError(f"task.train.decode_interval_steps must be a whole number of steps, got "
                      f"{self.decode_interval_steps!r}.")
    every = self.compute_steps_per_sec_interval_steps
    if every is not None and every != self.summary_interval_steps:
      raise UserError(f"task.train.compute_steps_per_sec_interval_steps = {every!r}: paxlike "
                      "measures steps/s over each summary interval, summary_interval_steps = "
                      f"{self.summary_interval_steps}; set it to that or drop it.")

  # paxlike's earlier names, read by the trainer.
  @property
  def checkpoint_every_n_steps(self) -> int:
    return self.save_interval_steps

  @property
  def max_checkpoints_to_keep(self) -> int:
    return self.save_max_to_keep


class RunningMode(enum.Flag):
  """What a job is doing when early_stopping_fn is called (Pax's trainer_lib.RunningMode)."""

  UNKNOWN = 0
  TRAIN = enum.auto()
  EVAL = enum.auto()
  DECODE = enum.auto()

  @classmethod
  def detect(cls, has_train_metrics: bool, has_eval_metrics: bool,
             has_decode_metrics: bool) -> RunningMode:
    """The mode of a step that produced these kinds of metrics."""
    mode = cls.UNKNOWN
    for flag, has in ((cls.TRAIN, has_train_metrics), (cls.EVAL, has_eval_metrics),
                      (cls.DECODE, has_decode_metrics)):
      if has:
        mode |= flag
    return mode


@dataclasses.dataclass
class Task:
  """What fdl.build(experiment.task()) returns (Pax's SingleTask).

  Attributes:
    model: a flax.linen module with fprop(batch) -> (loss, metrics).
    train: the training loop's settings and its learner.
    early_stopping_fn: Pax's hook, called after each eval during training as
      `fn(metrics, running_mode, global_step, is_last_ckpt, checkpoint_path)`
      with metrics keyed `eval_test_<input name>/metrics/<metric>`; training
      stops (after a checkpoint) when it returns True.
    summary_verbosity: Pax's level for the summaries its layers add; paxlike's
      layers add none, a Pax user's own layers' add_summary(..., verbosity=v)
      is written where v <= this level, and the trainer's scalars (loss,
      learning_rate, ...) are written at any level, as Pax writes its trainer's.
  """

  model: Any
  train: TrainSettings = dataclasses.field(default_factory=TrainSettings)
  early_stopping_fn: Callable[..., bool] | None = None
  summary_verbosity: int = 3
  name: str = ""  # Pax's task name; the job's directory names the run

  def __post_init__(self) -> None:
    for_task = getattr(self.model, "for_task", None)
    if callable(for_task):
      self.model = for_task(self.train.learner.loss_name, self.summary_verbosity)

  @property
  def learner(self) -> Learner:
    """The learner lives under `train`, as in Pax; this is a shortcut to it."""
    return self.train.learner
