"""The experiment registry: `register`, `get`, `list_names`, `module_names`.

Keys are `module.Class`. How `get` (and so `--exp`) resolves a name:

1. A full key resolves to its class.
2. A dotted name `M.Class` looks in the module M names, and only there. M is
   the first of `M`, `experiments.M` and (for a name that starts with
   `tasks.` or `paxml.tasks.`) `paxlike.pax.M` that imports: your own module
   on PYTHONPATH first, then the shipped experiments (`lm.c4.X` ->
   `experiments.lm.c4.X`), then Pax's paths (`tasks.lm.params.c4.X`, or Pax's
   registry key `paxml.tasks.lm.params.c4.X`). The class is M's attribute
   `Class` when that is registered, so a re-export such as
   `paxlike.pax.tasks.lm.params.c4` resolves to the class it imports; a class
   M has that nobody registered is refused, naming the decorator, and so is a
   name M lacks. A package M also finds `Class` in its submodules, refused
   when two of them register one.
3. Only when no such module imports does the name fall back to a unique dotted
   suffix of a registered key among the shipped experiments and whatever is
   imported already (`LmCloudSpmdTiny`, `lm_cloud.LmCloudSpmdTiny`); a
   `params` segment may be dropped, as in Pax.

Pax's `--fdl_config=M.Class` (command_line.pax_fiddle_flags passes it as
`--exp=fdl_config:M.Class`) resolves the same way, except that M's class
need not be registered: Pax's Fiddle flag builds any class by its import
path, as Pax's GPU run scripts do for configs.py's unregistered GLaM classes.

So with your own `c4.py` on PYTHONPATH, `--exp=c4.X` is your module's X or an
error, never the shipped `experiments.lm.c4.X`; name the shipped one
`lm.c4.X` (or in full). Without a `c4` module of yours, `c4.X` is the shipped
one, as a unique suffix.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import pkgutil
import re
import sys
from types import ModuleType
from typing import Any

from paxlike.errors import UserError, user_frame

_REGISTRY: dict[str, type] = {}
_TAGS: dict[str, tuple[str, ...]] = {}
SHIPPED_PACKAGE = "experiments"
PAX_PACKAGE = "paxlike.pax"
DECORATOR = "@experiment_registry.register"
FDL_CONFIG = "fdl_config:"  # the prefix of an --exp name that came from Pax's --fdl_config

# Packages JAX imports by these top-level names (nvidia.cu13 and nvidia.cuda_nvcc for the
# CUDA tools, jax_plugins.* for the GPU/TPU plugins): a user's module of the same name
# runs in their place, inside `import jax`.
_JAX_IMPORTS = {
    "nvidia": "the nvidia CUDA packages JAX imports",
    "jax_plugins": "the jax_plugins packages JAX loads its GPU and TPU plugins from",
}


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
  _import_tree(pkg)


def _import_tree(module: ModuleType) -> None:
  """Imports every submodule of a package (nothing for a plain module)."""
  path = getattr(module, "__path__", None)
  if path is None:
    return
  for info in pkgutil.walk_packages(path, prefix=module.__name__ + "."):
    importlib.import_module(info.name)


def _try_import(module_name: str) -> bool:
  """Imports module_name; False when that module itself does not exist."""
  try:
    importlib.import_module(module_name)
    return True
  except ModuleNotFoundError as e:
    missing = e.name or ""
    if module_name == missing or module_name.startswith(missing + "."):
      return False  # the named module itself is missing: a wrong name, said by the caller
    gap = _pax_gap(module_name, e)
    if gap:
      raise UserError(gap) from None
    # A dependency the user's module imports (Pax's c4.py imports t5.data, say).
    raise UserError(f"importing {module_name} failed: it imports {missing!r}, which is not "
                    f"installed; pip install the package that provides {missing!r} or drop "
                    "that import.") from None
  except (ImportError, AttributeError) as e:
    # A Pax module or name paxlike.pax lacks gets one line; any other error in the
    # user's module is that module's bug, and its traceback is what they need.
    gap = _pax_gap(module_name, e)
    if gap:
      raise UserError(gap) from None
    raise


def _pax_gap(module_name: str, e: ImportError | AttributeError) -> str | None:
  """One line for a Pax module or name the port of module_name asks of paxlike.pax and
  paxlike.pax does not have (Pax's GPU scripts' saxml_layers), naming the line of the
  user's file; None otherwise."""
  if isinstance(e, ModuleNotFoundError):
    wanted = e.name or ""
  elif isinstance(e, AttributeError):
    owner = e.obj.__name__ if isinstance(getattr(e, "obj", None), ModuleType) else ""
    wanted = f"{owner}.{e.name}" if owner else ""
  else:  # from paxlike.pax.X import Name
    name = getattr(e, "name_from", None) or next(iter(re.findall(r"cannot import name '(\w+)'",
                                                                 str(e))), "")
    wanted = f"{e.name}.{name}" if e.name and name else ""
  if not (wanted + ".").startswith(PAX_PACKAGE + "."):
    return None
  pax_name = wanted.removeprefix(PAX_PACKAGE + ".")
  return (f"importing {module_name} failed{user_frame(e.__traceback__)}: paxlike.pax has no "
          f"{pax_name}: paxlike does not run that part of Pax (paxml or praxis) yet; "
          "docs/pax_porting.md lists what paxlike.pax provides.")


