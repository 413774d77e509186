"""An experiment's train step with and without the key-mask fold, alternating, in one process.

    python -m benchmarks.key_mask_fold [--exp=FlanT5Base] [--set KEY=VALUE ...]
        [--steps=10] [--warmup=2] [--block=1]

On cuDNN, attention with a mask that only says which keys count (T5's
encoder padding, its cross-attention) can carry that mask as one more head
dim (paxlike.layers.attention.fold_key_mask) instead of an additive
[batch, heads, q, k] bias; T5's relative-position bias then reaches cuDNN
with its batch of 1. The fold is exact; whether it is faster is what this
measures. Both steps are built as `paxlike.main` builds them
(benchmarks.train_step.build), the plain one first, each traced while the
fold is set for it. They are timed alternating (ABBA) after `--warmup`
untimed steps each; the medians, ratio = folded / plain (below 1: the fold
is faster) and both first losses are printed as one JSON line.

`folded_calls` says whether any attention call of the folded step took the
fold: on a CPU none does (attention runs on XLA there), so the two steps are
the same program and the ratio is noise.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from benchmarks import train_step as ts

DEFAULT_EXP = "FlanT5Tiny"
FOLDED = "key mask in the head dim"


def with_fold(step: Any, fold: bool) -> Any:
  """step, run (and so traced, should jit trace it again) with the fold set to `fold`."""
  from paxlike.layers import attention, attention_policy

  def run(state: Any, batch: Any) -> Any:
    before = attention.key_mask_fold()
    attention_policy.set_key_mask_fold(fold)
    try:
      return step(state, batch)
    finally:
      attention_policy.set_key_mask_fold(before)

  return run


def run(args: Any) -> dict[str, Any]:
  """Builds, traces and compiles both steps, times them alternating; the JSON record."""
  from paxlike.layers import attention_policy

  sides = {}
  for name, fold in (("plain", False), ("folded", True)):
    side = ts.paxlike_side(ts.build(args.exp, args.set), name, args.num_batches)
    program, key = side.setup.program, side.key
    # Every call runs under its own fold, so a trace at any step (jit keys its cache on
    # the arguments, not on the fold) gives the program this side stands for.
    side.runner = ts.Runner(name, with_fold(lambda s, b, p=program, k=key: p.step_fn(s, b, k),
                                            fold), side.runner.state, side.runner.batches)
    side.runner.compile(with_fold(side.lower, fold))
    side.runner.first_loss = ts.host_metrics(side.setup.partitioner,
                                             side.runner.run())["loss"]
    sides[name] = side
    if fold:  # build() started a fresh attention record: these are the folded step's calls
      choices = attention_policy.run_record()["choices"]
      folded_calls = any(FOLDED in c["reason"] for c in choices)
  import jax

  return {"exp": sides["plain"].setup.exp_key, "device": jax.devices()[0].device_kind,
          **ts.time_pair(sides["plain"].runner, sides["folded"].runner, args),
          "folded_calls": folded_calls, "folded_attention": choices}


def main(argv: Sequence[str] | None = None) -> int:
  p = ts.Parser(prog="python -m benchmarks.key_mask_fold",
                description="Times an experiment's step with and without the key-mask fold, "
                            "alternating, in one process.")
  ts.add_step_args(p, DEFAULT_EXP, steps=10, warmup=2)
  args = p.parse_args(argv)
  ts.check_counts(args, ("steps", "block", "num_batches"))
  return ts.print_record(run, args)


if __name__ == "__main__":
  sys.exit(main())
