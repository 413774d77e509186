"""Fiddle helpers: build configs and dump them as flat text. Imports no JAX."""

from __future__ import annotations

from typing import Any

import fiddle as fdl
from fiddle import printing

from paxlike.errors import UserError


def build(cfg: Any) -> Any:
  """fdl.build with a UserError for configs whose arguments do not fit."""
  try:
    return fdl.build(cfg)
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
