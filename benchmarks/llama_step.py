"""The Llama-family train step against the Pax LM step of the same model FLOPs.

    python -m benchmarks.llama_step [--layers 4 --model_dims 512 --heads 8 --head_dim 64
        --kv_heads 8 --hidden_dims 2048 --vocab 8192 --seq 256 --batch 8 --dtype float32
        --policy SAVE_NOTHING --rounds 8]

Both steps are built as `paxlike.main` builds them (benchmarks.train_step.build)
from two experiments defined here and registered when the benchmark runs:

  llama  paxlike.models.llama.LlamaModel (RMSNorm, RoPE, GQA, SwiGLU,
         untied lm_head), default rotary scaling;
  lm     paxlike.models.language_model.LanguageModel made as Llama-like as its
         knobs go: USE_GATED_ACTIVATION=True with silu, RMSNorm, rotary
         positions (Llama's theta), no biases, no per-dim scale, no softmax
         bias, no logit caps, no position table, a separate input table.

Both have the same shape, optimizer (Adam, constant rate, clipping, weight
decay) and synthetic batches; their model FLOPs (paxlike.flops) and the
matmul FLOPs of their step's jaxpr are printed, and a difference in either is
an error (exit 1). After compiling and `--warmup` untimed steps each, the
two are timed in `--rounds` rounds of `--block` steps each, alternating
(ABBA), and the medians and their ratio Llama / LM are printed, then one JSON
line. On a shared machine the medians of this process's CPU seconds per
step are printed too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks import train_step as ts
from paxlike.errors import UserError

DTYPES = ("float32", "bfloat16")


def peer_experiments(rope_theta: float, lm_norm: str = "rmsnorm", lm_rope: bool = True
                     ) -> dict[str, type]:
  """The two experiments compared: {"llama": ..., "lm": ...} (classes, unregistered).

  lm_norm, lm_rope: the LM's norm and whether it has rotary positions
  ("layernorm", False: Pax's LM with sinusoidal positions added to the
  embeddings, whose model FLOPs are the same).
  """
  import jax.numpy as jnp

  from paxlike.llama_experiments import LlamaSpmdAdam, SyntheticLlamaDataset
  from paxlike.lm_experiments import SyntheticDataset, TransformerLmSpmdAdam

  class _Same:
    """What both sides share: one device, the optimizer, the cadence."""

    ICI_MESH_SHAPE = [1, 1, 1]
    FPROP_DTYPE = jnp.float32
    LEARNING_RATE = 1e-3
    LR_SCHEDULE = "constant"
    CLIP_GRADIENT_NORM_TO_VALUE = 1.0
    WEIGHT_DECAY = 1e-3
    NUM_TRAIN_STEPS = 1000
    USE_REPEATED_LAYER = True
    CHECKPOINT_POLICY = "SAVE_NOTHING"

  class LlamaStepLlama(_Same, SyntheticLlamaDataset, LlamaSpmdAdam):
    ROPE_THETA = rope_theta
    ROPE_SCALING = None
    TIE_EMBEDDINGS = False

  class LlamaStepLm(_Same, SyntheticDataset, TransformerLmSpmdAdam):
    ACTIVATION = "silu"
    ACTIVATION_CLS = None
    USE_GATED_ACTIVATION = True
    COMBINE_QKV = False
    ATTEN_LOGIT_CAP = 0.0
    SOFTMAX_CAP_LOGITS = 0.0
    SOFTMAX_HAS_BIAS = False
    PER_DIM_SCALE = False
    SEPARATE_EMBEDDING = True
    PACKED_INPUT = False
    LAYERNORM_EPSILON = 1e-5  # Llama's NORM_EPSILON default

    def model(self) -> Any:
      cfg = super().model()
      # The knobs praxis's config tree reaches (paxlike.pax.config_tree), set directly.
      cfg.norm_type = lm_norm
      if lm_rope:
        cfg.rope_timescales = (1.0, rope_theta)  # = Llama's 1 / theta ** (2i / head_dim)
        cfg.use_position_emb = False
      cfg.ffn_has_bias = False
      cfg.scale_sqrt_depth = False
      return cfg

  return {"llama": LlamaStepLlama, "lm": LlamaStepLm}


def shape_sets(args: argparse.Namespace, family: str) -> list[str]:
  """The --set overrides of one side for the benchmark's shape."""
  sets = [f"NUM_LAYERS={args.layers}", f"MODEL_DIMS={args.model_dims}",
          f"NUM_HEADS={args.heads}", f"DIMS_PER_HEAD={args.head_dim}",
          f"HIDDEN_DIMS={args.hidden_dims}", f"VOCAB_SIZE={args.vocab}",
          f"MAX_SEQ_LEN={args.seq}", f"PERCORE_BATCH_SIZE={args.batch}",
          f"FPROP_DTYPE={args.dtype}", f"USE_REPEATED_LAYER={args.scanned}",
          f"CHECKPOINT_POLICY={args.policy}"]
  if family == "llama":
    sets.append(f"NUM_KV_HEADS={args.kv_heads}")
  elif args.kv_heads != args.heads:
    raise UserError("the LM side has no NUM_KV_HEADS knob of its own; compare with "
                    "--kv_heads equal to --heads.")
  return sets


