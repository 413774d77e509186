"""No paxlike module imports another that (directly or through others) imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "paxlike"


def module_files(package_dir: Path) -> dict[str, Path]:
  """Dotted module name -> file, for every .py under package_dir (packages by their name)."""
  out = {}
  for path in sorted(package_dir.rglob("*.py")):
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts.pop()
    out[".".join(parts)] = path
  return out


def imported_modules(name: str, path: Path, modules: set[str]) -> set[str]:
  """The package's modules that `name` imports anywhere in its file (functions included).

  An import of one of the module's own parent packages is not counted: Python
  has run that package's __init__ before the module itself, so it is no loop.
  """
  package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
  found = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      candidates = [[a.name] for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
      # `from pkg import mod` imports pkg.mod when that is a module, pkg itself otherwise.
      candidates = [[f"{base}.{a.name}", base] for a in node.names]
    else:
      continue
    for options in candidates:
      target = next((m for m in options if m in modules), None)
      if target and target != name and not name.startswith(target + "."):
        found.add(target)
  return found


def import_loops(package_dir: Path) -> list[list[str]]:
  """Each loop of the import graph, as the modules around it (first one repeated at the end)."""
  files = module_files(package_dir)
  graph = {m: sorted(imported_modules(m, f, set(files))) for m, f in files.items()}
  loops, seen = [], set()
  for start in sorted(graph):
    # Depth-first from start, through modules after it in order only, so each loop is
    # reported once, from its smallest member.
    stack = [(start, [start])]
    while stack:
      node, path = stack.pop()
      for nxt in graph[node]:
        if nxt == start:
          loop = path + [start]
          key = frozenset(loop)
          if key not in seen:
            seen.add(key)
            loops.append(loop)
        elif nxt > start and nxt not in path and len(path) < 12:
          stack.append((nxt, path + [nxt]))
  return loops


def test_paxlike_has_no_import_loop():
  loops = import_loops(PACKAGE_DIR)
  assert not loops, "paxlike modules import each other in a loop: " + "; ".join(
      " -> ".join(loop) for loop in loops)


def test_the_check_names_a_loop_it_is_shown(tmp_path):
  pkg = tmp_path / "pkg"
  (pkg / "sub").mkdir(parents=True)
  (pkg / "__init__.py").write_text("from pkg import a\n")
  (pkg / "a.py").write_text("from pkg.sub import b\nimport pkg\n")
  (pkg / "sub" / "__init__.py").write_text("")
  (pkg / "sub" / "b.py").write_text("def f():\n  from .. import c\n")
  (pkg / "c.py").write_text("from pkg import a as _a\nfrom pkg.sub import __init__\n")
  (pkg / "d.py").write_text("import pkg.a\n")  # imports into the loop, not part of it
  assert import_loops(pkg) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]
