"""An experiment's train step under each way its masks can reach cuDNN, alternating, in one
process.

    python -m benchmarks.key_masks [--exp=FlanT5Base] [--set KEY=VALUE ...]
        [--ways=bias,fold,counts] [--steps=10] [--warmup=2] [--block=1]

On cuDNN a mask that only says which keys count (T5's encoder padding, its
cross-attention) can arrive three ways:

  bias     folded with the relative-position bias into one additive
           [batch, heads, q, k] bias, whose gradient cuDNN writes at that
           size and XLA sums over the batch (the plain call);
  fold     as one more head dim (paxlike.layers.attention.fold_key_mask),
           the bias at its batch of 1;
  counts   as each row's key count, cuDNN's own padding mask, the bias at its
           batch of 1 (paxlike.layers.attention.KeyLengths; the default,
           attention_policy.set_key_mask_lengths).

Each step is built as `paxlike.main` builds it (benchmarks.train_step.build)
and traced under its own way. They are timed alternating after `--warmup`
untimed steps each; each one's median and ratio to the first way (below 1:
faster), and each first loss are printed as one JSON line. A way whose step
fails to compile is reported with its error, not timed.

On a CPU attention runs on XLA, so the ways are the same program and the
ratios are noise.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import train_step as ts

DEFAULT_EXP = "FlanT5Tiny"
WAYS = ("bias", "fold", "counts")


def with_way(step: Callable[..., Any], way: str) -> Callable[..., Any]:
  """step, run (and so traced, should jit trace it again) with masks reaching cuDNN `way`."""
  from paxlike.layers import attention_policy

  def run(*args: Any) -> Any:
    before = attention_policy.key_mask_fold(), attention_policy.key_mask_lengths()
    attention_policy.set_key_mask_fold(way == "fold")
    attention_policy.set_key_mask_lengths(way == "counts")
    try:
      return step(*args)
    finally:
      attention_policy.set_key_mask_fold(before[0])
      attention_policy.set_key_mask_lengths(before[1])

  return run


def run(args: Any) -> dict[str, Any]:
  """Builds, traces and compiles each way's step, times them alternating; the JSON record."""
  import jax

  from paxlike.layers import attention_policy

  runners, record = [], {}
  for way in args.ways:
    side = ts.paxlike_side(ts.build(args.exp, args.set), way, args.num_batches)
    program, key = side.setup.program, side.key
    # Every call runs under its own way, so a trace at any step (jit keys its cache on the
    # arguments, not on the policy) gives the program this side stands for.
    side.runner = ts.Runner(way, with_way(lambda s, b, p=program, k=key: p.step_fn(s, b, k),
                                          way), side.runner.state, side.runner.batches)
    try:
      side.runner.compile(with_way(side.lower, way))
      loss = ts.host_metrics(side.setup.partitioner, side.runner.run())["loss"]
    except Exception as e:  # cuDNN may refuse a way as XLA compiles it
      record[f"{way}_error"] = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
      continue
    record[f"{way}_first_loss"] = loss
    record[f"{way}_compile_s"] = side.runner.compile_seconds
    # build() started a fresh attention record: the calls of this way's step
    record[f"{way}_attention"] = sorted({c["reason"] for c in attention_policy.run_record()
                                         ["choices"]})
    runners.append(side.runner)
  for _ in range(args.warmup):
    for r in runners:
      r.run()
  if runners:
    ts.time_interleaved(runners, args.steps, args.block)
  base = runners[0] if runners else None
  for r in runners:
    record[f"{r.name}_step_s_median"] = statistics.median(r.times)
    if r is not base:
      record[f"{r.name}_ratio"] = statistics.median(r.times) / statistics.median(base.times)
      record[f"{r.name}_ratio_paired_median"] = statistics.median(
          o / b for o, b in zip(r.times, base.times, strict=True))
  return {"exp": args.exp, "device": jax.devices()[0].device_kind, "ways": args.ways,
          "base": base.name if base else None, **record, "steps": args.steps,
          "block": args.block, "warmup": args.warmup}


def main(argv: Sequence[str] | None = None) -> int:
  p = ts.Parser(prog="python -m benchmarks.key_masks",
                description="Times an experiment's step under each way its key masks can "
                            "reach cuDNN, alternating, in one process.")
  ts.add_step_args(p, DEFAULT_EXP, steps=10, warmup=2)
  p.add_argument("--ways", type=lambda s: [x for x in s.split(",") if x],
                 default=["bias", "counts"],
                 help=f"comma-separated, from {', '.join(WAYS)}; the first is the base.")
  args = p.parse_args(argv)
  ts.check_counts(args, ("steps", "block", "num_batches"))
  unknown = [w for w in args.ways if w not in WAYS]
  if unknown or not args.ways or len(set(args.ways)) != len(args.ways):
    ts.fail(f"--ways takes distinct names from {', '.join(WAYS)}; got {','.join(args.ways)}.")
  return ts.print_record(run, args)


if __name__ == "__main__":
  sys.exit(main())
