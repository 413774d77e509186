"""A LoRA train step (USE_LORA) against the full fine-tuning step of the same Llama.

    python -m benchmarks.lora_step [--rank 16 --targets all --layers 4 --model_dims 512
        --heads 8 --head_dim 64 --kv_heads 8 --hidden_dims 2048 --vocab 8192 --seq 256
        --batch 8 --dtype float32 --policy SAVE_NOTHING --rounds 8]

Both sides are benchmarks.llama_step's Llama experiment at the same shape,
built as `paxlike.main` builds them; the LoRA side adds USE_LORA, LORA_RANK
and LORA_TARGET_LAYERS. Their model FLOPs (what MFU divides: 4 per frozen
weight and token, 6 per adapter weight, paxlike.flops.weight_flops)
and the matmul FLOPs of their step's jaxpr are printed; then, after
compiling and `--warmup` untimed steps each, the two are timed in `--rounds`
rounds, alternating, and the medians and the ratio LoRA / full are printed
(with this process's CPU seconds per step on a shared machine), then one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks import llama_step
from benchmarks import train_step as ts
from paxlike.errors import UserError


def run(args: argparse.Namespace) -> dict[str, Any]:
  exp = llama_step.peer_experiments(args.rope_theta)["llama"]
  shape = llama_step.shape_sets(args, "llama") + args.set
  lora_sets = ["USE_LORA=True", f"LORA_RANK={args.rank}", f"LORA_TARGET_LAYERS={args.targets}"]
  sides = {"full": llama_step.build_side("full", exp, shape, args.num_batches),
           "lora": llama_step.build_side("lora", exp, shape + lora_sets, args.num_batches)}
  counted = {n: llama_step.step_flops(side) for n, side in sides.items()}
  for side in sides.values():
    side.runner.compile(side.lower)
  med, cpu = llama_step.timed(sides, args)
  full, lora = sides["full"].runner, sides["lora"].runner
  import jax

  return {
      "full_step_s_median": med["full"], "lora_step_s_median": med["lora"],
      "ratio": med["lora"] / med["full"],
      "ratio_paired_median": statistics.median(
          a / b for a, b in zip(lora.times, full.times, strict=True)),
      "ratio_cpu": cpu["lora"] / cpu["full"],
      "model_flops_ratio": counted["lora"]["model_flops"] / counted["full"]["model_flops"],
      "jaxpr_matmul_flops_ratio": (counted["lora"]["jaxpr_matmul_flops"]
                                   / counted["full"]["jaxpr_matmul_flops"]),
      "full_flops": counted["full"], "lora_flops": counted["lora"],
      "full_first_loss": full.first_loss, "lora_first_loss": lora.first_loss,
      "rank": args.rank, "targets": args.targets,
      "shape": {k: getattr(args, k) for k in ("layers", "model_dims", "heads", "head_dim",
                                               "kv_heads", "hidden_dims", "vocab", "seq",
                                               "batch", "dtype", "policy", "scanned")},
      "rounds": args.rounds, "block": args.block, "warmup": args.warmup,
      "devices": jax.device_count(), "platform": jax.devices()[0].platform,
  }


def summary(record: dict[str, Any]) -> str:
  return "\n".join([
      f"model FLOPs per step lora / full = {record['model_flops_ratio']:.3f}; matmul FLOPs in "
      f"the steps' jaxprs lora / full = {record['jaxpr_matmul_flops_ratio']:.3f}",
      f"step s (median of {record['rounds'] * record['block']}): "
      f"full {record['full_step_s_median']:.4f}, lora {record['lora_step_s_median']:.4f}; "
      f"lora / full = {record['ratio']:.3f} (paired {record['ratio_paired_median']:.3f}, "
      f"CPU seconds {record['ratio_cpu']:.3f})"])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  p = llama_step.parser("python -m benchmarks.lora_step",
                        "Times a LoRA step against the full fine-tuning step of the same "
                        "Llama, alternating, in one process (llama_step's shape flags; its "
                        "--lm_* and --hlo_dir flags are not read).")
  p.add_argument("--rank", type=int, default=16, help="LORA_RANK (default 16).")
  p.add_argument("--targets", choices=("all", "attention", "mlp"), default="all",
                 help="LORA_TARGET_LAYERS (default all).")
  args = llama_step.checked(p.parse_args(argv))
  ts.check_counts(args, ("rank",))
  return args


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  from paxlike import log

  log.setup()
  try:
    record = run(args)
  except UserError as e:
    ts.fail(str(e))
  print(summary(record), flush=True)
  print(json.dumps(record), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