def build_side(name: str, exp_cls: type, sets: list[str], num_batches: int) -> ts.Side:
  """One side's step, state and batches, as benchmarks.train_step builds them."""
  from paxlike import registry

  registry.register(exp_cls, allow_overwrite=True)
  setup = ts.build(f"{exp_cls.__module__}.{exp_cls.__qualname__}", sets)
  return ts.paxlike_side(setup, name, num_batches)


def step_flops(side: ts.Side) -> dict[str, float]:
  """Model FLOPs per step (the model's formula) and the matmul FLOPs of its jaxpr."""
  import jax

  from paxlike import flops

  program, model = side.setup.program, side.setup.task.model
  jaxpr = jax.make_jaxpr(getattr(program.step_fn, "jitted", program.step_fn))(
      side.runner.state, side.runner.batches[0], side.key)
  return {"model_flops": float(model.model_flops_per_step(program.global_specs)),
          "jaxpr_matmul_flops": flops.jaxpr_matmul_flops(jaxpr)}


def timed(sides: dict[str, ts.Side], args: argparse.Namespace
          ) -> tuple[dict[str, float], dict[str, float]]:
  """Each compiled side's first loss, --warmup untimed steps, then --rounds alternating rounds
  of --block steps: (median step seconds, median CPU seconds) by side name."""
  runners = [side.runner for side in sides.values()]
  for side in sides.values():
    side.runner.first_loss = ts.host_metrics(side.setup.partitioner, side.runner.run())["loss"]
  for _ in range(args.warmup):
    for r in runners:
      r.run()
  ts.time_interleaved(runners, args.rounds * args.block, args.block)
  return ({r.name: statistics.median(r.times) for r in runners},
          {r.name: statistics.median(r.cpu_times) for r in runners})


def run(args: argparse.Namespace) -> tuple[dict[str, Any], bool]:
  """Builds both sides, checks their FLOPs, times them alternating; (record, FLOPs equal)."""
  exps = peer_experiments(args.rope_theta, args.lm_norm, args.lm_rope)
  sides = {name: build_side(name, exps[name], shape_sets(args, name) + args.set,
                            args.num_batches) for name in ("llama", "lm")}
  llama, lm = sides["llama"].runner, sides["lm"].runner
  counted = {n: step_flops(side) for n, side in sides.items()}
  compiled = {n: side.runner.compile(side.lower) for n, side in sides.items()}
  hlo = ts.dump_hlo(args.hlo_dir, {n: c.as_text() for n, c in compiled.items()}) if (
      args.hlo_dir) else None
  del compiled
  med, cpu = timed(sides, args)
  same = all(counted["llama"][k] == counted["lm"][k] for k in counted["llama"])
  import jax

  record = {
      "llama_step_s_median": med["llama"], "lm_step_s_median": med["lm"],
      "ratio": med["llama"] / med["lm"],
      "ratio_paired_median": statistics.median(
          a / b for a, b in zip(llama.times, lm.times, strict=True)),
      "llama_cpu_s_median": cpu["llama"], "lm_cpu_s_median": cpu["lm"],
      "ratio_cpu": cpu["llama"] / cpu["lm"],
      "llama_flops": counted["llama"], "lm_flops": counted["lm"], "flops_equal": same,
      "llama_first_loss": llama.first_loss, "lm_first_loss": lm.first_loss,
      "llama_compile_s": llama.compile_seconds, "lm_compile_s": lm.compile_seconds,
      "shape": {k: getattr(args, k) for k in ("layers", "model_dims", "heads", "head_dim",
                                               "kv_heads", "hidden_dims", "vocab", "seq",
                                               "batch", "dtype", "policy", "scanned",
                                               "lm_norm", "lm_rope")},
      "rounds": args.rounds, "block": args.block, "warmup": args.warmup,
      "devices": jax.device_count(), "platform": jax.devices()[0].platform,
  }
  if hlo is not None:
    record["hlo"] = hlo
  return record, same


