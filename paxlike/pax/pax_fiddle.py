"""praxis.pax_fiddle: fiddle's Config under Pax's names, with praxis's two additions.

`pax_fiddle.Config(cls, ...)` is a fiddle Config that also has praxis's
`.cls` (the configured class) and `copy_fields_from(other)` (the fields
`other` set that this class has too), which Pax's experiment files use to
swap one layer template for another.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import fiddle as fdl
from fiddle import Partial, get_callable

from paxlike.errors import UserError


class Config(fdl.Config):
  """fdl.Config with praxis's `.cls`, `copy_fields_from`, `set` / `Set` and `clone`.

  A target with praxis's sub-templates (`sub_templates()`: field -> class or
  config, as praxis's template fields) gets a fresh Config of each one it was
  not given, so `pax_fiddle.Config(GroupedQueryAttention).weight_split_dims_mapping
  .dnh = ...` and `pax_fiddle.Config(CNNModel).network_tpl.num_classes = ...`
  work as in Pax.
  """

  def __init__(self, fn_or_cls: Any, /, *args: Any, **kwargs: Any) -> None:
    super().__init__(fn_or_cls, *args, **kwargs)
    for name, tpl in getattr(fn_or_cls, "sub_templates", dict)().items():
      if name not in self.__arguments__:
        setattr(self, name, copy.deepcopy(tpl) if isinstance(tpl, fdl.Buildable) else Config(tpl))

  @property
  def cls(self) -> Any:
    return fdl.get_callable(self)

  def set(self, **fields: Any) -> Config:
    """Sets each field; returns the config (praxis's `p.set(...)`, lingvo's `p.Set(...)`)."""
    for name, value in fields.items():
      setattr(self, name, value)
    return self

  Set = set

  def clone(self) -> Config:
    return copy.deepcopy(self)

  def copy_fields_from(self, source: fdl.Buildable,
                       missing_fields_in_self: tuple[str, ...] | list[str] = ()) -> None:
    """Sets each field `source` set on this config too (deep copies of the values).

    A field `source` set that this class does not have is an error, unless it
    is named in missing_fields_in_self (praxis's rule).
    """
    accepted = _parameters(fdl.get_callable(self))
    for name, value in source.__arguments__.items():
      if name in accepted or "**" in accepted:
        setattr(self, name, copy.deepcopy(value))
      elif name not in missing_fields_in_self:
        raise UserError(f"copy_fields_from: {_name(source)} sets {name!r}, which "
                        f"{_name(self)} does not have; name it in missing_fields_in_self.")


def _parameters(target: Any) -> set[str]:
  names = set()
  for name, param in inspect.signature(target).parameters.items():
    names.add("**" if param.kind is inspect.Parameter.VAR_KEYWORD else name)
  return names


def _name(cfg: fdl.Buildable) -> str:
  return getattr(fdl.get_callable(cfg), "__name__", str(fdl.get_callable(cfg)))


def build(cfg: Any) -> Any:
  """fdl.build, leaving a Pax layer's template fields configs (praxis's pax_fiddle.build)."""
  from paxlike.config import keep_templates

  return fdl.build(keep_templates(cfg))


instantiate = build


def fdl_field(default_factory: Any = None, *, tags: Any = (), **kwargs: Any) -> Any:
  """praxis's fdl_field: a dataclass field whose default is default_factory() (a config); a
  layer field annotated as a config stays one until the layer builds it."""
  del tags
  import dataclasses

  return dataclasses.field(default_factory=default_factory, **kwargs)


def auto_config(fn: Any) -> Any:
  """praxis's auto_config decorator: a function that returns configs (as Pax's written with
  pax_fiddle.Config do) is used as it is."""
  return fn

__all__ = ["Config", "Partial", "auto_config", "build", "fdl_field", "get_callable",
           "instantiate"]
