"""praxis.base_layer: the names Pax experiment files take from it at import time."""

from __future__ import annotations

import dataclasses

from paxlike.errors import UserError


@dataclasses.dataclass(frozen=True)
class _Init:
  method: str
  scale: float

  def __post_init__(self) -> None:
    raise UserError(f"base_layer.WeightInit.{self.method}({self.scale}): paxlike's layers "
                    "choose their own initializers; drop the params_init edit from task().")


class WeightInit:
  """Pax's initializer specs; paxlike's layers do not take one, so using one is refused."""

  @staticmethod
  def Gaussian(scale: float = 1.0) -> _Init:  # noqa: N802
    return _Init("Gaussian", scale)

  @staticmethod
  def Uniform(scale: float = 1.0) -> _Init:  # noqa: N802
    return _Init("Uniform", scale)

  @staticmethod
  def Xavier(scale: float = 1.0) -> _Init:  # noqa: N802
    return _Init("Xavier", scale)

  @staticmethod
  def Constant(scale: float = 0.0) -> _Init:  # noqa: N802
    return _Init("Constant", scale)


__all__ = ["WeightInit"]
