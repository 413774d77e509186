"""Where an experiment's source reads a hyperparameter, and on which branch.

A knob nothing read in this run may still be one a template reads on
another branch: c4.py's LR_COS_* under LR_SCHEDULE='linear_rampup_cosine_decay'
only, a CLIP_THRESHOLD in the Adam branch of `if self.USE_ADAFACTOR:`. The
read check (paxlike.experiment.unread_hparams) warns about those instead of
refusing them; this module finds the reading sites by parsing the modules
of the experiment's classes, and names the conditions that guard them.
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

_TREES: dict[str, tuple[float, ast.Module, dict[ast.AST, ast.AST]]] = {}


@dataclass(frozen=True)
class Read:
  """One `<obj>.NAME` in a module: the function it is in and the conditions around it."""

  where: str  # "Class.method()" or "function()"
  conditions: tuple[tuple[str, bool, tuple[str, ...]], ...]  # (test source, holds?, knobs)


def _parsed(path: str) -> tuple[ast.Module, dict[ast.AST, ast.AST]] | None:
  try:
    mtime = os.path.getmtime(path)
    cached = _TREES.get(path)
    if cached is None or cached[0] != mtime:
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
      parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
      _TREES[path] = cached = (mtime, tree, parents)
  except (OSError, SyntaxError, ValueError):
    return None
  return cached[1], cached[2]


def _class_paths(classes: Iterable[type]) -> dict[str, set[str]]:
  """{module file: qualified names of the given classes defined in it}."""
  out: dict[str, set[str]] = {}
  for klass in classes:
    path = getattr(sys.modules.get(klass.__module__), "__file__", None)
    if path and path.endswith(".py"):
      out.setdefault(path, set()).add(klass.__qualname__)
  return out


def _modules(classes: Iterable[type]
             ) -> Iterator[tuple[ast.Module, dict[ast.AST, ast.AST], set[str]]]:
  """(parsed module, its parent links, the given classes' qualified names in it) for each
  module that defines one of the classes."""
  for path, qualnames in _class_paths(classes).items():
    parsed = _parsed(path)
    if parsed is not None:
      yield parsed[0], parsed[1], qualnames


def _knobs(test: ast.AST) -> tuple[str, ...]:
  names = [n.attr for n in ast.walk(test)
           if isinstance(n, ast.Attribute) and n.attr.isupper() and not n.attr.startswith("_")]
  return tuple(dict.fromkeys(names))


def _conditions(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> Iterator[tuple]:
  """(test source, whether it holds on the way to node, knobs in it), innermost first."""
  child, parent = node, parents.get(node)
  while parent is not None and not isinstance(parent, ast.FunctionDef | ast.ClassDef):
    if isinstance(parent, ast.If | ast.IfExp | ast.While) and child is not parent.test:
      holds = (child in parent.body) if isinstance(parent.body, list) else child is parent.body
      yield ast.unparse(parent.test), holds, _knobs(parent.test)
    elif isinstance(parent, ast.BoolOp) and child is not parent.values[0]:
      for before in parent.values[:parent.values.index(child)]:
        yield ast.unparse(before), isinstance(parent.op, ast.And), _knobs(before)
    child, parent = parent, parents.get(parent)


def _defs(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[ast.AST]:
  """The classes and functions around node, outermost first."""
  out = []
  parent = parents.get(node)
  while parent is not None:
    if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
      out.append(parent)
    parent = parents.get(parent)
  return out[::-1]


def _qualname(defs: list[ast.AST]) -> str:
  """Python's __qualname__ of the last of these nested definitions."""
  parts = []
  for i, d in enumerate(defs):
    parts.append(d.name)
    if i < len(defs) - 1 and not isinstance(d, ast.ClassDef):
      parts.append("<locals>")
  return ".".join(parts)


def _where(defs: list[ast.AST]) -> str:
  if not defs:
    return "module code"
  names = ".".join(d.name for d in defs[-2:] if d is defs[-1] or isinstance(d, ast.ClassDef))
  return names + ("" if isinstance(defs[-1], ast.ClassDef) else "()")


def reads(name: str, classes: Iterable[type]) -> list[Read]:
  """Every `<something>.NAME` load in these classes' code, or in functions (not other
  classes) of the modules that define them: a template's helper, as c4.py's
  set_adam_and_learning_rate_schedule(cls, task_p)."""
  out = []
  for tree, parents, qualnames in _modules(classes):
    for node in ast.walk(tree):
      if not (isinstance(node, ast.Attribute) and node.attr == name
              and isinstance(node.ctx, ast.Load)):
        continue
      defs = _defs(node, parents)
      owners = [i for i, d in enumerate(defs) if isinstance(d, ast.ClassDef)]
      if owners and _qualname(defs[:owners[-1] + 1]) not in qualnames:
        continue  # another class's code
      out.append(Read(_where(defs), tuple(_conditions(node, parents))))
  return out


def class_body_uses(name: str, classes: Iterable[type]) -> str | None:
  """Which of these classes computes another class attribute from `name` in its body
  (GLaM's `NUM_GPUS = 64` then `ICI_MESH_SHAPE = [1, NUM_GPUS, 1]`), as "Cls computes
  ICI_MESH_SHAPE from it"; None when none does. Such a knob is read when the class is
  defined, so a later --set of it changes nothing (and is refused as unread)."""
  for tree, _, qualnames in _modules(classes):
    for node in ast.walk(tree):
      if not (isinstance(node, ast.ClassDef) and node.name in
              {q.rsplit(".", 1)[-1] for q in qualnames}):
        continue
      for stmt in _class_statements(node.body):
        value = getattr(stmt, "value", None) or getattr(stmt, "test", None)
        if value is None or not any(isinstance(n, ast.Name) and n.id == name
                                    for n in ast.walk(value)):
          continue
        targets = [t.id for t in getattr(stmt, "targets", [getattr(stmt, "target", None)])
                   if isinstance(t, ast.Name)]
        what = ", ".join(targets) if targets else "its attributes"
        return f"{node.name} computes {what} from it"
  return None


def _class_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
  """A class body's statements, those under its `if`s included, not its methods'."""
  for stmt in body:
    yield stmt
    if isinstance(stmt, ast.If):
      yield from _class_statements(stmt.body)
      yield from _class_statements(stmt.orelse)


def _show(value: Any) -> str:
  return getattr(value, "__name__", None) or repr(value)


def inactive_reason(name: str, classes: Iterable[type],
                    value_of: Callable[[str], Any]) -> str | None:
  """Why a knob some source reads was not read here, naming the settings that decide it.

  Returns:
    None when no module of these classes reads `name`; else e.g. "Tmpl.task() reads it
    only in the else branch of `if self.USE_ADAFACTOR`, and here USE_ADAFACTOR=True".
  """
  found = reads(name, classes)
  if not found:
    return None
  guarded = [r for r in found if any(knobs for _, _, knobs in r.conditions)]
  read = (guarded or found)[0]
  if not read.conditions:
    return (f"{read.where} reads it, and this experiment does not run that code (a subclass "
            "overrides it, or nothing calls it)")
  test, holds, _ = next((c for c in read.conditions if c[2]), read.conditions[0])
  branch = f"under `if {test}`" if holds else f"in the else branch of `if {test}`"
  knobs = [k for _, _, ks in read.conditions for k in ks]
  here = ", ".join(f"{k}={_show(value_of(k))}" for k in dict.fromkeys(knobs)
                   if _has(value_of, k))
  return f"{read.where} reads it only {branch}" + (f", and here {here}" if here else "")


def _has(value_of: Callable[[str], Any], name: str) -> bool:
  try:
    value_of(name)
  except AttributeError:
    return False
  return True
