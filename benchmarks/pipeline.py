"""Step time of pipeline schedules against the unpipelined model, on 8 fake CPU devices.

    python -m benchmarks.pipeline [--rounds 3] [--steps 2] [--out DIR]

One fixed small LM (the classes below: the same dims, optimizer and data on
both templates) is trained for a few steps in each variant: unpipelined
(data parallel over the 8 devices, the reference), GPipe with 2 and 4
stages x 4 and 8 microbatches, and the circular schedule with repeat 2.
Every variant is built as paxlike.main builds it (benchmarks.train_step's
build) and its train step is the trainer's. Variants are compiled first,
then timed round by round, each round running every variant for --steps
steps in an order that flips every round; the table gives each variant's
median step time and its ratio to the unpipelined step, next to the bubble
fraction (S-1)/(M x R + S-1) of its schedule. The table is printed and
written as pipeline.json under --out (a new temporary directory unless given).

What a CPU can show: the fake devices share this machine's cores, so no two
stages ever run at the same time. A pipelined step here costs the work of
every iteration of every stage, bubble iterations included (stages compute
on empty activations while they wait), plus the shifts between stages, and
no overlap hides any of it; on a pod, where each stage has its own chips,
the same schedule takes about (M x R + S - 1) / (M x R) of the
stage-parallel time. The ratios below measure the schedule's overhead on
one shared processor, not the speed-up or the bubble a pod would see.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from benchmarks import train_step as ts
from paxlike import experiment_registry
from paxlike.errors import UserError
from paxlike.lm_experiments import (
    SyntheticDataset,
    TransformerLmSpmdAdam,
    TransformerLmSpmdPipelineAdafactor,
)

DEVICES = 8
DEVICE_FLAG = "--xla_force_host_platform_device_count"


class _Model:
  """The benchmark's LM (one definition for both templates)."""

  NUM_LAYERS = 8
  MODEL_DIMS = 128
  HIDDEN_DIMS = 512
  NUM_HEADS = 4
  DIMS_PER_HEAD = 32
  VOCAB_SIZE = 256
  MAX_SEQ_LEN = 64
  PERCORE_BATCH_SIZE = 4  # a global batch of 32 on 8 devices
  FPROP_DTYPE = jnp.float32
  USE_REPEATED_LAYER = False
  CHECKPOINT_POLICY = "SAVE_NOTHING"
  COMBINE_QKV = False
  OPTIMIZER = "adam"
  LEARNING_RATE = 1e-3
  LR_LRED_DECAY_END = 300000
  TRAINING_OPTIMIZED_SHARDING = False


@experiment_registry.register
class PipelineBenchUnpipelined(_Model, TransformerLmSpmdAdam, SyntheticDataset):
  """The reference: the model data parallel over the 8 devices (weights replicated over the
  replica axis, as the pipelined variants keep theirs within a stage)."""

  ICI_MESH_SHAPE = [DEVICES, 1, 1]


