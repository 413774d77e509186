"""praxis.base_hyperparams: the base of praxis's configurable classes, and instantiate.

A subclass declares its fields as class annotations, without @dataclass, as
praxis's do (c4.py's EarlyStoppingFn); `pax_fiddle.Config(Cls, ...)`,
`Cls.HParams(...)` and `Cls.config(...)` configure it, `instantiate` builds it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import fiddle as fdl

from paxlike.pax._hparams import HParams


class FiddleBaseParameterizable:
  """Makes each subclass that declares annotated fields a keyword-only dataclass."""

  HParams = HParams()

  def __init_subclass__(cls, **kwargs: Any) -> None:
    super().__init_subclass__(**kwargs)
    if "__annotations__" in cls.__dict__:
      dataclasses.dataclass(cls, kw_only=True)

  @classmethod
  def config(cls, **kwargs: Any) -> fdl.Config:
    """praxis's spelling of `pax_fiddle.Config(cls, **kwargs)`."""
    return fdl.Config(cls, **kwargs)


BaseParameterizable = FiddleBaseParameterizable


def instantiate(config: Any) -> Any:
  """Builds a config (an object that is not one comes back as it is), as praxis's does."""
  return fdl.build(config) if isinstance(config, fdl.Buildable) else config


__all__ = ["BaseParameterizable", "FiddleBaseParameterizable", "instantiate"]
