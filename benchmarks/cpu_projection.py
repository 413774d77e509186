"""A bfloat16 train step on the CPU with the plain dense-layer gradient and with project()'s.

    python -m benchmarks.cpu_projection [--exp=FlanT5Small] [--steps=6]
        [--set PERCORE_BATCH_SIZE=4 ...]

`paxlike.layers.linear.project` accumulates a bfloat16 weight gradient as
float32 on a CPU under jaxlib 0.11 and later, where XLA's CPU compiler
otherwise runs it as a slow bfloat16 matmul outside YNNPACK. This builds the
experiment's step twice in one process, once each way (whatever this jaxlib
is: under 0.10, which keeps the plain product, it shows what the other way
would cost there), alternates single steps ABBA, and prints one JSON line:
plain_s, project_s (medians) and ratio = project / plain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence

from benchmarks import train_step as ts
from paxlike.errors import UserError

DEFAULT_SETS = ["ICI_MESH_SHAPE=[1,1,1]", "PERCORE_BATCH_SIZE=4", "DROPOUT_PROB=0.0",
                "FPROP_DTYPE=bfloat16"]


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--exp", default="FlanT5Small")
  p.add_argument("--steps", type=int, default=6)
  p.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                 help="overrides after the defaults " + " ".join(DEFAULT_SETS))
  args = p.parse_args(argv)
  if args.steps < 1:
    ts.fail("--steps must be at least 1.")
  import jax

  from paxlike.layers import linear

  # project() takes its CPU gradient from jaxlib 0.11 on: each side claims a version.
  real_version = linear._jaxlib_version
  runners = []
  try:
    for name, version in (("plain", (0, 10)), ("project", (0, 11))):
      linear._jaxlib_version = lambda version=version: version
      side = ts.paxlike_side(ts.build(args.exp, [*DEFAULT_SETS, *args.set]), name, 2)
      side.runner.run()  # traced and compiled under this variant; jit keeps it
      runners.append(side.runner)
  except UserError as e:
    ts.fail(str(e))
  finally:
    linear._jaxlib_version = real_version
  ts.time_interleaved(runners, args.steps, 1)
  out = {"exp": args.exp, "jax": jax.__version__, "steps": args.steps}
  out.update({f"{r.name}_s": statistics.median(r.times) for r in runners})
  out["ratio"] = out["project_s"] / out["plain_s"]
  print(json.dumps(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
