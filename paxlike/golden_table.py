"""The dry-run table of docs/dry_run.md, rendered from the golden records (never typed by hand).

    python -m paxlike.golden_table            # print the table
    python -m paxlike.golden_table --write    # replace it in docs/dry_run.md

Each pod-scale experiment's record holds its parameter count, its per-device
parameter and optimizer bytes, and its compiled peak per device under each
JAX release it was compiled with (`python -m paxlike.golden --compile-all
--update`); a target fits when the larger recorded peak fits its usable
memory. tests/golden_test.py checks that docs/dry_run.md holds this table.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from paxlike.dry_run import GIB, TARGETS
from paxlike.golden import COMPILED_PREFIX, RECORD_DIR, parse

# The page that shows the table (once the README; the name stays for its callers).
README = RECORD_DIR.parent.parent / "docs" / "dry_run.md"
BEGIN = "<!-- dry-run table: python -m paxlike.golden_table --write -->"
END = "<!-- end of dry-run table -->"


def _releases(records: list[dict[str, str]]) -> list[str]:
  found = {k[len(COMPILED_PREFIX):].strip("[]") for r in records for k in r
           if k.startswith(COMPILED_PREFIX)}
  return sorted(found, key=lambda r: [int(x) for x in r.split()[-1].split(".")])


def table(record_dir: Path = RECORD_DIR) -> str:
  """The markdown table: one row per record with a compiled peak."""
  records = [(p.stem, parse(p.read_text())) for p in sorted(record_dir.glob("*.txt"))]
  records = [(n, r) for n, r in records if any(k.startswith(COMPILED_PREFIX) for k in r)]
  releases = _releases([r for _, r in records])
  head = ["experiment", "devices", "params", "params + optimizer / device",
          *(f"compiled peak / device ({rel})" for rel in releases), "fits"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for name, rec in records:
    state = int(rec["bytes_per_device.params"]) + int(rec["bytes_per_device.opt_state"])
    peaks = [rec.get(f"{COMPILED_PREFIX}[{rel}]") for rel in releases]
    values = [int(p.split()[0]) for p in peaks if p]
    worst = max(values)
    fits = [t for t, spec in TARGETS.items() if worst <= spec["bytes"] * spec["usable"]]
    row = [name, rec["mesh.num_devices"], f"{int(rec['model.params']) / 1e9:.2f} B",
           f"{state / GIB:.2f} GiB",
           *(f"{int(p.split()[0]) / GIB:.1f} GiB" if p else "-" for p in peaks),
           ", ".join(fits) or "none"]
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


def in_readme(text: str) -> str | None:
  """The table between the page's markers, or None without them."""
  match = re.search(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), text, re.S)
  return match.group(1) if match else None


def write(readme: Path = README) -> None:
  text = readme.read_text()
  if in_readme(text) is None:
    raise SystemExit(f"{readme} has no {BEGIN} ... {END} markers")
  new = re.sub(re.escape(BEGIN) + r"\n.*?" + re.escape(END),
               lambda _: f"{BEGIN}\n{table()}{END}", text, flags=re.S)
  readme.write_text(new)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m paxlike.golden_table",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--write", action="store_true", help="replace the table in docs/dry_run.md")
  args = parser.parse_args(argv)
  if args.write:
    write()
  else:
    sys.stdout.write(table())
  return 0


if __name__ == "__main__":
  sys.exit(main())
