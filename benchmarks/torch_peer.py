"""paxlike's train step against a PyTorch user's own: transformers, same shape, same process.

    python -m benchmarks.torch_peer --exp=Llama32_1B [--set KEY=VALUE ...] [--steps=10]
        [--warmup=3] [--block=1] [--compile | --no-compile]

The paxlike side is the step `paxlike.trainer` runs, built as `paxlike.main`
builds it (benchmarks.train_step.build). The peer is what a PyTorch user
would write for the same model: the transformers model of the same shape
(LlamaForCausalLM or Qwen2ForCausalLM from the model's own Hugging Face
config, T5ForConditionalGeneration likewise, GPT2LMHeadModel for Pax's LM:
pre-LayerNorm, non-gated FFN, tied embeddings), scaled-dot-product attention
(`sdpa`), autocast to the experiment's FPROP_DTYPE over float32 weights,
AdamW (fused on a GPU) with the learner's rate, betas, epsilon and weight
decay, gradient clipping where the learner clips, and torch.compile on the
model (on by default on a GPU, off on a CPU, where inductor's C++ build takes
minutes). Both sides are fed the same batches, started from their own random
initialisations, compiled and warmed up, then timed in alternating blocks
(ABBA) in one process; JAX does not preallocate the GPU, so both fit.

One JSON line: both step-time medians, ratio = paxlike / peer (below 1:
paxlike is faster), both MFUs from paxlike's model FLOPs of the shape
(docs/mfu.md), both parameter counts, and what the peer ran. The peer
trains with AdamW whatever the experiment's optimizer (FlanT5's is
Adafactor): `optimizer` in the line says so.

Needs torch and transformers (`pip install -e '.[test]'` under Python 3.11
installs both); without them it says so in one line and exits 2, as for any
bad input.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks import train_step as ts
from paxlike.errors import UserError

MISSING = ("the PyTorch peer needs torch and transformers: pip install -e '.[test]' "
           "(Python 3.11), or pip install torch transformers")


def peer_config(model: Any) -> tuple[str, dict[str, Any]]:
  """(transformers architecture, config dict) of the paxlike model's shape.

  Raises:
    UserError: the model has no transformers counterpart of the same shape.
  """
  family = type(model).__name__
  if family in ("LlamaModel", "T5Model"):
    config = model.hf_config()
    return config["architectures"][0], config
  if family != "LanguageModel":
    raise UserError(f"there is no transformers peer for {family}.")
  if model.num_heads * model.dim_per_head != model.model_dims:
    raise UserError("GPT-2 has heads x dims per head = model dims; this LM has "
                    f"{model.num_heads} x {model.dim_per_head} != {model.model_dims}.")
  if model.use_gated_activation or model.norm_type != "layernorm":
    raise UserError("the LM's peer is GPT-2 (LayerNorm, a non-gated FFN); this LM sets "
                    "USE_GATED_ACTIVATION or RMSNorm: time the Llama family instead.")
  activations = {"gelu": "gelu_new", "relu": "relu", "silu": "silu"}
  if model.activation not in activations:
    raise UserError(f"GPT-2 has no activation {model.activation!r}.")
  return "GPT2LMHeadModel", {
      "model_type": "gpt2", "vocab_size": model.vocab_size, "n_embd": model.model_dims,
      "n_layer": model.num_layers, "n_head": model.num_heads, "n_inner": model.hidden_dims,
      "activation_function": activations[model.activation], "n_positions": 1,  # set per batch
      "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
      "layer_norm_epsilon": model.layernorm_epsilon, "tie_word_embeddings": True,
      "bos_token_id": model.eos_id, "eos_token_id": model.eos_id}


class Peer:
  """The PyTorch side: model, optimizer and the step, on `device`."""

  def __init__(self, architecture: str, config: dict[str, Any], learner: Any, dtype: str,
               device: str, compile_model: bool, seq_len: int) -> None:
    import torch
    import transformers

    config = dict(config)
    if config.get("model_type") == "gpt2":
      config["n_positions"] = seq_len
    model_type = config.pop("model_type")
    hf_config = transformers.AutoConfig.for_model(model_type, **config)
    hf_config.use_cache = False
    torch.manual_seed(0)
    model = getattr(transformers, architecture)._from_config(
        hf_config, attn_implementation="sdpa").to(device)
    model.train()
    self.params = sum(p.numel() for p in model.parameters())
    self.is_t5 = architecture.startswith("T5")
    self.device = device
    self.autocast = None if dtype == "float32" else getattr(torch, dtype)
    self.clip = float(learner.clip_gradient_norm_to_value or 0.0)
    self.optimizer = torch.optim.AdamW(
        model.parameters(), lr=learner.learning_rate, betas=(learner.beta1, learner.beta2),
        eps=learner.epsilon, weight_decay=learner.weight_decay,
        fused=device.startswith("cuda"))
    self.model = torch.compile(model) if compile_model else model

  def batch(self, host_batch: dict[str, Any]) -> dict[str, Any]:
    import torch

    out = {}
    for k, v in host_batch.items():
      t = torch.from_numpy(v)
      out[k] = t.to(self.device, dtype=torch.float32 if "weight" in k else torch.long)
    return out

  def _loss(self, batch: dict[str, Any]) -> Any:
    import torch

    if self.is_t5:  # padded inputs (id 0) masked, as paxlike masks them
      inputs = batch["encoder_input_tokens"]
      logits = self.model(input_ids=inputs, attention_mask=(inputs != 0).long(),
                          decoder_input_ids=batch["decoder_input_tokens"]).logits
      labels, weights = batch["decoder_target_tokens"], batch["decoder_loss_weights"]
    else:
      logits = self.model(input_ids=batch["ids"]).logits
      labels, weights = batch["labels"], batch["weights"]
    # As transformers' own loss: the logits upcast to float32, labels already shifted.
    losses = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    return (losses * weights.reshape(-1)).sum() / weights.sum().clamp(min=1.0)

  def step(self, state: Any, batch: dict[str, Any]) -> tuple[Any, dict[str, float]]:
    import torch

    self.optimizer.zero_grad(set_to_none=True)
    if self.autocast is None:
      loss = self._loss(batch)
    else:
      with torch.autocast(self.device.split(":")[0], dtype=self.autocast):
        loss = self._loss(batch)
    loss.backward()
    if self.clip > 0:
      torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip, foreach=True)
    self.optimizer.step()
    return state, {"loss": loss.item()}  # .item() waits for the step, as the JAX side waits


def run(args: argparse.Namespace) -> dict[str, Any]:
  try:
    import torch
    import transformers
  except ImportError as e:
    raise UserError(MISSING) from e
  setup = ts.build(args.exp, args.set)

  import jax

  from paxlike import flops
  from paxlike.train_state import count_params

  task, program, part = setup.task, setup.program, setup.partitioner
  model = task.model
  architecture, config = peer_config(model)
  dtype = model.compute_dtype()
  jax_device = jax.devices()[0]
  device = "cuda" if jax_device.platform == "gpu" and torch.cuda.is_available() else "cpu"
  compile_model = args.compile if args.compile is not None else device == "cuda"

  side = ts.paxlike_side(setup, "paxlike", args.num_batches)
  pax, host_batches = side.runner, side.host_batches
  seq_len = max(v.shape[-1] for v in host_batches[0].values())
  pax.compile(side.lower)
  peer = Peer(architecture, config, ts.learner_view(task.learner), dtype, device,
              compile_model, seq_len)
  peer_runner = ts.Runner("peer", peer.step, None, [peer.batch(b) for b in host_batches])
  pax.first_loss = ts.host_metrics(part, pax.run())["loss"]
  peer_runner.first_loss = peer_runner.run()["loss"]  # torch.compile compiles here
  peer_runner.compile_seconds = peer_runner.times[0]
  for _ in range(args.warmup):
    pax.run()
    peer_runner.run()
  ts.time_interleaved([pax, peer_runner], args.steps, args.block)

  pax_s, peer_s = statistics.median(pax.times), statistics.median(peer_runner.times)
  flops_per_step = model.model_flops_per_step(program.global_specs)
  peak, peak_source = flops.resolve_peak(jax.local_devices(), dtype)  # a CPU: calibrated
  n = jax.device_count()

  def mfu(step_s: float) -> float | None:
    return flops.mfu(flops_per_step, step_s, n, peak) if peak else None

  return {
      "exp": setup.exp_key,
      "device": jax_device.device_kind,
      "step_s_median": pax_s,
      "peer_step_s_median": peer_s,
      "ratio": pax_s / peer_s,
      "ratio_paired_median": statistics.median(
          a / b for a, b in zip(pax.times, peer_runner.times, strict=True)),
      "tokens_per_sec": program.tokens_per_step / pax_s,
      "peer_tokens_per_sec": program.tokens_per_step / peer_s,
      "mfu": mfu(pax_s),
      "peer_mfu": mfu(peer_s),
      "model_flops_per_step": flops_per_step,
      "peak_flops_per_device": peak,
      "peak_source": peak_source,
      "num_params": count_params(program.abstract.params),
      "peer_num_params": peer.params,
      "first_step_loss": pax.first_loss,
      "peer_first_step_loss": peer_runner.first_loss,
      "compile_s": pax.compile_seconds,
      "peer_first_step_s": peer_runner.compile_seconds,
      "fprop_dtype": dtype,
      "use_repeated_layer": model.use_repeated_layer,
      "checkpoint_policy": model.checkpoint_policy,
      "optimizer": {"paxlike": ts.learner_view(task.learner).optimizer,
                    "peer": "AdamW (fused)" if device == "cuda" else "AdamW"},
      "peer": {"model": f"transformers {transformers.__version__} {architecture}",
               "torch": torch.__version__, "device": device, "attention": "sdpa",
               "autocast": None if dtype == "float32" else dtype,
               "torch_compile": compile_model},
      "steps": args.steps,
      "block": args.block,
  }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  p = ts.Parser(prog="python -m benchmarks.torch_peer",
                description="Times an experiment's train step against its transformers "
                            "peer (same shape) in one process.")
  ts.add_step_args(p, "LlamaTiny", steps=10, warmup=3)
  p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                 help="torch.compile the peer (default: on a GPU only).")
  args = p.parse_args(argv)
  ts.check_counts(args, ("steps", "block", "num_batches"))
  return args


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  # Both frameworks share the GPU: JAX must not take 75% of it up front.
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  return ts.print_record(run, args)


if __name__ == "__main__":
  raise SystemExit(main())
