"""The experiment registry: `register`, `get`, `list_names`.

Keys are `module.Class`. Every dotted suffix of a key also resolves when it is
unique, and a `params` segment may be dropped, as in Pax.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from typing import Any

from paxlike.errors import UserError

_REGISTRY: dict[str, type] = {}
_TAGS: dict[str, tuple[str, ...]] = {}
SHIPPED_PACKAGE = "experiments"


def _key(cls: type) -> str:
  return f"{cls.__module__}.{cls.__qualname__}"


def register(cls: type | None = None, *, tags: tuple[str, ...] | list[str] = (),
             allow_overwrite: bool = False) -> Any:
  """Registers an experiment class; usable as `@register` or `@register(...)`.

  Args:
    cls: the experiment class (when used without arguments).
    tags: free-form labels shown by `--list_experiments`.
    allow_overwrite: replace an existing registration with the same key.

  Raises:
    UserError: the key is already registered and allow_overwrite is False.
  """

  def do_register(klass: type) -> type:
    key = _key(klass)
    old = _REGISTRY.get(key)
    if old is not None and old is not klass and not allow_overwrite:
      raise UserError(
          f"experiment {key} is already registered; rename the class or pass "
          "allow_overwrite=True to experiment_registry.register.")
    _REGISTRY[key] = klass
    _TAGS[key] = tuple(tags)
    return klass

  if cls is not None:
    return do_register(cls)
  return do_register


def unregister(key: str) -> None:
  """Removes a registration (for tests and interactive sessions)."""
  _REGISTRY.pop(key, None)
  _TAGS.pop(key, None)


def list_names() -> list[str]:
  """Full keys of everything registered so far, sorted."""
  return sorted(_REGISTRY)


def tags(key: str) -> tuple[str, ...]:
  return _TAGS.get(key, ())


def _aliases(key: str) -> set[str]:
  """Every dotted suffix of key, with and without `params` segments."""
  variants = {key}
  parts = key.split(".")
  if "params" in parts[:-1]:
    variants.add(".".join(p for p in parts[:-1] if p != "params") + "." + parts[-1])
  out = set()
  for v in variants:
    vp = v.split(".")
    out.update(".".join(vp[i:]) for i in range(len(vp)))
  return out


def _matches(name: str) -> list[str]:
  return sorted(k for k in _REGISTRY if name in _aliases(k))


def import_shipped() -> None:
  """Imports every module under the shipped `experiments` package."""
  try:
    pkg = importlib.import_module(SHIPPED_PACKAGE)
  except ModuleNotFoundError:
    return
  for info in pkgutil.walk_packages(pkg.__path__, prefix=SHIPPED_PACKAGE + "."):
    importlib.import_module(info.name)


def _try_import(module_name: str) -> bool:
  """Imports module_name; False when that module itself does not exist."""
  try:
    importlib.import_module(module_name)
    return True
  except ModuleNotFoundError as e:
    # A missing dependency inside an existing module is the module's bug,
    # not a wrong name: let it surface.
    missing = e.name or ""
    if module_name == missing or module_name.startswith(missing + "."):
      return False
    raise


def _resolve(name: str) -> type | None:
  found = _matches(name)
  if len(found) == 1:
    return _REGISTRY[found[0]]
  if len(found) > 1:
    raise UserError(
        f"experiment name {name!r} is ambiguous; it matches {', '.join(found)}: "
        "pass a longer dotted name.")
  return None


def get(name: str) -> type:
  """Returns the experiment class for a full key or a unique dotted suffix.

  A dotted name whose module is not imported yet is imported first (so a
  user's own module on PYTHONPATH works), then the shipped experiments.

  Raises:
    UserError: the name is unknown or ambiguous; the message lists the closest
      registered names.
  """
  name = name.strip()
  if not name:
    raise UserError("--exp is empty; pass an experiment name (see --list_experiments).")
  cls = _resolve(name)
  if cls is not None:
    return cls
  module_found = None
  if "." in name:
    module_name = name.rsplit(".", 1)[0]
    for candidate in (module_name, f"{SHIPPED_PACKAGE}.{module_name}"):
      if _try_import(candidate):
        module_found = candidate
        cls = _resolve(name)
        if cls is not None:
          return cls
        break
  import_shipped()
  cls = _resolve(name)
  if cls is not None:
    return cls
  close = suggestions(name)
  hint = f" Did you mean: {', '.join(close)}?" if close else ""
  if module_found:
    raise UserError(
        f"module {module_found} has no registered experiment "
        f"{name.rsplit('.', 1)[1]!r}.{hint}")
  if "." in name:
    raise UserError(
        f"no experiment named {name!r}: module {name.rsplit('.', 1)[0]!r} cannot be imported "
        f"and no registered name matches.{hint}")
  raise UserError(f"no experiment named {name!r} among the shipped ones.{hint} A class in "
                  f"your own module needs the module's name too: --exp=your_module.{name} "
                  "(with the module importable, e.g. on PYTHONPATH).")


def suggestions(name: str, n: int = 5) -> list[str]:
  """The registered names closest to `name` (matched on suffix and class name)."""
  scored = []
  leaf = name.rsplit(".", 1)[-1].lower()
  for key in _REGISTRY:
    ratio = max(
        difflib.SequenceMatcher(None, name.lower(), key.lower()).ratio(),
        difflib.SequenceMatcher(None, leaf, key.rsplit(".", 1)[-1].lower()).ratio())
    scored.append((ratio, key))
  scored.sort(key=lambda t: (-t[0], t[1]))
  return [k for r, k in scored[:n] if r >= 0.5]


def registered_items() -> list[tuple[str, type]]:
  return sorted(_REGISTRY.items())


