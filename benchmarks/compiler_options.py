"""An experiment's train step compiled with and without XLA options, alternating, in one process.

    python -m benchmarks.compiler_options --option NAME=VALUE [--option ...]
        [--exp=FlanT5Tiny] [--set KEY=VALUE ...] [--steps=10] [--warmup=2] [--block=1]

XLA flags are read once per process, so two runs of a benchmark compare two
processes, and two processes two machine states. Here one step, built as
`paxlike.main` builds it (benchmarks.train_step.build), is compiled twice
from the same lowering: as the run's flags have it ("plain") and with the
`--option`s on top ("options", XLA's per-compilation debug options, the
names XLA_FLAGS spells without the leading dashes). Each executable steps
its own copy of the initial state over the same batches, alternating
(ABBA), after `--warmup` untimed steps each. One JSON line: both medians,
ratio = options / plain (below 1: the options are faster), both first
losses, both compile times.

An option XLA does not know is one `error:` line, exit 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from benchmarks import train_step as ts
from paxlike.errors import UserError

DEFAULT_EXP = "FlanT5Tiny"


def parse_option(text: str) -> tuple[str, bool | int | float | str]:
  """NAME=VALUE -> (name, value): true/false as bools, numbers as numbers, else the text."""
  name, sep, value = text.partition("=")
  name = name.strip().lstrip("-")
  if not sep or not name:
    raise UserError(f"--option {text!r}: write NAME=VALUE, e.g. "
                    "--option xla_gpu_dot_merger_threshold_mb=0.")
  if value.lower() in ("true", "false"):
    return name, value.lower() == "true"
  for kind in (int, float):
    try:
      return name, kind(value)
    except ValueError:
      pass
  return name, value


def run(args: Any) -> dict[str, Any]:
  """Compiles the step both ways, times the two alternating; the JSON record."""
  import time

  import jax

  options = dict(parse_option(o) for o in args.option)
  side = ts.paxlike_side(ts.build(args.exp, args.set), "plain", args.num_batches)
  program, task = side.setup.program, side.setup.task
  lowered = side.lower(side.runner.state, side.runner.batches[0])
  runners = []
  for name, opts in (("plain", None), ("options", options)):
    t0 = time.perf_counter()
    try:
      compiled = lowered.compile(opts)
    except Exception as e:  # noqa: BLE001  (XLA's own error names the option)
      if opts is None:
        raise
      first = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise UserError(f"XLA refused the options {options}: {first}") from None
    state = side.runner.state if name == "plain" else program.init_state(task.train.seed)
    runner = ts.Runner(name, lambda s, b, c=compiled: c(s, b, side.key), state,
                       side.runner.batches)
    runner.compile_seconds = time.perf_counter() - t0
    runner.first_loss = ts.host_metrics(side.setup.partitioner, runner.run())["loss"]
    runners.append(runner)
  return {"exp": side.setup.exp_key, "device": jax.devices()[0].device_kind,
          "options": options, **ts.time_pair(*runners, args)}


def main(argv: Sequence[str] | None = None) -> int:
  p = ts.Parser(prog="python -m benchmarks.compiler_options",
                description="Times an experiment's step compiled with and without XLA "
                            "options, alternating, in one process.")
  ts.add_step_args(p, DEFAULT_EXP, steps=10, warmup=2)
  p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                 help="an XLA debug option for the second compile (repeatable).")
  args = p.parse_args(argv)
  ts.check_counts(args, ("steps", "block", "num_batches"))
  if not args.option:
    ts.fail("name at least one --option NAME=VALUE to compare against the plain compile.")
  return ts.print_record(run, args)


if __name__ == "__main__":
  sys.exit(main())