def _named_module(module_name: str) -> str | None:
  """The module a dotted name's module part names (imported), or None when none imports."""
  if not module_name or any(not p.isidentifier() for p in module_name.split(".")):
    return None
  candidates = [module_name, f"{SHIPPED_PACKAGE}.{module_name}"]
  if module_name.startswith("tasks."):  # Pax's own paths: tasks.lm.params.c4
    candidates.append(f"{PAX_PACKAGE}.{module_name}")
  if module_name.startswith("paxml.tasks."):  # ... and Pax's registry keys, paxml.tasks...
    candidates.append(f"{PAX_PACKAGE}.{module_name.removeprefix('paxml.')}")
  for candidate in candidates:
    if _try_import(candidate):
      return candidate
  return None


def _is_registered(cls: type) -> bool:
  return any(v is cls for v in _REGISTRY.values())


def _keys_in(module_name: str) -> list[str]:
  """Registered keys of classes defined in module_name or, for a package, its submodules."""
  return sorted(k for k, v in _REGISTRY.items()
                if v.__module__ == module_name or v.__module__.startswith(module_name + "."))


def _where(module: ModuleType) -> str:
  origin = getattr(module, "__file__", None)
  return f" ({origin})" if origin else ""


def _in_module(module_name: str, class_name: str, unregistered_ok: bool = False) -> type:
  """The registered experiment module_name has under class_name (rule 2 of the docstring);
  unregistered_ok: any class of that name (Pax's --fdl_config)."""
  module = sys.modules[module_name]
  attr = getattr(module, class_name, None)
  if isinstance(attr, type):
    if unregistered_ok or _is_registered(attr):
      return attr
    elsewhere = "" if attr.__module__ == module_name else f", it is {_key(attr)}"
    raise UserError(
        f"{module_name}.{class_name} ({getattr(module, '__file__', None) or module_name}"
        f"{elsewhere}) is not a registered experiment; "
        f"decorate the class with {DECORATOR} (from paxlike import experiment_registry).")
  _import_tree(module)
  found = [k for k in _keys_in(module_name)
           if _REGISTRY[k].__qualname__.rsplit(".", 1)[-1] == class_name]
  if len(found) == 1:
    return _REGISTRY[found[0]]
  if found:
    raise UserError(f"experiment name {class_name!r} in {module_name} is ambiguous; it "
                    f"matches {', '.join(found)}: pass one of them.")
  close = _closest(class_name, _keys_in(module_name)) or suggestions(class_name)
  raise UserError(f"module {module_name}{_where(module)} has no registered experiment "
                  f"{class_name!r}{_did_you_mean(close)}")


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
  """Returns the experiment class a name resolves to (the rule is the module docstring's).

  Imports the module the name names (so a user's own module on PYTHONPATH
  works), and the shipped experiments when the name falls back to a suffix.

  Raises:
    UserError: the name is unknown, ambiguous or names a class nobody
      registered; the message lists the closest registered names.
  """
  name = name.strip()
  by_path = name.startswith(FDL_CONFIG)
  name = name.removeprefix(FDL_CONFIG).strip()
  if not name:
    raise UserError("--exp is empty; pass an experiment name (see --list_experiments).")
  if name in _REGISTRY:
    return _REGISTRY[name]
  if "." in name:
    module_name, class_name = name.rsplit(".", 1)
    found = _named_module(module_name)
    if found is not None:
      return _in_module(found, class_name, unregistered_ok=by_path)
  import_shipped()
  cls = _resolve(name)
  if cls is not None:
    return cls
  if "." not in name and _named_module(name) is not None:
    names = module_names(name)[0]
    example = names[0] if names else f"{name}.YourClass"
    raise UserError(f"--exp={name} names a module; name an experiment class in it, e.g. "
                    f"--exp={example} (--list_experiments --exp={name} lists them).")
  hint = _did_you_mean(suggestions(name))
  if "." in name:
    raise UserError(
        f"no experiment named {name!r}: module {name.rsplit('.', 1)[0]!r} cannot be imported "
        f"and no registered name matches{hint}")
  raise UserError(f"no experiment named {name!r} among the shipped ones{hint} A class in "
                  f"your own module needs the module's name too: --exp=your_module.{name} "
                  "(with the module importable, e.g. on PYTHONPATH).")