def summary(record: dict[str, Any]) -> str:
  """The human-readable lines printed before the JSON line."""
  lf, mf = record["llama_flops"], record["lm_flops"]
  return "\n".join([
      f"model FLOPs per step: llama {lf['model_flops']:.6g}, lm {mf['model_flops']:.6g}; "
      f"matmul FLOPs in the step's jaxpr: llama {lf['jaxpr_matmul_flops']:.6g}, "
      f"lm {mf['jaxpr_matmul_flops']:.6g}",
      f"step s (median of {record['rounds'] * record['block']}): "
      f"llama {record['llama_step_s_median']:.4f}, lm {record['lm_step_s_median']:.4f}; "
      f"llama / lm = {record['ratio']:.3f} (paired {record['ratio_paired_median']:.3f}, "
      f"CPU seconds {record['ratio_cpu']:.3f})"])


def parser(prog: str, description: str) -> ts.Parser:
  """The shape, timing and override flags (benchmarks.lora_step adds its own to them)."""
  p = ts.Parser(prog=prog, description=description)
  for flag, default, what in (
      ("layers", 4, "layers"), ("model_dims", 512, "model dims"), ("heads", 8, "query heads"),
      ("head_dim", 64, "dims per head"), ("kv_heads", None, "Llama's key/value heads "
                                                             "(default: --heads)"),
      ("hidden_dims", 2048, "FFN hidden dims"), ("vocab", 8192, "vocabulary"),
      ("seq", 256, "sequence length"), ("batch", 8, "batch (one device)"),
      ("rounds", 8, "timed rounds (each side runs --block steps a round)"),
      ("block", 1, "steps per side per round"), ("warmup", 2, "untimed steps per side"),
      ("num_batches", 2, "distinct batches, cycled")):
    p.add_argument(f"--{flag}", type=int, default=default, help=f"{what} (default {default}).")
  p.add_argument("--dtype", choices=DTYPES, default="float32", help="FPROP_DTYPE.")
  p.add_argument("--policy", default="SAVE_NOTHING",
                 help="CHECKPOINT_POLICY of both (default SAVE_NOTHING: full remat).")
  p.add_argument("--scanned", action=argparse.BooleanOptionalAction, default=True,
                 help="USE_REPEATED_LAYER of both.")
  p.add_argument("--rope_theta", type=float, default=10000.0, help="both sides' RoPE theta.")
  p.add_argument("--lm_norm", choices=("rmsnorm", "layernorm"), default="rmsnorm",
                 help="the LM's norm (default rmsnorm, Llama's).")
  p.add_argument("--lm_rope", action=argparse.BooleanOptionalAction, default=True,
                 help="rotary positions in the LM (default); --no-lm_rope: sinusoids added "
                      "to the embeddings, Pax's LM.")
  p.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                 help="further overrides of both sides.")
  p.add_argument("--hlo_dir", default=None,
                 help="write both optimized HLOs here; op counts go into the JSON line.")
  return p


def checked(args: argparse.Namespace) -> argparse.Namespace:
  """The parsed flags with --kv_heads defaulted, every count checked positive."""
  if args.kv_heads is None:
    args.kv_heads = args.heads
  ts.check_counts(args, ("layers", "model_dims", "heads", "head_dim", "kv_heads", "hidden_dims",
                         "vocab", "seq", "batch", "rounds", "block", "num_batches"))
  return args


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  return checked(parser("python -m benchmarks.llama_step",
                        "Times the Llama-family step against the Pax LM step of the same "
                        "model FLOPs, alternating, in one process.").parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  from paxlike import log

  log.setup()
  try:
    record, same = run(args)
  except UserError as e:
    ts.fail(str(e))
  print(summary(record), flush=True)
  print(json.dumps(record), flush=True)
  if not same:
    ts.fail("the two steps do not have the same FLOPs (see llama_flops, lm_flops).", 1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
