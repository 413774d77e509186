"""The task an experiment describes: model + train settings (with the learner).

The fields carry Pax's names and places (`task_p.train.num_train_steps`,
`task_p.train.save_interval_steps`, `task_p.train.learner`, ...), so a Pax
experiment's `task()` edits of its task config land on fields the trainer
reads.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from paxlike.errors import UserError
from paxlike.learners import Learner


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
  num_microbatches: int = 1  # gradient accumulation: the batch in k slices, one update
  target_log_pplx: float | None = None  # stop once an eval's log_pplx is at or below it

  def __post_init__(self) -> None:
    # Pax writes num_train_steps as a float (its default is 1e7); a step count is whole.
    for name in ("num_train_steps", "save_interval_steps", "summary_interval_steps",
                 "eval_interval_steps", "save_max_to_keep"):
      value = getattr(self, name)
      if isinstance(value, float) and value.is_integer():
        setattr(self, name, int(value))
      elif not isinstance(value, int) or isinstance(value, bool):
        raise UserError(f"task.train.{name} must be a whole number, got {value!r}.")
    for name in ("num_train_steps", "save_interval_steps", "summary_interval_steps",
                 "save_max_to_keep"):
      if getattr(self, name) <= 0:
        raise UserError(f"task.train.{name} must be positive, got {getattr(self, name)}.")

  # paxlike's earlier names, read by the trainer.
  @property
  def checkpoint_every_n_steps(self) -> int:
    return self.save_interval_steps

  @property
  def max_checkpoints_to_keep(self) -> int:
    return self.save_max_to_keep


@dataclasses.dataclass
class Task:
  """What fdl.build(experiment.task()) returns (Pax's SingleTask)."""

  model: Any  # a flax.linen module with fprop(batch) -> (loss, metrics)
  train: TrainSettings = dataclasses.field(default_factory=TrainSettings)

  @property
  def learner(self) -> Learner:
    """The learner lives under `train`, as in Pax; this is a shortcut to it."""
    return self.train.learner
