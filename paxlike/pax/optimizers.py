"""praxis.optimizers: Pax's optimizer configs, refused with what to write instead.

paxlike's learner takes its optimizer as fields (optimizer='adam', beta1,
...), set by the experiment's ADAM_* / LEARNING_RATE attributes or by
`model_params.set_default_adam` / `set_default_adafactor`.
"""

from __future__ import annotations

from typing import Any

from paxlike.errors import UserError


class _Refused:
  def __init_subclass__(cls) -> None:
    cls.HParams = classmethod(_refuse)


def _refuse(cls: type, **_: Any) -> None:
  raise UserError(f"optimizers.{cls.__name__}.HParams: paxlike's learner is configured by "
                  "the experiment's LEARNING_RATE / ADAM_* / CLIP_GRADIENT_NORM_TO_VALUE "
                  "attributes or model_params.set_default_adam / set_default_adafactor.")


class Adam(_Refused):
  pass


class ShardedAdafactor(_Refused):
  pass


class Adafactor(_Refused):
  pass


class ShardedSgd(_Refused):
  pass


__all__ = ["Adam", "Adafactor", "ShardedAdafactor", "ShardedSgd"]
