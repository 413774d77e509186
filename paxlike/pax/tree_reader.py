"""The reading of praxis's config tree: a reader that refuses what paxlike does not model.

paxlike.pax.config_tree reads a task's `task_p.model.lm_tpl` tree back onto
the LM's fields with these: the _Reader collects one value per model field
(two paths that disagree are refused), refuses a node of a class or a field
it does not model in one line naming the path, and keeps the notes for the
sharding hints it does not apply.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import fiddle as fdl
import numpy as np

from paxlike.errors import UserError
from paxlike.pax.base_layer import BaseLayer, WeightInitSpec


class Reader:
  """Reads a tree node's fields by path; refuses what it cannot honour; collects notes."""

  def __init__(self) -> None:
    self.notes: list[str] = []
    self.values: dict[str, tuple[str, Any]] = {}  # model field -> (path, value)

  def node(self, cfg: Any, path: str, *classes: type) -> fdl.Buildable:
    if not isinstance(cfg, fdl.Buildable):
      raise UserError(f"{path} = {cfg!r}: paxlike reads a pax_fiddle.Config of "
                      f"{' / '.join(c.__name__ for c in classes)} there.")
    target = fdl.get_callable(cfg)
    if not (isinstance(target, type) and issubclass(target, classes)):
      raise UserError(f"{path} = pax_fiddle.Config({name_of(target)}): paxlike's LM has no "
                      f"such layer; it models {', '.join(c.__name__ for c in classes)} there.")
    return cfg

  def fields(self, cfg: fdl.Buildable, path: str, read: tuple[str, ...]) -> None:
    """Refuses a field set on cfg that is not read and differs from praxis's default."""
    target = fdl.get_callable(cfg)
    defaults = {f.name: f.default for f in dataclasses.fields(target)}
    # A runnable praxis layer's template fields (FeedForward's) are set to their default
    # configs by pax_fiddle.Config: one left equal to its default reads as unset.
    templates = target.sub_templates() if issubclass(target, BaseLayer) else {}
    for name, value in cfg.__arguments__.items():
      if name in read or name == "name":
        continue
      if name in ("weight_split_dims_mapping", "activation_split_dims_mapping"):
        if isinstance(value, fdl.Buildable) and value.__arguments__:
          self.notes.append(f"{path}.{name} ({show(value)}) is not applied: paxlike shards "
                            "by its mesh rules (ICI_MESH_SHAPE and the logical axis rules).")
        continue
      if same(value, defaults.get(name)) or (name in templates and value == templates[name]):
        continue
      raise UserError(f"{path}.{name} = {show(value)}: paxlike's LM does not model this "
                      f"field of {target.__name__}; leave it at {show(defaults.get(name))}.")

  def set(self, field: str, path: str, value: Any) -> None:
    """One model field from one path; two paths that give it different values conflict."""
    if field in self.values and not same(self.values[field][1], value):
      first, old = self.values[field]
      raise UserError(f"{path} = {show(value)} differs from {first} = {show(old)}; "
                      f"paxlike's LM has one {field} for both.")
    self.values.setdefault(field, (path, value))


def name_of(target: Any) -> str:
  """A config target's name, for messages."""
  return getattr(target, "__name__", repr(target))


def show(value: Any) -> str:
  """A tree value as a message shows it (a config as its class)."""
  if isinstance(value, fdl.Buildable):
    return f"pax_fiddle.Config({name_of(fdl.get_callable(value))}, ...)"
  if isinstance(value, type):
    return value.__name__
  return repr(value)


def same(a: Any, b: Any) -> bool:
  """Whether two tree values are the same setting (a config only as itself)."""
  if isinstance(a, fdl.Buildable) or isinstance(b, fdl.Buildable):
    return a is b
  if isinstance(a, list | tuple) and isinstance(b, list | tuple):
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
  try:
    return bool(a == b)
  except Exception:  # noqa: BLE001  (values without a plain ==: not the same)
    return False


def count(value: Any, path: str, none_ok: bool = False) -> int | None:
  """A positive int read from the tree (or None where allowed); one line otherwise."""
  if value is None and none_ok:
    return None
  if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
    raise UserError(f"{path} = {show(value)}: set a positive int.")
  return int(value)


def weight_init(value: Any, path: str) -> tuple[str, float] | None:
  """A base_layer.WeightInit as the LM's (method, scale), or None."""
  if value is None:
    return None
  if not isinstance(value, WeightInitSpec):
    raise UserError(f"{path} = {value!r}: set a base_layer.WeightInit (Gaussian, Uniform, "
                    "Xavier or Constant).")
  return value.as_tuple()
