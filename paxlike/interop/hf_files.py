"""What every Hugging Face family's import/export shares: file names and tree paths."""

from __future__ import annotations

import math
from typing import Any

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def same(a: Any, b: Any) -> bool:
  """Config values equal (floats to 1e-9 relative)."""
  if isinstance(a, float) or isinstance(b, float):
    return isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(
        a, b, rel_tol=1e-9)
  return a == b


def set_path(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
  """tree[path[0]][path[1]]... = value, creating the dicts on the way."""
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def get_path(tree: Any, path: tuple[str, ...]) -> Any:
  """tree[path[0]][path[1]]..."""
  for key in path:
    tree = tree[key]
  return tree
