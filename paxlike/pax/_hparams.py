"""Pax's older config spelling `Cls.HParams(**fields)` for paxlike's classes."""

from __future__ import annotations

import functools
from typing import Any

import fiddle as fdl


class HParams:
  """A class attribute: `Cls.HParams(**fields)` is `fdl.Config(Cls, **fields)`."""

  def __get__(self, obj: Any, owner: type) -> Any:
    return functools.partial(fdl.Config, owner)
