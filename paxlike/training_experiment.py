"""The training half every shipped experiment template shares.

Optimizer (optax through paxlike.learners), learning-rate schedule, train
cadence and mesh, as UPPERCASE hyperparameters; `task()` puts them together
with the template's `model()`. The model families' templates
(paxlike.lm_experiments, paxlike.t5_experiments) subclass it and add their
dims and model().
"""

from __future__ import annotations

from typing import Any

import fiddle as fdl
import jax

from paxlike.errors import UserError
from paxlike.experiment import BaseExperiment
from paxlike.learners import Learner
from paxlike.task import Task, TrainSettings


class AdamTraining(BaseExperiment):
  """Optimizer, schedule, cadence and mesh; subclasses define model() and PERCORE_BATCH_SIZE."""

  OPTIMIZER = "adam"
  LEARNING_RATE = 2.5e-4
  LR_SCHEDULE = "constant"
  LR_COS_WARMUP = 0
  LR_COS_DECAY_START = 0
  LR_COS_DECAY_END = 0
  LR_COS_MIN_RATIO = 0.1
  ADAM_BETA1 = 0.9
  ADAM_BETA2 = 0.99
  ADAM_EPSILON = 1e-6
  WEIGHT_DECAY = 1e-3
  CLIP_GRADIENT_NORM_TO_VALUE = 1.0

  NUM_TRAIN_STEPS = 1000
  CHECKPOINT_EVERY_N_STEPS = 1000
  MAX_CKPT_TO_KEEP = 10
  SUMMARY_INTERVAL_STEPS = 100
  EVAL_INTERVAL_STEPS = 0
  TRAIN_SEED = 1234

  ICI_MESH_SHAPE = [1, 1, 1]
  DCN_MESH_SHAPE = None

  def model(self) -> fdl.Config[Any]:
    raise NotImplementedError(f"{type(self).__name__} must define model().")

  # Both families' Transformer dims: HIDDEN_DIMS and DIMS_PER_HEAD may be None, and
  # are then derived here, so a --set MODEL_DIMS reaches them.

  def hidden_dims(self) -> int:
    """HIDDEN_DIMS, or 4 x MODEL_DIMS when it is None."""
    return self.HIDDEN_DIMS if self.HIDDEN_DIMS is not None else 4 * self.MODEL_DIMS

  def num_heads(self) -> int:
    """NUM_HEADS, or MODEL_DIMS // DIMS_PER_HEAD when it is None (Pax's rule)."""
    if self.NUM_HEADS is not None:
      return self.NUM_HEADS
    if self.DIMS_PER_HEAD is None:
      raise UserError("NUM_HEADS and DIMS_PER_HEAD are both None; set at least one of them.")
    return self.MODEL_DIMS // self.DIMS_PER_HEAD

  def dims_per_head(self) -> int:
    """DIMS_PER_HEAD, or MODEL_DIMS // NUM_HEADS when it is None."""
    return self.DIMS_PER_HEAD if self.DIMS_PER_HEAD is not None else (
        self.MODEL_DIMS // self.num_heads())

  def check_positive(self, *names: str) -> None:
    """Raises UserError naming the first of these hyperparameters that is not positive."""
    for name in names:
      if getattr(self, name) <= 0:
        raise UserError(f"{name} must be positive, got {getattr(self, name)}.")

  def check_heads(self) -> None:
    """Raises UserError when MODEL_DIMS, NUM_HEADS and DIMS_PER_HEAD do not fit together.

    One of NUM_HEADS and DIMS_PER_HEAD may be None and is derived from the
    other (Pax derives NUM_HEADS = MODEL_DIMS / DIMS_PER_HEAD); the one given
    must divide MODEL_DIMS. When both are set they may differ from MODEL_DIMS
    (T5 and Llama-style heads).
    """
    if self.NUM_HEADS is None and self.DIMS_PER_HEAD is None:
      raise UserError("NUM_HEADS and DIMS_PER_HEAD are both None; set at least one of them.")
    if self.NUM_HEADS is None:
      if self.DIMS_PER_HEAD <= 0 or self.MODEL_DIMS % self.DIMS_PER_HEAD:
        raise UserError(f"NUM_HEADS=None derives the heads as MODEL_DIMS / DIMS_PER_HEAD, but "
                        f"MODEL_DIMS={self.MODEL_DIMS} is not a multiple of DIMS_PER_HEAD="
                        f"{self.DIMS_PER_HEAD}; set NUM_HEADS or change one of them.")
    elif self.DIMS_PER_HEAD is None and (self.NUM_HEADS <= 0 or self.MODEL_DIMS % self.NUM_HEADS):
      raise UserError(f"MODEL_DIMS={self.MODEL_DIMS} does not divide into NUM_HEADS="
                      f"{self.NUM_HEADS} heads; set DIMS_PER_HEAD or change one of them.")

  def learner(self) -> fdl.Config[Learner]:
    return fdl.Config(
        Learner, optimizer=self.OPTIMIZER, learning_rate=self.LEARNING_RATE,
        schedule=self.LR_SCHEDULE, warmup_steps=self.LR_COS_WARMUP,
        decay_start=self.LR_COS_DECAY_START, decay_end=self.LR_COS_DECAY_END,
        min_ratio=self.LR_COS_MIN_RATIO, beta1=self.ADAM_BETA1, beta2=self.ADAM_BETA2,
        epsilon=self.ADAM_EPSILON, weight_decay=self.WEIGHT_DECAY,
        clip_gradient_norm_to_value=self.CLIP_GRADIENT_NORM_TO_VALUE)

  def task(self) -> fdl.Config[Task]:
    return fdl.Config(
        Task, model=self.model(),
        train=fdl.Config(
            TrainSettings, learner=self.learner(), num_train_steps=self.NUM_TRAIN_STEPS,
            save_interval_steps=self.CHECKPOINT_EVERY_N_STEPS,
            save_max_to_keep=self.MAX_CKPT_TO_KEEP,
            summary_interval_steps=self.SUMMARY_INTERVAL_STEPS,
            eval_interval_steps=self.EVAL_INTERVAL_STEPS, seed=self.TRAIN_SEED))

  def per_host_batch_size(self) -> int:
    """PERCORE_BATCH_SIZE x this host's device count (Pax's convention)."""
    return self.PERCORE_BATCH_SIZE * jax.local_device_count()
