"""praxis.schedules: Pax's schedule configs, refused with what to write instead.

paxlike's learner names its schedule (LR_SCHEDULE) and reads the LR_COS_* /
LR_LRED_* attributes; `model_params.set_default_adam` sets Pax's default one.
"""

from __future__ import annotations

from typing import Any

from paxlike.errors import UserError


class _Refused:
  def __init_subclass__(cls) -> None:
    cls.HParams = classmethod(_refuse)


def _refuse(cls: type, **_: Any) -> None:
  raise UserError(f"schedules.{cls.__name__}.HParams: paxlike's learner takes its schedule "
                  "from LR_SCHEDULE ('linear_rampup_exponential_decay' or "
                  "'linear_rampup_cosine_decay') and the LR_LRED_* / LR_COS_* attributes.")


class LinearRampupExponentialDecay(_Refused):
  pass


class LinearRampupCosineDecay(_Refused):
  pass


class Constant(_Refused):
  pass


__all__ = ["Constant", "LinearRampupCosineDecay", "LinearRampupExponentialDecay"]
