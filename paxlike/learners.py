"""Optimizer, schedule and gradient clipping from hyperparameters (optax)."""

from __future__ import annotations

import dataclasses

import optax

from paxlike.errors import UserError

SCHEDULES = ("constant", "linear_rampup_cosine_decay", "linear_rampup_exponential_decay")
OPTIMIZERS = ("adam", "adafactor", "sgd")


@dataclasses.dataclass
class Learner:
  """What turns gradients into updates.

  `learning_rate` is the peak rate; the schedule multiplies it. Pax's
  linear_rampup_cosine_decay: linear warmup over `warmup_steps`, constant until
  `decay_start`, cosine down to `min_ratio` at `decay_end`.
  """

  optimizer: str = "adam"
  learning_rate: float = 1e-3
  schedule: str = "constant"
  warmup_steps: int = 0
  decay_start: int = 0
  decay_end: int = 0
  min_ratio: float = 0.1
  beta1: float = 0.9
  beta2: float = 0.99
  epsilon: float = 1e-6
  weight_decay: float = 0.0
  clip_gradient_norm_to_value: float = 0.0
  # Pax's learner fields that its experiment files set: the model's one loss is
  # 'total_loss'; the separator only names scanned layers' variables in Pax.
  loss_name: str = "total_loss"
  repeat_prefix_sep: str = "#"

  def __post_init__(self) -> None:
    if self.loss_name not in ("total_loss", "loss"):
      raise UserError(f"learner.loss_name={self.loss_name!r}: paxlike's models train on "
                      "their one loss, 'total_loss'.")
    if self.optimizer not in OPTIMIZERS:
      raise UserError(f"OPTIMIZER={self.optimizer!r} is not one of {OPTIMIZERS}.")
    if self.schedule not in SCHEDULES:
      raise UserError(f"LR_SCHEDULE={self.schedule!r} is not one of {SCHEDULES}.")

  def lr_schedule(self) -> optax.Schedule:
    lr = self.learning_rate
    if self.schedule == "constant":
      if self.warmup_steps:
        return optax.linear_schedule(0.0, lr, self.warmup_steps)
      return optax.constant_schedule(lr)
    decay_start = max(self.decay_start, self.warmup_steps)
    decay_end = max(self.decay_end, decay_start + 1)
    parts = [optax.linear_schedule(0.0, lr, max(self.warmup_steps, 1)),
             optax.constant_schedule(lr)]
    if self.schedule == "linear_rampup_cosine_decay":
      decay = optax.cosine_decay_schedule(lr, decay_end - decay_start, alpha=self.min_ratio)
    else:
      decay = optax.exponential_decay(lr, decay_end - decay_start, self.min_ratio,
                                      end_value=lr * self.min_ratio)
    parts.append(decay)
    return optax.join_schedules(parts, [max(self.warmup_steps, 1), decay_start])

  def transform(self) -> optax.GradientTransformation:
    """The optax chain: clip by global norm, then the optimizer."""
    schedule = self.lr_schedule()
    if self.optimizer == "adam":
      opt = optax.adamw(schedule, b1=self.beta1, b2=self.beta2, eps=self.epsilon,
                        weight_decay=self.weight_decay)
    elif self.optimizer == "adafactor":
      opt = optax.adafactor(schedule, weight_decay_rate=self.weight_decay or None)
    else:
      opt = optax.sgd(schedule, momentum=self.beta1 or None)
    if self.clip_gradient_norm_to_value > 0:
      return optax.chain(optax.clip_by_global_norm(self.clip_gradient_norm_to_value), opt)
    return opt
