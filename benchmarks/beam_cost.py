"""What beam search costs against greedy decoding, on the current device.

    python -m benchmarks.beam_cost [--size=small|base] [--beams=4] [--repeats=5]
        [--batch=8] [--input_len=256] [--steps=32] [--all_caches]

Times the jitted decode of a T5 (random weights, no EOS, so every decode
runs all --steps positions) greedily and with --beams beams, medians over
--repeats calls after a warm-up call, alternating the two so machine noise
hits both alike, and prints one JSON line: greedy_s, beam_s and
ratio = beam / greedy.

--all_caches reorders every cache leaf each step and holds the encoder's
keys/values once per beam, as paxlike did before: the beam ratio of the old
way, in the same process, for comparison.

--profile_dir=DIR then traces one more call of each with jax.profiler
(DIR/greedy, DIR/beam, each with the compiled decode's HLO) and writes
paxlike's per-op summary of each trace to DIR/greedy.json and DIR/beam.json
(the JSON line gets both splits): where beam search's extra time goes, op by op.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from paxlike import decoding
from paxlike.models.t5 import T5Model

SIZES = {
    # A CPU-sized T5 with FlanT5Base's proportions (d_ff = 2.67 d, 64-dim heads).
    "small": dict(vocab_size=4096, model_dims=256, num_encoder_layers=4, num_decoder_layers=4,
                  num_heads=4, dim_per_head=64, hidden_dims=683),
    "base": dict(vocab_size=32128, model_dims=768, num_encoder_layers=12, num_decoder_layers=12,
                 num_heads=12, dim_per_head=64, hidden_dims=2048),
}


def decode_fn(model: T5Model, settings: decoding.DecodeSettings, all_caches: bool) -> Any:
  """The jitted decode; all_caches: the old way (every leaf expanded and reordered)."""
  key = jax.random.key(0)

  def run(params: Any, batch: dict[str, jax.Array]) -> decoding.DecodeOutput:
    if not all_caches:
      return model.decode(params, batch, key, settings)
    start, variables = model.apply({"params": params}, batch, settings, method="prefill",
                                   mutable=["cache"])

    def extend(cache, tokens, index):
      logits, mutated = model.apply({"params": params, "cache": cache}, tokens, index,
                                    method="extend", mutable=["cache"])
      return logits, mutated["cache"]

    return decoding.generate(extend, variables["cache"], start, settings, key,
                             gather_cache=model.gather_cache,
                             expand_cache=model.gather_cache, reorder_cache=model.gather_cache)

  return jax.jit(run)


def _time(fn: Any, *args: Any) -> float:
  t = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - t


def profile(fn: Any, out_dir: str, *args: Any) -> dict[str, Any]:
  """One call of fn traced into out_dir; paxlike's per-op summary of it (also as out_dir.json)."""
  from paxlike import profiler

  hlo = fn.lower(*args).compile().as_text()  # what each fusion in the summary holds
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, profiler.HLO_FILE), "w") as f:
    f.write(hlo)
  jax.profiler.start_trace(out_dir)
  with jax.profiler.StepTraceAnnotation("decode", step_num=1):
    jax.block_until_ready(fn(*args))
  jax.profiler.stop_trace()
  summary = profiler.summarize(profiler.load_trace(profiler.latest_trace(out_dir)),
                               profiler.fused_dots(hlo), top=25)
  with open(out_dir + ".json", "w") as f:
    json.dump(summary, f, indent=1)
  return summary["mean"]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--size", choices=sorted(SIZES), default="small")
  parser.add_argument("--beams", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--input_len", type=int, default=256)
  parser.add_argument("--steps", type=int, default=32)
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  parser.add_argument("--all_caches", action="store_true",
                      help="reorder every cache leaf per step (paxlike's old beam search)")
  parser.add_argument("--profile_dir", default=None,
                      help="trace one more greedy and beam call each and summarise them here")
  args = parser.parse_args()
  if args.beams < 2 or args.repeats < 1 or min(args.batch, args.input_len, args.steps) < 1:
    parser.error("--beams must be at least 2; --repeats, --batch, --input_len and --steps "
                 "at least 1")
  model = T5Model(**SIZES[args.size], fprop_dtype=jnp.dtype(args.dtype),
                  max_target_len=args.steps)
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, SIZES[args.size]["vocab_size"], (args.batch, args.input_len))
  batch = {"encoder_input_tokens": jnp.asarray(tokens, jnp.int32),
           "decoder_input_tokens": jnp.zeros((args.batch, args.steps), jnp.int32),
           "decoder_target_tokens": jnp.zeros((args.batch, args.steps), jnp.int32),
           "decoder_loss_weights": jnp.ones((args.batch, args.steps), jnp.float32)}
  params = jax.jit(model.init)(jax.random.key(1), batch)["params"]
  # eos_id -1 is never emitted: every decode runs all steps, as a worst case.
  greedy = decode_fn(model, decoding.DecodeSettings(eos_id=-1), args.all_caches)
  beam = decode_fn(model, decoding.DecodeSettings(eos_id=-1, num_beams=args.beams),
                   args.all_caches)
  _time(greedy, params, batch)
  _time(beam, params, batch)
  greedy_s, beam_s = [], []
  for _ in range(args.repeats):
    greedy_s.append(_time(greedy, params, batch))
    beam_s.append(_time(beam, params, batch))
  g, b = statistics.median(greedy_s), statistics.median(beam_s)
  result = {"device": jax.devices()[0].device_kind, "size": args.size,
            "batch": args.batch, "input_len": args.input_len, "steps": args.steps,
            "beams": args.beams, "dtype": args.dtype, "all_caches": args.all_caches,
            "greedy_s": round(g, 4), "beam_s": round(b, 4), "ratio": round(b / g, 2)}
  if args.profile_dir:
    result["profile_ms"] = {
        name: profile(fn, os.path.join(args.profile_dir, name), params, batch)
        for name, fn in (("greedy", greedy), ("beam", beam))}
  print(json.dumps(result))


if __name__ == "__main__":
  main()
