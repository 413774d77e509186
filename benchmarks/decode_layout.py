"""Decoding a scanned model as itself against decoding it as its unrolled twin.

    python -m benchmarks.decode_layout [--family=lm|llama|t5] [--size=small|base]
        [--beams=1] [--batch=8] [--prompt=32] [--steps=128] [--repeats=3]
        [--dtype=float32|bfloat16]

paxlike decodes a scanned (or pipelined) model as decoding.decoding_model's
twin: the same weights with the layers unrolled, so each layer's KV cache is
an array a decode step writes in place, where the scanned stack slices every
layer's cache out and stacks it back at every step. This times the jitted
decode of both on the same weights (random, no EOS, so every decode runs all
--steps positions), medians over --repeats calls after one warm-up call,
alternating the two so machine noise hits both alike, and prints one JSON
line: scanned_s, unrolled_s, ratio = unrolled / scanned, each side's compile
seconds and whether the two generated the same ids.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.beam_cost import SIZES as T5_SIZES
from paxlike import decoding
from paxlike.models.language_model import LanguageModel
from paxlike.models.llama import LlamaModel
from paxlike.models.t5 import T5Model

# Decoder-only shapes beside beam_cost's T5 ones: a CPU-sized stack, and FlanT5Base's widths.
SIZES = {
    "small": dict(vocab_size=4096, model_dims=256, num_layers=4, num_heads=4, head_dim=64,
                  hidden_dims=683),
    "base": dict(vocab_size=32128, model_dims=768, num_layers=12, num_heads=12, head_dim=64,
                 hidden_dims=2048),
}


def build(family: str, size: str, dtype: Any, batch: int, prompt: int, steps: int
          ) -> tuple[Any, dict[str, jax.Array]]:
  """The scanned model of the family and a decode batch of `batch` rows."""
  rng = np.random.default_rng(0)
  if family == "t5":
    model = T5Model(**T5_SIZES[size], fprop_dtype=dtype, max_target_len=steps,
                    use_repeated_layer=True)
    tokens = rng.integers(2, model.vocab_size, (batch, prompt))
    return model, {"encoder_input_tokens": jnp.asarray(tokens, jnp.int32),
                   "decoder_input_tokens": jnp.zeros((batch, steps), jnp.int32),
                   "decoder_target_tokens": jnp.zeros((batch, steps), jnp.int32),
                   "decoder_loss_weights": jnp.ones((batch, steps), jnp.float32)}
  s = SIZES[size]
  common = dict(vocab_size=s["vocab_size"], model_dims=s["model_dims"],
                num_layers=s["num_layers"], num_heads=s["num_heads"],
                hidden_dims=s["hidden_dims"], fprop_dtype=dtype, use_repeated_layer=True)
  if family == "lm":
    model = LanguageModel(dim_per_head=s["head_dim"], **common)
  else:  # grouped-query attention, a key/value head per 4 query heads where they divide
    kv = s["num_heads"] // 4 if s["num_heads"] % 4 == 0 else s["num_heads"]
    model = LlamaModel(head_dim=s["head_dim"], num_kv_heads=kv, max_seq_len=prompt + steps,
                       **common)
  ids = rng.integers(2, s["vocab_size"], (batch, prompt + steps))
  return model, {"ids": jnp.asarray(ids, jnp.int32),
                 "prompt_lens": jnp.full((batch,), prompt, jnp.int32)}


def _timed(fn: Any, *args: Any) -> tuple[float, Any]:
  t = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return time.perf_counter() - t, out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--family", choices=("lm", "llama", "t5"), default="lm")
  parser.add_argument("--size", choices=sorted(SIZES), default="small")
  parser.add_argument("--beams", type=int, default=1)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--prompt", type=int, default=32,
                      help="prompt tokens (T5: encoder input tokens)")
  parser.add_argument("--steps", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  args = parser.parse_args()
  if min(args.beams, args.batch, args.prompt, args.steps, args.repeats) < 1:
    parser.error("--beams, --batch, --prompt, --steps and --repeats must be at least 1")
  model, batch = build(args.family, args.size, jnp.dtype(args.dtype), args.batch, args.prompt,
                       args.steps)
  if args.family == "t5":
    params = jax.jit(model.init)(jax.random.key(1), batch)["params"]
  else:
    params = jax.jit(lambda k: model.init(k, jnp.zeros((1, 4), jnp.int32)))(
        jax.random.key(1))["params"]
  params = nn.meta.unbox(params)
  twin, twin_params = decoding.decoding_model(model, params)
  # eos_id -1 is never emitted: every decode runs all steps.
  settings = decoding.DecodeSettings(eos_id=-1, num_beams=args.beams)
  sides = {}
  for name, m, p in (("scanned", model, params), ("unrolled", twin, twin_params)):
    fn = jax.jit(lambda p, b, m=m: m.decode(p, b, jax.random.key(0), settings))
    compile_s, out = _timed(fn, p, batch)
    sides[name] = (fn, p, compile_s, np.asarray(out.tokens))
  times: dict[str, list[float]] = {name: [] for name in sides}
  for _ in range(args.repeats):
    for name, (fn, p, _, _) in sides.items():
      times[name].append(_timed(fn, p, batch)[0])
  scanned, unrolled = (statistics.median(times[n]) for n in ("scanned", "unrolled"))
  print(json.dumps({
      "device": jax.devices()[0].device_kind, "family": args.family, "size": args.size,
      "batch": args.batch, "prompt": args.prompt, "steps": args.steps, "beams": args.beams,
      "dtype": args.dtype, "scanned_s": round(scanned, 4), "unrolled_s": round(unrolled, 4),
      "ratio": round(unrolled / scanned, 2),
      "first_call_s": {n: round(s[2], 1) for n, s in sides.items()},
      "same_ids": bool((sides["scanned"][3] == sides["unrolled"][3]).all())}))


if __name__ == "__main__":
  main()
