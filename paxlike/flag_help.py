"""--help for paxlike.main: its flags by group, each with its values and default.

absl's own --help lists every flag of every module alphabetically and exits 1;
main intercepts it (and -h) and prints this instead, exiting 0.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

WIDTH = 80
INDENT = " " * 6


def _entry(flag: Any, aliases: Sequence[str]) -> list[str]:
  """One flag: `--name (values; default; aliases)`, then its help, wrapped."""
  name = f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}"
  values = getattr(flag.parser, "enum_values", None)
  text = flag.help.split(";\n")[0]  # absl appends "repeat this option ..." to a multi flag's
  facts = []
  if values:
    facts.append("one of " + "|".join(values))
    text = text.removeprefix(f"<{'|'.join(values)}>: ")  # absl's enum prefix
  if flag.default not in (None, [], ""):
    facts.append(f"default {str(flag.default).lower() if flag.boolean else flag.default}")
  if isinstance(flag.default, list):
    facts.append("repeatable")
  facts += [f"Pax's --{a}" for a in aliases]
  head = f"  {name}" + (f" ({'; '.join(facts)})" if facts else "")
  return [head, *textwrap.wrap(text, WIDTH, initial_indent=INDENT, subsequent_indent=INDENT)]


def text(flags: Sequence[Any], groups: Sequence[tuple[str, Sequence[str]]],
         aliases: Mapping[str, str], head: Sequence[str]) -> str:
  """The help text.

  Args:
    flags: the module's flags (FlagValues.get_flags_for_module).
    groups: (title, flag names) in the order shown; a flag in none is shown under "Other".
    aliases: alias -> the flag it names (shown with that flag, not on its own).
    head: the lines before the groups (usage, summary).
  """
  own = {f.name: f for f in flags}
  alias_of: dict[str, list[str]] = {}
  for alias, target in aliases.items():
    alias_of.setdefault(target, []).append(alias)
  grouped = {n for _, names in groups for n in names}
  other = tuple(sorted(n for n in own if n not in grouped and n not in aliases))
  lines = [*head, ""]
  for title, names in (*groups, *((("Other", other),) if other else ())):
    lines.append(f"{title}:")
    for n in names:
      lines += _entry(own[n], alias_of.get(n, []))
    lines.append("")
  lines.append("absl's own flags (--verbosity, --logtostderr, ...): --helpfull.")
  return "\n".join(lines)
