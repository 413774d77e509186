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

  The rate at a step is `learning_rate` x the schedule's multiplier, as in
  praxis. Both ramp-up schedules rise linearly from 0 at step 0 to `max` at
  `warmup_steps` (warmup_steps 0: the first step has the full rate), stay
  there until `decay_start`, then decay to `max x min_ratio` at `decay_end`
  (cosine: half a cosine wave; exponential: a geometric curve) and stay
  constant after it.

  Adam follows praxis's: `epsilon_root` inside the square root, `epsilon`
  outside it, and with `clip_threshold` > 0 each parameter's update is
  scaled down to an RMS of at most clip_threshold (before the learning rate);
  `clip_gradient_norm_to_value` > 0 clips the gradients' global norm first.
  """

  optimizer: str = "adam"
  learning_rate: float = 1e-3
  schedule: str = "constant"
  warmup_steps: int = 0
  decay_start: int = 0
  decay_end: int = 0
  min_ratio: float = 0.1
  max: float = 1.0
  beta1: float = 0.9
  beta2: float = 0.99
  epsilon: float = 1e-6
  epsilon_root: float = 0.0
  clip_threshold: float = 0.0
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
    if self.schedule != "constant":
      prefix = "LR_COS" if self.schedule == "linear_rampup_cosine_decay" else "LR_LRED"
      if not 0 <= self.warmup_steps <= self.decay_start < self.decay_end:
        raise UserError(
            f"LR_SCHEDULE={self.schedule!r} needs 0 <= {prefix}_WARMUP <= {prefix}_DECAY_START "
            f"< {prefix}_DECAY_END, got {self.warmup_steps}, {self.decay_start}, "
            f"{self.decay_end}.")

  def lr_schedule(self) -> optax.Schedule:
    """The learning rate at each step (optax counts the first update as step 0)."""
    lr = self.learning_rate
    if self.schedule == "constant":
      return optax.constant_schedule(lr)
    peak = lr * self.max
    parts, boundaries = [], []
    if self.warmup_steps > 0:
      parts.append(optax.linear_schedule(0.0, peak, self.warmup_steps))
      boundaries.append(self.warmup_steps)
    parts.append(optax.constant_schedule(peak))
    boundaries.append(self.decay_start)
    span = self.decay_end - self.decay_start
    if self.schedule == "linear_rampup_cosine_decay":
      parts.append(optax.cosine_decay_schedule(peak, span, alpha=self.min_ratio))
    else:
      parts.append(optax.exponential_decay(peak, span, self.min_ratio,
                                           end_value=peak * self.min_ratio))
    return optax.join_schedules(parts, boundaries)

  def transform(self) -> optax.GradientTransformation:
    """The optax chain: clip by global norm, then the optimizer."""
    schedule = self.lr_schedule()
    if self.optimizer == "adam":
      parts = [optax.scale_by_adam(b1=self.beta1, b2=self.beta2, eps=self.epsilon,
                                   eps_root=self.epsilon_root)]
      if self.clip_threshold > 0:
        parts.append(optax.clip_by_block_rms(self.clip_threshold))
      if self.weight_decay:
        parts.append(optax.add_decayed_weights(self.weight_decay))
      parts.append(optax.scale_by_learning_rate(schedule))
      opt = optax.chain(*parts)
    elif self.optimizer == "adafactor":
      opt = optax.adafactor(schedule, weight_decay_rate=self.weight_decay or None)
    else:
      opt = optax.sgd(schedule, momentum=self.beta1 or None)
    if self.clip_gradient_norm_to_value > 0:
      return optax.chain(optax.clip_by_global_norm(self.clip_gradient_norm_to_value), opt)
    return opt