def module_names(module_name: str) -> tuple[list[str], list[str]]:
  """The experiments a module (or package) makes available, for `--list_experiments`.

  Those it defines, as full keys; a module that only re-exports (Pax's
  `paxlike.pax.tasks.lm.params.c4`) lists what it imports as `module.Name (=
  key)`, a name `--exp` resolves. A name that no module imports by lists the
  shipped modules it is a dotted suffix of (`lm_cloud`).

  Returns:
    (the names, the experiment-like classes the module defines but did not register).

  Raises:
    UserError: no module of that name.
  """
  module_name = module_name.strip()
  found = _named_module(module_name)
  if found is None:
    import_shipped()
    keys = sorted(k for k, v in _REGISTRY.items()
                  if f".{v.__module__}".endswith(f".{module_name}"))
    if not keys:
      raise UserError(f"--list_experiments --exp={module_name}: no module {module_name!r} "
                      "can be imported; pass an importable module (e.g. on PYTHONPATH), or "
                      "drop --exp to list every experiment.")
    return keys, []
  module = sys.modules[found]
  _import_tree(module)
  classes = {a: v for a, v in vars(module).items() if isinstance(v, type)}
  own = {a: v for a, v in classes.items() if v.__module__ == found}
  unregistered = sorted(a for a, v in own.items() if not _is_registered(v)
                        and callable(getattr(v, "task", None))
                        and callable(getattr(v, "datasets", None)))
  names = _keys_in(found)
  if not own:
    names += [f"{found}.{a} (= {_key(v)})" for a, v in sorted(classes.items())
              if _is_registered(v)]
  return names, unregistered


def shadowing_module(exp_name: str | None) -> str | None:
  """One line when a user's module shadows a package JAX imports, else None.

  Call it before anything imports JAX: `import jax` runs such a file (a user's
  `nvidia.py` then fails in a circular import, or hides the CUDA libraries).
  Refused: a single-file module of such a name anywhere on sys.path, and a
  package of that name that --exp names when it is not an installed one.
  """
  exp_name = (exp_name or "").strip().removeprefix(FDL_CONFIG)
  exp_top = exp_name.split(".", 1)[0] if "." in exp_name else ""
  for top, what in _JAX_IMPORTS.items():
    try:
      spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
      continue
    origin = getattr(spec, "origin", None) if spec is not None else None
    if not origin or not os.path.isfile(origin):
      continue  # not found, or a namespace package (how the real ones install)
    single_file = os.path.basename(origin) != "__init__.py"
    installed = any(p in origin.split(os.sep) for p in ("site-packages", "dist-packages"))
    if not single_file and (installed or exp_top != top):
      continue
    new = f"{top}_experiments"
    example = f"{new}.py" if single_file else f"{new}/"
    rename = (f"rename it (e.g. {example}) and pass --exp={new}.{exp_name.split('.', 1)[1]}"
              if exp_top == top else f"rename it (e.g. {example}) or take its directory off "
              "PYTHONPATH")
    path, kind = (origin, "file") if single_file else (os.path.dirname(origin), "package")
    return (f"{path} shadows {what} (`import {top}` finds this {kind} instead, inside "
            f"`import jax`); {rename}.")
  return None


def _closest(name: str, keys: list[str], n: int = 5) -> list[str]:
  scored = []
  leaf = name.rsplit(".", 1)[-1].lower()
  for key in keys:
    ratio = max(
        difflib.SequenceMatcher(None, name.lower(), key.lower()).ratio(),
        difflib.SequenceMatcher(None, leaf, key.rsplit(".", 1)[-1].lower()).ratio())
    scored.append((ratio, key))
  scored.sort(key=lambda t: (-t[0], t[1]))
  return [k for r, k in scored[:n] if r >= 0.5]


def suggestions(name: str, n: int = 5) -> list[str]:
  """The registered names closest to `name` (matched on suffix and class name)."""
  return _closest(name, list(_REGISTRY), n)


def _did_you_mean(close: list[str]) -> str:
  """Ends a sentence: `. Did you mean: a, b?` or `.`; never `?.`."""
  return f". Did you mean: {', '.join(close)}?" if close else "."


def registered_items() -> list[tuple[str, type]]:
  return sorted(_REGISTRY.items())
