"""Decode time of a StableHLO export against paxlike's own jitted decode, plus export cost.

    python -m benchmarks.export_decode --exp=ArithmeticAdditionTiny --job_log_dir=DIR \\
        [--train_steps=20] [--batch_size=8] [--reps=30] [--set KEY=VALUE ...] \\
        [--decode_num_beams=2] [--decode_temperature=0.7] [--savedmodel]

The job's latest checkpoint (trained first with --train_steps when the job
has none) is exported in this process the way --mode=export does it
(export.describe -> exporter.check -> publish(write)), into a new
job_log_dir/export_decode_* directory unless --export_dir is given; the export time is split into
describe (abstract state, decode input), check (jax.export lowering) and
write (serialize, weights, manifest). Then the same host batch (the first
--batch_size rows of the decode input) is decoded by

  * paxlike: jax.jit(model.decode) on the restored state under the
    partitioner's context, as paxlike.evaluator runs it;
  * the export: paxlike.export.load(dir), i.e. run.py's Decoder (the
    deserialized program under jax.jit, weights from params.safetensors);

both timed from host arrays in to host token ids out, after one warm-up
call each, alternating the order. A third timing, the same jitted decode
called on host arrays outside the mesh, separates paxlike's dispatch
(global arrays, mesh context) from the program. One JSON line goes to
stdout with the medians, ratio = export / paxlike, ratio_vs_plain_jit,
whether the token ids agree, the artifact sizes and the export times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from paxlike.errors import UserError


def _time(fn: Callable[[], Any]) -> tuple[float, Any]:
  start = time.perf_counter()
  out = fn()
  return time.perf_counter() - start, out


def _sizes(path: str) -> dict[str, int]:
  sizes = {}
  for root, _, files in os.walk(path):
    for f in files:
      full = os.path.join(root, f)
      sizes[os.path.relpath(full, path)] = os.path.getsize(full)
  sizes["total"] = sum(sizes.values())
  return dict(sorted(sizes.items()))


def build(exp_name: str, overrides: Sequence[str]) -> dict[str, Any]:
  """Experiment, partitioner, task and inputs as paxlike.main builds them (one process)."""
  from paxlike import config, experiment, registry, xla_flags

  exp_cls = registry.get(exp_name)
  exp = experiment.instantiate(exp_cls, list(overrides))
  xla_flags.configure(exp)  # before anything starts a JAX backend

  import jax

  from paxlike import mesh
  from paxlike.partitioning import PmapPartitioner, SpmdPartitioner

  if exp.ICI_MESH_SHAPE is None:
    partitioner = PmapPartitioner()
  else:
    partitioner = SpmdPartitioner(mesh.build(exp.ICI_MESH_SHAPE, exp.DCN_MESH_SHAPE),
                                  rules=mesh.rules_for(exp))
  task = config.build(exp.task())
  inputs = [config.build(c) for c in exp.datasets()]
  decode_inputs = [config.build(c) for c in exp.decode_datasets()]
  for inp in [*inputs, *decode_inputs]:
    inp.bind_host(jax.process_count(), jax.process_index())
  train_input = next((i for i in inputs if i.is_training), None)
  if train_input is None:
    raise UserError(f"{exp_cls.__name__}.datasets() has no input with is_training=True.")
  return {"key": f"{exp_cls.__module__}.{exp_cls.__qualname__}", "task": task,
          "train_input": train_input, "decode_inputs": decode_inputs,
          "partitioner": partitioner}


def train(setup: dict[str, Any], job_log_dir: str) -> None:
  """A short run (NUM_TRAIN_STEPS from --train_steps) without eval, to have a checkpoint."""
  from paxlike import trainer

  os.makedirs(job_log_dir, exist_ok=True)
  options = trainer.TrainOptions(enable_summary_writer=False, async_checkpoint=False)
  trainer.train(setup["task"], setup["train_input"], setup["partitioner"], job_log_dir,
                options)


def export(setup: dict[str, Any], fmt: str, settings: Any, state: Any, step: int,
           job_log_dir: str, out: str) -> dict[str, Any]:
  """Exports one format as --mode=export does; returns its timings and sizes."""
  from paxlike import export as export_lib

  exporter = export_lib.get(fmt)
  t_describe, job = _time(lambda: export_lib.describe(
      setup["key"], setup["task"], setup["train_input"], setup["decode_inputs"], settings,
      export_lib.PLATFORMS, job_log_dir))
  t_check, plan = _time(lambda: exporter.check(job))
  params = setup["partitioner"].to_saveable(state).params
  t_write, _ = _time(lambda: export_lib.publish(
      out, lambda d: exporter.write(plan, params, step, d)))
  return {"dir": out, "describe_s": round(t_describe, 3), "check_s": round(t_check, 3),
          "write_s": round(t_write, 3), "export_s": round(t_describe + t_check + t_write, 3),
          "bytes": _sizes(out)}


def run(args: argparse.Namespace) -> dict[str, Any]:
  overrides = list(args.set)
  if args.train_steps:
    overrides += [f"NUM_TRAIN_STEPS={args.train_steps}",
                  f"CHECKPOINT_EVERY_N_STEPS={args.train_steps}"]
  setup = build(args.exp, overrides)

  import jax
  import numpy as np

  from paxlike import checkpoints, decoding, evaluator
  from paxlike import export as export_lib

  job_log_dir = os.path.abspath(args.job_log_dir)
  ckpt_dir = checkpoints.checkpoint_dir(job_log_dir)
  if not os.path.isdir(ckpt_dir) or not os.listdir(ckpt_dir):
    if not args.train_steps:
      raise UserError(f"{job_log_dir} has no checkpoint; train it first or pass "
                      "--train_steps=N to train it here.")
    train(setup, job_log_dir)
  model, partitioner = setup["task"].model, setup["partitioner"]
  state, step = evaluator.restore_for_eval(setup["task"], setup["train_input"], partitioner,
                                           job_log_dir)
  settings = decoding.DecodeSettings(
      max_decode_length=args.decode_max_length, temperature=args.decode_temperature,
      top_k=args.decode_top_k, top_p=args.decode_top_p, num_beams=args.decode_num_beams,
      **model.special_ids())
  # Beside the job's own files (a new directory each run), never in the working directory.
  root = args.export_dir or tempfile.mkdtemp(prefix="export_decode_", dir=job_log_dir)
  result: dict[str, Any] = {"exp": setup["key"], "step": step,
                            "settings": settings.record(),
                            "device": str(jax.devices()[0].platform)}
  formats = ["stablehlo"] + (["savedmodel"] if args.savedmodel else [])
  if args.savedmodel:  # timed apart: a serving pipeline pays it once, not per export
    result["tensorflow_import_s"] = round(_time(lambda: __import__("tensorflow"))[0], 3)
  for fmt in formats:
    result[fmt] = export(setup, fmt, settings, state, step, job_log_dir,
                         os.path.join(root, fmt))

  source = (setup["decode_inputs"] or [setup["train_input"]])[0]
  host = source.get_next()
  batch = {k: np.asarray(host[k][:args.batch_size]) for k in model.decode_features()}
  params = partitioner.decode_params(state)
  fn = jax.jit(lambda p, b, key: model.decode(p, b, key, settings))

  def paxlike_decode() -> np.ndarray:
    with partitioner.context():
      arrays = partitioner.decode_inputs(*batch.values())
      out = fn(params, dict(zip(batch, arrays, strict=True)), jax.random.key(0))
    return np.asarray(out.tokens)

  def plain_jit_decode() -> np.ndarray:
    # The same jitted decode on host arrays, outside the mesh: what is left of paxlike's
    # time without its dispatch (global arrays, the mesh context).
    return np.asarray(fn(params, batch, jax.random.key(0)).tokens)

  decoder = export_lib.load(result["stablehlo"]["dir"])

  def exported_decode() -> np.ndarray:
    return decoder(batch, seed=0)[0]

  t_first_pax, want = _time(paxlike_decode)
  t_first_exp, got = _time(exported_decode)
  plain_jit_decode()
  times: dict[str, list[float]] = {"paxlike": [], "exported": [], "plain_jit": []}
  for rep in range(args.reps):
    order = [("paxlike", paxlike_decode), ("exported", exported_decode),
             ("plain_jit", plain_jit_decode)]
    for name, f in order if rep % 2 == 0 else order[::-1]:
      times[name].append(_time(f)[0])
  pax, exp = statistics.median(times["paxlike"]), statistics.median(times["exported"])
  plain = statistics.median(times["plain_jit"])
  result.update({
      "batch_size": len(next(iter(batch.values()))),
      "reps": args.reps,
      "tokens_equal": bool(np.array_equal(want, got)),
      "paxlike_first_call_s": round(t_first_pax, 4),
      "exported_first_call_s": round(t_first_exp, 4),
      "paxlike_decode_s_median": pax,
      "exported_decode_s_median": exp,
      "plain_jit_decode_s_median": plain,
      "ratio": exp / pax,
      "ratio_vs_plain_jit": exp / plain,
  })
  return result


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--exp", default="ArithmeticAdditionTiny")
  parser.add_argument("--job_log_dir", required=True)
  parser.add_argument("--set", nargs="*", default=[], help="KEY=VALUE overrides")
  parser.add_argument("--train_steps", type=int, default=0,
                      help="train this many steps first when the job has no checkpoint")
  parser.add_argument("--export_dir", default=None,
                      help="default: a new job_log_dir/export_decode_* directory")
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--reps", type=int, default=30)
  parser.add_argument("--savedmodel", action="store_true",
                      help="also export (and size) the TF SavedModel")
  parser.add_argument("--decode_max_length", type=int, default=None)
  parser.add_argument("--decode_temperature", type=float, default=0.0)
  parser.add_argument("--decode_top_k", type=int, default=0)
  parser.add_argument("--decode_top_p", type=float, default=1.0)
  parser.add_argument("--decode_num_beams", type=int, default=1)
  args = parser.parse_args(argv)
  try:
    result = run(args)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
