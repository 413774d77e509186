"""Fiddle helpers: build configs and dump them as flat text. Imports no JAX."""

from __future__ import annotations

import copy
from typing import Any

import fiddle as fdl
from fiddle import printing

from paxlike.errors import UserError


class Unbuilt:
  """A template field's config carried through fdl.build unbuilt (praxis's DoNotBuild);
  the layer that holds it unwraps it (paxlike.pax.base_layer.BaseLayer)."""

  def __init__(self, config: Any) -> None:
    self.config = config


def keep_templates(cfg: Any) -> Any:
  """A copy of cfg in which every argument that a target's `template_fields()` names (a
  Pax layer's template fields) is wrapped in Unbuilt, so fdl.build leaves it a config."""
  if not _has_templates(cfg):
    return cfg
  cfg = copy.deepcopy(cfg)

  def visit(value: Any) -> None:
    if isinstance(value, fdl.Buildable):
      names = _template_names(value)
      for name, arg in list(value.__arguments__.items()):
        if name in names and _is_configs(arg):
          setattr(value, name, Unbuilt(arg) if isinstance(arg, fdl.Buildable)
                  else type(arg)(Unbuilt(a) if isinstance(a, fdl.Buildable) else a for a in arg))
        else:
          visit(arg)
    elif isinstance(value, list | tuple):
      for v in value:
        visit(v)
    elif isinstance(value, dict):
      for v in value.values():
        visit(v)

  visit(cfg)
  return cfg


def _template_names(cfg: fdl.Buildable) -> set[str]:
  fields = getattr(fdl.get_callable(cfg), "template_fields", None)
  return set(fields()) if callable(fields) else set()


def _is_configs(value: Any) -> bool:
  return isinstance(value, fdl.Buildable) or (
      isinstance(value, list | tuple) and any(isinstance(v, fdl.Buildable) for v in value))


def _has_templates(value: Any) -> bool:
  if isinstance(value, fdl.Buildable):
    return bool(_template_names(value)) or any(_has_templates(v)
                                               for v in value.__arguments__.values())
  if isinstance(value, list | tuple):
    return any(_has_templates(v) for v in value)
  if isinstance(value, dict):
    return any(_has_templates(v) for v in value.values())
  return False


def build(cfg: Any) -> Any:
  """fdl.build with a UserError for configs whose arguments do not fit; a Pax layer's
  template fields stay configs (keep_templates)."""
  try:
    return fdl.build(keep_templates(cfg))
  except UserError as e:
    # fiddle appends a multi-line "Fiddle context" to the message: keep the sentence.
    raise UserError(str(e).split("\n")[0]) from None
  except TypeError as e:
    raise UserError(f"the experiment's config does not build: {str(e).splitlines()[0]}.") \
        from None


def flattened(cfg: Any, prefix: str) -> str:
  """One `path = value` line per leaf of a fiddle config.

  flax modules' unset `parent` field is left out: its default prints with a
  memory address, which would make the dump differ between identical runs.
  """
  if not isinstance(cfg, fdl.Buildable):
    return f"{prefix} = {cfg!r}\n"
  lines = printing.as_str_flattened(cfg).splitlines()
  return "".join(f"{prefix}.{line}\n" for line in lines
                 if not (line.split(":", 1)[0].endswith("parent") and "<[unset" in line))


def dump_model_params(task_cfg: Any, dataset_cfgs: list[Any]) -> str:
  """model_params.txt: the task config and every input config, flattened."""
  out = [flattened(task_cfg, "task")]
  for i, ds in enumerate(dataset_cfgs):
    out.append(flattened(ds, f"datasets[{i}]"))
  return "".join(out)
