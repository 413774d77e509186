"""praxis.base_layer: WeightInit, the initializer a Pax file sets as `params_init`.

`model_p.params_init = WeightInit.Gaussian(0.006)` (Pax's GPT-3) or
`lm_tpl.softmax_tpl.params_init = ...` start the LM's weights (kernels and
tables) from that distribution; biases and norm scales keep their own, as in
praxis. paxlike.models.language_model.draw_weight draws them.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class WeightInitSpec:
  """One initializer: `method` ('gaussian', 'uniform', 'xavier', 'constant') and `scale`."""

  method: str
  scale: float

  def as_tuple(self) -> tuple[str, float]:
    return (self.method, float(self.scale))

  def __repr__(self) -> str:
    return f"WeightInit.{self.method.capitalize()}({self.scale})"


class WeightInit:
  """praxis's initializer constructors."""

  @staticmethod
  def Gaussian(scale: float = 1.0) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("gaussian", scale)

  @staticmethod
  def Uniform(scale: float = 1.0) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("uniform", scale)

  @staticmethod
  def Xavier(scale: float = 1.000001) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("xavier", scale)

  @staticmethod
  def Constant(scale: float = 0.0) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("constant", scale)


__all__ = ["WeightInit", "WeightInitSpec"]
