"""praxis.schedules: the learning-rate multipliers of Pax's optimizer configs.

    lp.optimizer.learning_rate = 6e-4
    lp.optimizer.lr_schedule = pax_fiddle.Config(
        schedules.LinearRampupCosineDecay, warmup_steps=265, decay_start=266,
        decay_end=108600, min_ratio=0.1, max=1.0)

The rate at a step is `learning_rate x schedule.value_at(step)`, as in
praxis, counting the first update as step 0. The fields and defaults are
praxis's (`max` defaults to 0 there too, and must be set).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from paxlike.errors import UserError
from paxlike.learners import rampup_schedule
from paxlike.pax.base_hyperparams import FiddleBaseParameterizable


class BaseSchedule(FiddleBaseParameterizable):
  """A multiplier of the learning rate per step."""

  def multiplier(self) -> optax.Schedule:
    """The multiplier as an optax schedule of the step."""
    raise NotImplementedError(f"{type(self).__name__} must define multiplier().")

  def value_at(self, step: Any) -> jax.Array:
    """The multiplier at `step` (praxis's method), float32."""
    return jnp.asarray(self.multiplier()(step), jnp.float32)


class Constant(BaseSchedule):
  """The same multiplier at every step."""

  value: float = 1.0

  def multiplier(self) -> optax.Schedule:
    return optax.constant_schedule(self.value)


class _LinearRampupDecay(BaseSchedule):
  """Linear from 0 at step 0 to `max` at warmup_steps (none when 0), `max` until
  decay_start, then a decay (KIND) to max x min_ratio at decay_end, constant after."""

  warmup_steps: int = 0
  decay_start: int = 0
  decay_end: int = 0
  min_ratio: float = 0.01
  max: float = 0.0

  KIND = ""

  def __post_init__(self) -> None:
    name = type(self).__name__
    if not self.max > 0:
      raise UserError(f"schedules.{name}: max={self.max!r} must be positive (praxis's default "
                      "0 is unset); set max=1.0 for the learning rate itself at the peak.")
    if not 0 <= self.warmup_steps <= self.decay_start < self.decay_end:
      raise UserError(f"schedules.{name} needs 0 <= warmup_steps <= decay_start < decay_end, "
                      f"got {self.warmup_steps}, {self.decay_start}, {self.decay_end}.")
    if self.min_ratio < 0 or (self.min_ratio == 0 and self.KIND.endswith("exponential_decay")):
      raise UserError(f"schedules.{name}: min_ratio={self.min_ratio!r} must be positive "
                      "(or 0 for the cosine decay: an exponential one never reaches 0).")

  def multiplier(self) -> optax.Schedule:
    return rampup_schedule(self.KIND, self.max, self.warmup_steps, self.decay_start,
                           self.decay_end, self.min_ratio)


class LinearRampupExponentialDecay(_LinearRampupDecay):
  """The ramp-up, then an exponential (geometric) decay from max to max x min_ratio."""

  KIND = "linear_rampup_exponential_decay"


class LinearRampupCosineDecay(_LinearRampupDecay):
  """The ramp-up, then half a cosine wave from max to max x min_ratio; every step
  counts from start_step, before which the multiplier is 1."""

  start_step: int = 0

  KIND = "linear_rampup_cosine_decay"

  def multiplier(self) -> optax.Schedule:
    rest = super().multiplier()
    if self.start_step <= 0:
      return rest
    return optax.join_schedules([optax.constant_schedule(1.0), rest], [self.start_step])


class PiecewiseConstant(BaseSchedule):
  """values[i] from boundaries[i - 1] (step 0 for i = 0) up to boundaries[i]; values has one
  more entry than boundaries, which are sorted."""

  boundaries: Any = None
  values: Any = None

  def __post_init__(self) -> None:
    name = type(self).__name__
    if self.boundaries is None or self.values is None:
      raise UserError(f"schedules.{name}: set boundaries and values.")
    if len(self.values) != len(self.boundaries) + self._extra_values():
      raise UserError(f"schedules.{name}: {len(self.values)} values for "
                      f"{len(self.boundaries)} boundaries; give "
                      f"{len(self.boundaries) + self._extra_values()}.")
    if list(self.boundaries) != sorted(self.boundaries):
      raise UserError(f"schedules.{name}: boundaries {list(self.boundaries)} must be sorted.")

  @staticmethod
  def _extra_values() -> int:
    return 1

  def multiplier(self) -> optax.Schedule:
    bounds = jnp.asarray(self.boundaries, jnp.float32)
    values = jnp.asarray(self.values, jnp.float32)
    return lambda step: values[jnp.searchsorted(bounds, jnp.asarray(step, jnp.float32),
                                                side="right")]


class LinearRampupPiecewiseConstant(PiecewiseConstant):
  """Linear from 0 at step 0 to values[0] at boundaries[0], then values[i] from
  boundaries[i] to boundaries[i + 1], and values[-1] after the last (values and boundaries
  are as many)."""

  @staticmethod
  def _extra_values() -> int:
    return 0

  def multiplier(self) -> optax.Schedule:
    start = self.boundaries[0]
    rest = PiecewiseConstant(boundaries=[b - start for b in self.boundaries[1:]],
                             values=list(self.values)).multiplier()
    ramp = optax.linear_schedule(0.0, float(self.values[0]), max(int(start), 1))
    return optax.join_schedules([ramp, rest], [int(start)])


__all__ = ["BaseSchedule", "Constant", "LinearRampupCosineDecay", "LinearRampupExponentialDecay",
           "LinearRampupPiecewiseConstant", "PiecewiseConstant"]