@experiment_registry.register
class PipelineBenchPipelined(_Model, TransformerLmSpmdPipelineAdafactor, SyntheticDataset):
  """The model pipelined; each variant sets NUM_STAGES, NUM_MICROBATCHES, CIRCULAR_REPEAT
  and a [NUM_STAGES, 8 / NUM_STAGES, 1, 1] mesh."""

  NUM_STAGES = 2
  NUM_MICROBATCHES = 4
  ICI_MESH_SHAPE = [2, DEVICES // 2, 1, 1]


# (stages, microbatches, circular repeat); None: the unpipelined reference.
VARIANTS: tuple[tuple[int, int, int] | None, ...] = (
    None, (2, 4, 1), (2, 8, 1), (4, 4, 1), (4, 8, 1), (2, 4, 2), (4, 8, 2))
# --tiny: a model small enough for a test (the same code path, seconds instead of minutes).
TINY = ("NUM_LAYERS=8", "MODEL_DIMS=32", "HIDDEN_DIMS=64", "NUM_HEADS=2", "DIMS_PER_HEAD=16",
        "VOCAB_SIZE=64", "MAX_SEQ_LEN=16", "PERCORE_BATCH_SIZE=2")


def variant_name(v: tuple[int, int, int] | None) -> str:
  if v is None:
    return "unpipelined"
  s, m, r = v
  return f"{'gpipe' if r == 1 else 'circular'}_s{s}_m{m}" + (f"_r{r}" if r > 1 else "")


def parse_variant(text: str) -> tuple[int, int, int] | None:
  """'unpipelined' or 'S,M[,R]' (stages, microbatches, circular repeat)."""
  if text == "unpipelined":
    return None
  try:
    parts = [int(p) for p in text.split(",")]
  except ValueError:
    parts = []
  if len(parts) not in (2, 3) or min(parts) < 1:
    raise UserError(f"--variants {text!r}: write 'unpipelined' or STAGES,MICROBATCHES[,REPEAT] "
                    "with positive ints, e.g. 2,4 or 2,4,2.")
  s, m, r = (*parts, 1)[:3]
  if DEVICES % s:
    raise UserError(f"--variants {text!r}: {s} stages do not divide the {DEVICES} devices.")
  return s, m, r


def overrides(v: tuple[int, int, int] | None, tiny: bool) -> tuple[str, list[str]]:
  """(the experiment, its --set values) of a variant."""
  base = list(TINY) if tiny else []
  if v is None:
    return "benchmarks.pipeline.PipelineBenchUnpipelined", base
  s, m, r = v
  return "benchmarks.pipeline.PipelineBenchPipelined", [
      *base, f"NUM_STAGES={s}", f"NUM_MICROBATCHES={m}", f"CIRCULAR_REPEAT={r}",
      f"ICI_MESH_SHAPE=[{s},{DEVICES // s},1,1]"]


def build_variant(v: tuple[int, int, int] | None, tiny: bool, batches: int) -> Any:
  """A train_step.Runner for the variant, compiled; and the bubble of its schedule."""
  from paxlike import flops

  name, sets = overrides(v, tiny)
  setup = ts.build(name, sets)
  program, part, task = setup.program, setup.partitioner, setup.task
  side = ts.paxlike_side(setup, variant_name(v), batches)
  runner = side.runner
  runner.compile(side.lower)
  runner.first_loss = ts.host_metrics(part, runner.run())["loss"]
  schedule = flops.pipeline_schedule(task.model, program.global_batch)
  return runner, schedule, task.model.model_flops_per_step(program.global_specs)


def run(args: argparse.Namespace) -> dict[str, Any]:
  """Builds and compiles every variant, times them in alternating rounds; the record."""
  import jax

  if jax.device_count() < DEVICES:
    raise UserError(f"the benchmark needs {DEVICES} devices, this process has "
                    f"{jax.device_count()}; run it as its own command (it sets "
                    f"{DEVICE_FLAG}={DEVICES} before JAX starts).")
  built = [(v, *build_variant(v, args.tiny, args.num_batches)) for v in args.variants]
  runners = [b[1] for b in built]
  for r in runners:
    r.times.clear()
  for rnd in range(args.rounds):
    for r in (runners if rnd % 2 == 0 else runners[::-1]):
      for _ in range(args.steps):
        r.run()
  base = next((statistics.median(r.times) for v, r, *_ in built if v is None), None)
  rows = []
  for v, r, schedule, model_flops in built:
    step_s = statistics.median(r.times)
    rows.append({
        "variant": r.name,
        "schedule": "none" if v is None else schedule["schedule"],
        "stages": None if v is None else schedule["stages"],
        "microbatches": None if v is None else schedule["microbatches"],
        "microbatch_size": None if v is None else schedule["microbatch_size"],
        "circular_repeat": None if v is None else schedule["circular_repeat"],
        "iterations": None if v is None else schedule["iterations"],
        "bubble_fraction": 0.0 if v is None else schedule["bubble_fraction"],
        "step_s_median": step_s,
        "step_s_min": min(r.times),
        "ratio_to_unpipelined": step_s / base if base else None,
        "compile_s": r.compile_seconds,
        "first_loss": r.first_loss,
        "model_flops_per_step": model_flops,
    })
  device = jax.devices()[0]
  return {"devices": jax.device_count(), "platform": device.platform,
          "device_kind": device.device_kind, "tiny": args.tiny, "rounds": args.rounds,
          "steps_per_round": args.steps, "variants": rows,
          "xla_flags": os.environ.get("XLA_FLAGS", ""),
          "note": ("fake CPU devices share the host's cores: no two stages run at once, so "
                   "the step pays for every stage's bubble iterations and no overlap hides "
                   "them; the ratios are the schedule's overhead on one processor, not a "
                   "pod's speed-up")}


def format_table(record: dict[str, Any]) -> str:
  head = ("variant", "schedule", "stages", "microbatches", "repeat", "bubble", "step s",
          "x unpipelined")
  lines = [head]
  for row in record["variants"]:
    ratio = row["ratio_to_unpipelined"]
    lines.append((row["variant"], row["schedule"], _cell(row["stages"]),
                  _cell(row["microbatches"]), _cell(row["circular_repeat"]),
                  f"{100 * row['bubble_fraction']:.1f}%", f"{row['step_s_median']:.4f}",
                  f"{ratio:.2f}" if ratio is not None else "-"))
  widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
  text = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True))
          for line in lines]
  text.append(f"{record['devices']} {record['platform']} devices ({record['device_kind']}), "
              f"median of {record['rounds']} rounds x {record['steps_per_round']} steps; "
              + record["note"] + ".")
  return "\n".join(text)


