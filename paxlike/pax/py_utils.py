"""praxis.py_utils: NestedMap, a dict whose keys are also attributes (a JAX pytree)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jax


class NestedMap(dict):
  """A dict with attribute access: `m.key` is `m["key"]`, `m.key = v` sets it."""

  def __getattr__(self, name: str) -> Any:
    try:
      return self[name]
    except KeyError:
      raise AttributeError(f"NestedMap has no key {name!r}; it has {sorted(self)}.") from None

  def __setattr__(self, name: str, value: Any) -> None:
    self[name] = value

  def __delattr__(self, name: str) -> None:
    try:
      del self[name]
    except KeyError:
      raise AttributeError(f"NestedMap has no key {name!r}.") from None

  def copy(self) -> NestedMap:
    return NestedMap(self)

  def DeepCopy(self) -> NestedMap:  # noqa: N802  (praxis's name)
    return copy.deepcopy(self)

  def FlattenItems(self) -> list[tuple[str, Any]]:  # noqa: N802  (praxis's name)
    """(dotted key, value) for every leaf under nested NestedMaps / dicts."""
    out: list[tuple[str, Any]] = []

    def walk(prefix: str, value: Any) -> None:
      if isinstance(value, dict):
        for key in sorted(value):
          walk(f"{prefix}.{key}" if prefix else str(key), value[key])
      else:
        out.append((prefix, value))

    walk("", self)
    return out

  def Flatten(self) -> list[Any]:  # noqa: N802  (praxis's name)
    return [v for _, v in self.FlattenItems()]

  def Transform(self, fn: Callable[[Any], Any]) -> NestedMap:  # noqa: N802  (praxis's name)
    """A copy with fn applied to every leaf."""
    return NestedMap({k: v.Transform(fn) if isinstance(v, NestedMap) else
                      (NestedMap(v).Transform(fn) if isinstance(v, dict) else fn(v))
                      for k, v in self.items()})


jax.tree_util.register_pytree_with_keys(
    NestedMap,
    lambda m: (tuple((jax.tree_util.DictKey(k), m[k]) for k in sorted(m)), tuple(sorted(m))),
    lambda keys, values: NestedMap(zip(keys, values, strict=True)),
    flatten_func=lambda m: (tuple(m[k] for k in sorted(m)), tuple(sorted(m))))

__all__ = ["NestedMap"]
