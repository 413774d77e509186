"""The task an experiment describes: model + learner + train settings."""

from __future__ import annotations

import dataclasses
from typing import Any

from paxlike.learners import Learner


@dataclasses.dataclass
class TrainSettings:
  """Cadence of the training loop."""

  num_train_steps: int = 1000
  checkpoint_every_n_steps: int = 1000
  max_checkpoints_to_keep: int = 10
  summary_interval_steps: int = 100
  eval_interval_steps: int = 0
  seed: int = 1234
  num_microbatches: int = 1  # gradient accumulation: the batch in k slices, one update
  target_log_pplx: float | None = None  # stop once an eval's log_pplx is at or below it


@dataclasses.dataclass
class Task:
  """What fdl.build(experiment.task()) returns."""

  model: Any  # a flax.linen module with fprop(batch) -> (loss, metrics)
  learner: Learner = dataclasses.field(default_factory=Learner)
  train: TrainSettings = dataclasses.field(default_factory=TrainSettings)
