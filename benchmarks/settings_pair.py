"""An experiment's train step under two settings of its knobs, alternating, in one process.

    python -m benchmarks.settings_pair --other KEY=VALUE [--other ...]
        [--exp=LmCloudSpmdTiny] [--set KEY=VALUE ...] [--steps=10] [--warmup=2] [--block=1]

Two runs of benchmarks.train_step compare two processes, and on a GPU two
machine states a minute apart. Here both steps are built as `paxlike.main`
builds them (benchmarks.train_step.build): "base" with the `--set`
overrides, "other" with the `--other` ones on top (for instance
`--other USE_FP8=True`). Each steps its own state over its own batches
(the same seed), alternating (ABBA) after `--warmup` untimed steps each.
One JSON line: both medians, ratio = other / base (below 1: the other
setting is faster), both first losses and compile times, and for each side
the number of instructions in its compiled step that touch a float8 type
(`*_fp8_instructions`: 0 for a step with no FP8 matmul).

A knob the experiment does not have is refused as `paxlike.main --set`
refuses it: one `error:` line, exit 2.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks import train_step as ts

DEFAULT_EXP = "LmCloudSpmdTiny"
_FP8 = re.compile(r"\bf8e[45]m[23]")


def fp8_instructions(hlo_text: str) -> int:
  """The instructions of an HLO module's text whose line names a float8 type."""
  return sum(1 for line in hlo_text.splitlines() if "=" in line and _FP8.search(line))


def run(args: Any) -> dict[str, Any]:
  """Builds and compiles both steps, times them alternating; the JSON record."""
  import jax

  runners, counts = [], {}
  for name, overrides in (("base", args.set), ("other", [*args.set, *args.other])):
    side = ts.paxlike_side(ts.build(args.exp, overrides), name, args.num_batches)
    t0 = time.perf_counter()
    compiled = side.lower(side.runner.state, side.runner.batches[0]).compile()
    side.runner.compile_seconds = time.perf_counter() - t0
    side.runner.first_loss = ts.host_metrics(side.setup.partitioner, side.runner.run())["loss"]
    counts[f"{name}_fp8_instructions"] = fp8_instructions(compiled.as_text())
    runners.append(side.runner)
  return {"exp": side.setup.exp_key, "device": jax.devices()[0].device_kind,
          "set": args.set, "other": args.other, **ts.time_pair(*runners, args), **counts}


def main(argv: Sequence[str] | None = None) -> int:
  p = ts.Parser(prog="python -m benchmarks.settings_pair",
                description="Times an experiment's step under two settings, alternating, "
                            "in one process.")
  ts.add_step_args(p, DEFAULT_EXP, steps=10, warmup=2)
  p.add_argument("--other", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                 help="overrides of the second step, on top of --set (repeatable).")
  args = p.parse_args(argv)
  ts.check_counts(args, ("steps", "block", "num_batches"))
  if not args.other:
    ts.fail("name at least one --other KEY=VALUE to compare against the --set step.")
  return ts.print_record(run, args)


if __name__ == "__main__":
  sys.exit(main())