def _cell(value: Any) -> str:
  return "-" if value is None else str(value)


# ---------------------------------------------------------------------- CLI


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  p = ts.Parser(prog="python -m benchmarks.pipeline",
                description="Times GPipe and circular pipeline schedules against the "
                            "unpipelined step on 8 fake CPU devices.")
  p.add_argument("--rounds", type=int, default=3, help="timing rounds over all variants.")
  p.add_argument("--steps", type=int, default=2, help="timed steps per variant per round.")
  p.add_argument("--num_batches", type=int, default=2, help="distinct input batches, cycled.")
  p.add_argument("--variants", nargs="+", default=None, metavar="S,M[,R]",
                 help="'unpipelined' and STAGES,MICROBATCHES[,CIRCULAR_REPEAT] entries "
                      "(default: unpipelined 2,4 2,8 4,4 4,8 2,4,2 4,8,2).")
  p.add_argument("--tiny", action="store_true", help="a tiny model (a smoke test, not a "
                 "measurement).")
  p.add_argument("--out", default=None,
                 help="directory for pipeline.json (default: a new temporary directory).")
  args = p.parse_args(argv)
  for name in ("rounds", "steps", "num_batches"):
    if getattr(args, name) < 1:
      ts.fail(f"--{name} must be at least 1, got {getattr(args, name)}.")
  try:
    args.variants = (list(VARIANTS) if args.variants is None
                     else [parse_variant(t) for t in args.variants])
  except UserError as e:
    ts.fail(str(e))
  return args


def _use_fake_devices() -> None:
  """8 fake CPU devices, set before JAX starts (a process that has started JAX keeps its own)."""
  from paxlike import xla_flags

  if xla_flags.backend_started():
    return
  kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_FLAG)]
  os.environ["XLA_FLAGS"] = " ".join([*kept, f"{DEVICE_FLAG}={DEVICES}"])
  os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  _use_fake_devices()
  from paxlike import log

  log.setup()
  try:
    record = run(args)
  except UserError as e:
    ts.fail(str(e))
  out = args.out or tempfile.mkdtemp(prefix="paxlike_pipeline_bench_")
  os.makedirs(out, exist_ok=True)
  path = os.path.join(out, "pipeline.json")
  with open(path, "w") as f:
    json.dump(record, f, indent=2)
    f.write("\n")
  print(format_table(record))
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
