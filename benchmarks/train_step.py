"""Step time of an experiment's train step, against a plain-JAX reference.

    python -m benchmarks.train_step --exp=LmCloudSpmdTiny --steps=50 \\
        [--set MODEL_DIMS=256 NUM_LAYERS=4 ...] [--check_equivalence]

The experiment is built as `paxlike.main` builds it (registry, --set
overrides, mesh, partitioner, fiddle build of task and datasets) and its step
is the one `paxlike.trainer.train` runs (`trainer.build_train_program`). The
reference (benchmarks/reference_lm.py) is the same model and optimizer
hand-written in JAX + optax, started from the same parameters and fed the
same batches. Both are timed in this process, alternating blocks of steps so
machine noise hits both alike, and one JSON line goes to stdout:
step_s_median, tokens_per_sec, ..., ref_step_s_median and
ratio = paxlike / reference.

Bad input (an unknown experiment, a bad --set) prints `error: ...` and exits
2; a failed --check_equivalence prints the JSON line, then `error: ...`, and
exits 1.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from paxlike.errors import UserError

DEFAULT_EXP = "LmCloudSpmdTiny"

# Relative tolerance of the first steps' loss and grad norm, by fprop dtype.
LOSS_RTOL = {"float32": 1e-4, "bfloat16": 2e-2}


# --------------------------------------------------------------------- build


@dataclass
class Setup:
  """The experiment, built as paxlike.main builds it."""

  exp_key: str
  task: Any
  train_input: Any
  partitioner: Any
  program: Any  # trainer.TrainProgram


def build(exp_name: str, overrides: Sequence[str], skip_nonfinite: bool = False) -> Setup:
  """registry -> experiment + --set -> XLA flags -> partitioner -> task, inputs -> program.

  The same sequence as paxlike.main.run (single process, PGLE off).

  Raises:
    UserError: anything main.py would reject.
  """
  from paxlike import config, experiment, registry, xla_flags

  exp_cls = registry.get(exp_name)
  exp = experiment.instantiate(exp_cls, list(overrides))
  xla_flags.configure(exp)  # before anything starts a JAX backend
  from paxlike.layers import attention_policy

  attention_policy.start_run(attention_policy.policy_from_flags(  # as main.py: Pax's switches
      getattr(exp, "USE_CUDNN_FLASH_ATTENTION", None), getattr(exp, "USE_FLASH_ATTENTION", None)))

  import jax

  from paxlike import mesh, trainer
  from paxlike.partitioning import PmapPartitioner, SpmdPartitioner

  if exp.ICI_MESH_SHAPE is None:  # as main.py: no mesh means the pmap loop
    partitioner = PmapPartitioner()
  else:
    partitioner = SpmdPartitioner(
        mesh.build(exp.ICI_MESH_SHAPE, exp.DCN_MESH_SHAPE),
        rules=mesh.rules_for(exp))
  task = config.build(exp.task())
  inputs = [config.build(c) for c in exp.datasets()]
  for inp in inputs:
    inp.bind_host(jax.process_count(), jax.process_index())
  train_inputs = [i for i in inputs if i.is_training]
  if not train_inputs:
    raise UserError(f"{exp_cls.__name__}.datasets() has no input with is_training=True.")
  program = trainer.build_train_program(task, train_inputs[0], partitioner,
                                        skip_nonfinite=skip_nonfinite)
  return Setup(f"{exp_cls.__module__}.{exp_cls.__qualname__}", task, train_inputs[0],
               partitioner, program)


def learner_view(learner: Any) -> Any:
  """The learner's settings by the knobs' names, whether it names its optimizer ('adam') or
  holds a praxis optimizer config (Pax's templates): optimizer, learning_rate, schedule,
  warmup_steps, ..., clip_gradient_norm_to_value."""
  import types

  opt = learner.optimizer
  if isinstance(opt, str):
    return learner
  sched = opt.lr_schedule
  names = {"Adam": "adam", "ShardedAdafactor": "sharded_adafactor", "ShardedSgd": "sgd"}
  return types.SimpleNamespace(
      optimizer=names.get(type(opt).__name__, type(opt).__name__),
      learning_rate=opt.learning_rate, schedule=getattr(sched, "KIND", "constant"),
      **{f: getattr(sched, f, 0) for f in ("warmup_steps", "decay_start", "decay_end")},
      min_ratio=getattr(sched, "min_ratio", 0.1), max=getattr(sched, "max", 1.0),
      **{f: getattr(opt, f, 0.0) for f in ("beta1", "beta2", "epsilon", "weight_decay")},
      clip_gradient_norm_to_value=opt.clip_gradient_norm_to_value)


def optimizer_fields(learner: Any) -> dict[str, Any]:
  """The learner's settings the references take (clip + adamw or adafactor, Pax's schedules)."""
  learner = learner_view(learner)
  if learner.optimizer not in ("adam", "adafactor"):
    raise UserError(f"the reference implements adam and adafactor, not "
                    f"OPTIMIZER={learner.optimizer!r}; pass --no-reference.")
  fields = ("optimizer", "learning_rate", "schedule", "warmup_steps", "decay_start",
            "decay_end", "min_ratio", "beta1", "beta2", "epsilon", "weight_decay",
            "clip_gradient_norm_to_value")
  return {f: getattr(learner, f) for f in fields}


def lm_ref_config(model: Any, learner: Any, layout: dict[str, Any]) -> Any:
  from benchmarks import reference_lm as ref

  if model.combine_qkv:
    raise UserError("the reference implements separate q/k/v projections; "
                    "drop COMBINE_QKV=True or pass --no-reference.")
  if model.activation not in ref.ACTIVATIONS:
    raise UserError(f"the reference has no activation {model.activation!r}; "
                    "pass --no-reference.")
  # What the reference leaves out: the model's value must be the plain one.
  plain = {"use_gated_activation": ("USE_GATED_ACTIVATION", False),
           "use_bias": ("USE_BIAS", False), "norm_policy": ("NORM_POLICY", "pre"),
           "separate_embedding": ("SEPARATE_EMBEDDING", False),
           "trainable_position_emb": ("TRAINABLE_POSITION_EMB", False),
           "dropout_prob": ("DROPOUT_PROB", 0.0),
           "embedding_lookup_style": ("EMBEDDING_LOOKUP_STYLE", "index")}
  for field, (hparam, value) in plain.items():
    if getattr(model, field) != value:
      raise UserError(f"the reference implements only {hparam}={value!r}; set it or pass "
                      "--no-reference.")
  if model.vocab_size % max(model.vocab_pad_multiple, 1):
    raise UserError("the reference has no padded vocabulary; use a VOCAB_SIZE the 'mdl' axis "
                    "divides or pass --no-reference.")
  return ref.RefConfig(
      vocab_size=model.vocab_size, model_dims=model.model_dims, num_layers=model.num_layers,
      num_heads=model.num_heads, dim_per_head=model.dim_per_head,
      hidden_dims=model.hidden_dims, dtype=model.fprop_dtype, activation=model.activation,
      use_repeated_layer=model.use_repeated_layer, checkpoint_policy=model.checkpoint_policy,
      atten_logit_cap=model.atten_logit_cap, softmax_cap_logits=model.softmax_cap_logits,
      softmax_bias=model.softmax_has_bias, per_dim_scale=model.per_dim_scale,
      **optimizer_fields(learner), **layout)


def t5_ref_config(model: Any, learner: Any, layout: dict[str, Any]) -> Any:
  from benchmarks import reference_t5 as ref

  if model.dropout_rate:
    raise UserError("the T5 reference has no dropout; --set DROPOUT_PROB=0.0 or pass "
                    "--no-reference.")
  return ref.T5RefConfig(
      vocab_size=model.vocab_size, model_dims=model.model_dims,
      num_encoder_layers=model.num_encoder_layers, num_decoder_layers=model.num_decoder_layers,
      num_heads=model.num_heads, dim_per_head=model.dim_per_head,
      hidden_dims=model.hidden_dims, activation=model.activation,
      tie_embeddings=model.tie_embeddings,
      relative_attention_num_buckets=model.relative_attention_num_buckets,
      relative_attention_max_distance=model.relative_attention_max_distance,
      layer_norm_epsilon=model.layer_norm_epsilon, dtype=model.fprop_dtype,
      use_repeated_layer=model.use_repeated_layer, checkpoint_policy=model.checkpoint_policy,
      **optimizer_fields(learner), **layout)


def llama_ref_config(model: Any, learner: Any, layout: dict[str, Any]) -> Any:
  from benchmarks import reference_llama as ref

  return ref.LlamaRefConfig(
      vocab_size=model.vocab_size, model_dims=model.model_dims, num_layers=model.num_layers,
      num_heads=model.num_heads, num_kv_heads=model.num_kv_heads, head_dim=model.head_dim,
      hidden_dims=model.hidden_dims, tie_embeddings=model.tie_embeddings,
      rope_theta=model.rope_theta, rope_scaling=model.rope_scaling,
      norm_epsilon=model.norm_epsilon, qkv_bias=model.qkv_bias, dtype=model.fprop_dtype,
      use_repeated_layer=model.use_repeated_layer, checkpoint_policy=model.checkpoint_policy,
      **optimizer_fields(learner), **layout)


# The hand-written reference of each model family: (its module, its config builder).
REFERENCES: dict[str, tuple[str, Callable[..., Any]]] = {
    "LanguageModel": ("benchmarks.reference_lm", lm_ref_config),
    "T5Model": ("benchmarks.reference_t5", t5_ref_config),
    "LlamaModel": ("benchmarks.reference_llama", llama_ref_config),
}


def reference_for(task: Any, partitioner: Any = None) -> tuple[Any, Any]:
  """(the reference module, its config) for the task's model family.

  Raises:
    UserError: the family has no reference, or uses something it does not implement.
  """
  import importlib

  family = type(task.model).__name__
  if family not in REFERENCES:
    raise UserError(f"there is no hand-written reference for {family}; pass --no-reference.")
  module, builder = REFERENCES[family]
  return importlib.import_module(module), builder(task.model, task.learner,
                                                  activation_layout(partitioner))


# paxlike's activation constraints (models/, layers/): reference kind -> logical axes.
ACTIVATION_AXES = {
    "embed": ("batch", "length", "activation_embed"),
    "heads": ("batch", "length", "activation_heads", "kv"),
    "mlp": ("batch", "length", "activation_mlp"),
    "vocab": ("batch", "length", "activation_vocab"),
}


def activation_layout(partitioner: Any) -> dict[str, Any]:
  """mesh and activation_specs for the reference: paxlike's, under its axis rules."""
  if partitioner is None or partitioner.kind != "spmd":
    return {}
  import flax.linen as nn

  specs = {kind: nn.logical_to_mesh_axes(axes, partitioner.rules)
           for kind, axes in ACTIVATION_AXES.items()}
  return {"mesh": partitioner.mesh, "activation_specs": specs}


# ------------------------------------------------------------------ runners


class Runner:
  """One side of the comparison: a step function, its state, a cycle of batches.

  Each step is timed in wall-clock seconds and in this process's CPU seconds
  (all threads): on a shared machine the second is what the step itself
  consumed, whatever else was scheduled meanwhile.
  """

  def __init__(self, name: str, step: Callable[[Any, Any], tuple[Any, Any]], state: Any,
               batches: list[Any]) -> None:
    self.name = name
    self._step = step
    self.state = state
    self.batches = batches
    self._i = 0
    self.times: list[float] = []
    self.cpu_times: list[float] = []
    self.compile_seconds = 0.0
    self.first_loss = float("nan")

  def compile(self, lower: Callable[..., Any]) -> Any:
    """Ahead-of-time compiles the step for (state, first batch); jit's cache keeps it."""
    t0 = time.perf_counter()
    compiled = lower(self.state, self.batches[0]).compile()
    self.compile_seconds = time.perf_counter() - t0
    return compiled

  def run(self) -> dict[str, Any]:
    """One step, waited for; returns its metrics (device arrays)."""
    import jax

    batch = self.batches[self._i % len(self.batches)]
    self._i += 1
    c0, t0 = time.process_time(), time.perf_counter()
    self.state, metrics = self._step(self.state, batch)
    jax.block_until_ready(metrics["loss"])  # one executable: all outputs are ready together
    self.times.append(time.perf_counter() - t0)
    self.cpu_times.append(time.process_time() - c0)
    return metrics


@dataclass
class Side:
  """paxlike's step ready to time: its build, its runner, how to lower its step."""

  setup: Setup
  runner: Runner
  lower: Callable[[Any, Any], Any]  # (state, batch) -> the step lowered for them
  key: Any  # the step's PRNG key
  host_batches: list[dict[str, Any]]  # the batches as read, before sharding


def paxlike_side(setup: Setup, name: str, num_batches: int) -> Side:
  """Reads num_batches batches (the model's features) from the setup's input, then
  makes a runner of its step over them, sharded, from the state its seed initialises."""
  import jax

  program, part, task = setup.program, setup.partitioner, setup.task
  features = task.model.input_features()
  host = [{k: b[k] for k in features}
          for b in (setup.train_input.get_next() for _ in range(num_batches))]
  key = jax.random.key(task.train.seed)
  runner = Runner(name, lambda s, b: program.step_fn(s, b, key),
                  program.init_state(task.train.seed), [part.shard_batch(b) for b in host])
  return Side(setup, runner, lambda s, b: program.step_fn.lower(s, b, key), key, host)


def time_interleaved(runners: list[Runner], steps: int, block: int) -> None:
  """`steps` timed steps per runner, alternating blocks of `block` steps.

  The order within each round flips (ABBA...), so neither side always runs
  right after the other.
  """
  for r in runners:
    r.times.clear()
    r.cpu_times.clear()
  gc.collect()
  gc.disable()
  try:
    done, rnd = 0, 0
    while done < steps:
      n = min(block, steps - done)
      for r in (runners if rnd % 2 == 0 else runners[::-1]):
        for _ in range(n):
          r.run()
      done += n
      rnd += 1
  finally:
    gc.enable()


def time_pair(base: Runner, other: Runner, args: argparse.Namespace) -> dict[str, Any]:
  """`--warmup` untimed steps each, then `--steps` alternating (time_interleaved); the
  record of the two: each one's median, first loss and compile seconds under its name,
  ratio = other / base (below 1: `other` is faster) and the median of the paired ratios."""
  for _ in range(args.warmup):
    for r in (base, other):
      r.run()
  time_interleaved([base, other], args.steps, args.block)
  record: dict[str, Any] = {}
  for r in (base, other):
    record[f"{r.name}_step_s_median"] = statistics.median(r.times)
  record["ratio"] = record[f"{other.name}_step_s_median"] / record[f"{base.name}_step_s_median"]
  record["ratio_paired_median"] = statistics.median(
      o / b for o, b in zip(other.times, base.times, strict=True))
  for r in (base, other):
    record[f"{r.name}_first_loss"] = r.first_loss
    record[f"{r.name}_compile_s"] = r.compile_seconds
  record.update(steps=args.steps, block=args.block, warmup=args.warmup)
  return record


def host_metrics(partitioner: Any, metrics: dict[str, Any]) -> dict[str, float]:
  return {k: float(v) for k, v in partitioner.unshard(metrics).items()}


# ------------------------------------------------------------ equivalence


def compare(ref_mod: Any, cfg: Any, partitioner: Any, pax: Runner, ref: Runner, steps: int,
            dtype: str) -> dict[str, Any]:
  """Runs `steps` steps on both from their current (identical) states and compares.

  Losses and grad norms must agree to LOSS_RTOL at every step; the parameters
  after the last step are reported (max |diff|, max |update|) for context.
  """
  import jax
  import numpy as np

  rtol = LOSS_RTOL.get(dtype, LOSS_RTOL["bfloat16"])
  p0 = jax.device_get(ref.state["params"])
  rows = []
  for _ in range(steps):
    mp = host_metrics(partitioner, pax.run())
    mr = {k: float(v) for k, v in jax.device_get(ref.run()).items()}
    rows.append({"loss": mp["loss"], "ref_loss": mr["loss"], "grad_norm": mp["grad_norm"],
                 "ref_grad_norm": mr["grad_norm"], "learning_rate": mp["learning_rate"],
                 "ref_learning_rate": mr["learning_rate"]})
  pax_params = ref_mod.params_from_paxlike(
      cfg, jax.device_get(partitioner.to_saveable(pax.state).params))
  ref_params = jax.device_get(ref.state["params"])
  diffs = jax.tree.leaves(jax.tree.map(
      lambda a, b: float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))),
      pax_params, ref_params))
  moved = jax.tree.leaves(jax.tree.map(
      lambda a, b: float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))),
      ref_params, p0))

  def close(a: float, b: float) -> bool:
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-6)

  passed = all(close(r["loss"], r["ref_loss"]) and close(r["grad_norm"], r["ref_grad_norm"])
               and close(r["learning_rate"], r["ref_learning_rate"]) for r in rows)
  return {"passed": passed, "rtol": rtol, "steps": rows,
          "param_max_abs_diff": max(diffs), "param_max_abs_update": max(moved)}


# ---------------------------------------------------------------------- HLO


_OP = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*.*?\s([a-z][\w\-]*)\(")


def hlo_op_counts(text: str) -> collections.Counter:
  counts: collections.Counter = collections.Counter()
  for line in text.splitlines():
    m = _OP.match(line)
    if m:
      counts[m.group(1)] += 1
  return counts


def dump_hlo(hlo_dir: str, texts: dict[str, str]) -> dict[str, Any]:
  """Writes each optimized HLO; returns total op counts and the ops whose counts differ."""
  os.makedirs(hlo_dir, exist_ok=True)
  counts = {}
  for name, text in texts.items():
    with open(os.path.join(hlo_dir, f"{name}.hlo.txt"), "w") as f:
      f.write(text)
    counts[name] = hlo_op_counts(text)
  out: dict[str, Any] = {f"{n}_ops": sum(c.values()) for n, c in counts.items()}
  if len(counts) == 2:
    (_, ca), (_, cb) = counts.items()
    out["differing_ops"] = {op: [ca[op], cb[op]] for op in sorted(set(ca) | set(cb))
                            if ca[op] != cb[op]}
  return out


# ---------------------------------------------------------------------- run


def run(args: argparse.Namespace) -> tuple[dict[str, Any], bool]:
  """Builds, compiles, times; returns (the JSON record, whether all checks passed)."""
  setup = build(args.exp, args.set, args.skip_nonfinite_steps)
  ref_mod, cfg = reference_for(setup.task, setup.partitioner) if args.reference else (None, None)

  import jax

  from paxlike import flops
  from paxlike.layers import attention_policy
  from paxlike.train_state import count_params

  task, program, part = setup.task, setup.program, setup.partitioner
  model = task.model
  features = model.input_features()
  dtype = model.compute_dtype()
  side = paxlike_side(setup, "paxlike", args.num_batches)
  pax, state, host_batches = side.runner, side.runner.state, side.host_batches
  runners = [pax]
  lowers = [side.lower]
  ref = None
  if cfg is not None:
    param_sh, batch_sh = reference_placement(part, program, cfg, ref_mod)
    # Host copies: the two sides donate their states, so they must not share buffers.
    params0 = jax.device_get(ref_mod.params_from_paxlike(
        cfg, part.to_saveable(state).params))
    params0 = jax.device_put(params0, param_sh)
    ref_state = jax.jit(lambda p: ref_mod.init_state(cfg, p))(params0)
    ref_batches = [jax.device_put(b, batch_sh) for b in host_batches]
    ref_step = ref_mod.make_train_step(cfg)
    ref = Runner("reference", ref_step, ref_state, ref_batches)
    runners.append(ref)
    lowers.append(ref_step.lower)

  compiled = {r.name: r.compile(lower) for r, lower in zip(runners, lowers, strict=True)}
  hlo = dump_hlo(args.hlo_dir, {n: c.as_text() for n, c in compiled.items()}) if (
      args.hlo_dir) else None
  del compiled

  equivalence = None
  if ref is not None and args.check_equivalence:
    # Both start from the same parameters and see the same batches.
    equivalence = compare(ref_mod, cfg, part, pax, ref, args.equivalence_steps, dtype)
  else:
    pax.first_loss = host_metrics(part, pax.run())["loss"]
    if ref is not None:
      ref.first_loss = float(ref.run()["loss"])
  for _ in range(args.warmup):
    for r in runners:
      r.run()
  time_interleaved(runners, args.steps, args.block)

  step_s = statistics.median(pax.times)
  flops_per_step = model.model_flops_per_step(program.global_specs)
  device = jax.devices()[0]
  peak = flops.peak_flops_per_device(device.device_kind, dtype)
  record: dict[str, Any] = {
      "exp": setup.exp_key,
      "step_s_median": step_s,
      "tokens_per_sec": program.tokens_per_step / step_s,
      "num_params": count_params(program.abstract.params),
      "model_flops_per_step": flops_per_step,
      "model": type(model).__name__,
      "features": {k: list(program.global_specs[k].shape[1:]) for k in features},
      "global_batch": program.global_batch,
      "fprop_dtype": dtype,
      "devices": jax.device_count(),
      "ref_step_s_median": None,
      "ratio": None,
      "attention": attention_policy.run_record(),  # what paxlike's step was lowered with
  }
  if ref is not None:
    ref_s = statistics.median(ref.times)
    record["ref_step_s_median"] = ref_s
    record["ratio"] = step_s / ref_s
    record["ratio_paired_median"] = statistics.median(
        a / b for a, b in zip(pax.times, ref.times, strict=True))
    record["cpu_s_median"] = statistics.median(pax.cpu_times)
    record["ref_cpu_s_median"] = statistics.median(ref.cpu_times)
    record["ratio_cpu"] = record["cpu_s_median"] / record["ref_cpu_s_median"]
  record.update({
      "steps": args.steps,
      "block": args.block,
      "step_s_min": min(pax.times),
      "ref_step_s_min": min(ref.times) if ref else None,
      "compile_s": pax.compile_seconds,
      "ref_compile_s": ref.compile_seconds if ref else None,
      "model_tflops_per_sec": flops_per_step / step_s / 1e12,
      "mfu": flops.mfu(flops_per_step, step_s, jax.device_count(), peak) if peak else None,
      "partitioner": part.kind,
      "platform": device.platform,
      "use_repeated_layer": model.use_repeated_layer,
      "checkpoint_policy": model.checkpoint_policy,
      "skip_nonfinite_steps": args.skip_nonfinite_steps,
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
  })
  passed = True
  if equivalence is not None:
    record["equivalence"] = equivalence
    passed = equivalence["passed"]
  elif ref is not None:
    record["first_step_loss"] = pax.first_loss
    record["ref_first_step_loss"] = ref.first_loss
  if hlo is not None:
    record["hlo"] = hlo
  return record, passed


def reference_placement(partitioner: Any, program: Any, cfg: Any, ref_mod: Any) -> tuple[Any, Any]:
  """(parameter shardings, batch sharding) for the reference.

  Under SPMD: paxlike's own parameter shardings and batch sharding. Under
  pmap: data parallel over the same devices (parameters replicated).
  """
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  if partitioner.kind == "spmd":
    shardings = partitioner.state_shardings(program.logical.params)
    return ref_mod.params_from_paxlike(cfg, shardings), partitioner.batch_sharding
  mesh = Mesh(np.asarray(partitioner.devices), ("batch",))
  return NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("batch"))


# ---------------------------------------------------------------------- CLI


class Parser(argparse.ArgumentParser):
  """The benchmarks' argument parser: a bad flag is one `error:` line, exit 2."""

  def error(self, message: str) -> NoReturn:
    fail(f"{message}.")


def fail(message: str, code: int = 2) -> NoReturn:
  """One `error: MESSAGE` line on stderr, then exit `code`."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(code)


def add_step_args(p: argparse.ArgumentParser, default_exp: str, steps: int, warmup: int) -> None:
  """The flags every step benchmark takes: the experiment, --set, the step counts."""
  p.add_argument("--exp", default=default_exp,
                 help=f"experiment: full dotted name or unique suffix (default {default_exp}).")
  p.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                 help="hyperparameter overrides, as paxlike.main's --set (repeatable).")
  p.add_argument("--steps", type=int, default=steps, help="timed steps per side.")
  p.add_argument("--warmup", type=int, default=warmup,
                 help="untimed steps per side after compilation and the first step.")
  p.add_argument("--block", type=int, default=1,
                 help="steps per side before switching to the other side.")
  p.add_argument("--num_batches", type=int, default=4,
                 help="distinct input batches, cycled (read once, before timing).")


def check_counts(args: argparse.Namespace, names: Sequence[str]) -> None:
  """Each named count at least 1 and --warmup at least 0, else one `error:` line, exit 2."""
  for name in names:
    if getattr(args, name) < 1:
      fail(f"--{name} must be at least 1, got {getattr(args, name)}.")
  if args.warmup < 0:
    fail(f"--warmup must be at least 0, got {args.warmup}.")


def print_record(run: Callable[[argparse.Namespace], dict[str, Any]],
                 args: argparse.Namespace) -> int:
  """A benchmark's main: paxlike's log, run(args), its record as one JSON line; 0.

  A UserError (what paxlike.main would refuse) is one `error:` line, exit 2.
  """
  from paxlike import log

  log.setup()
  try:
    record = run(args)
  except UserError as e:
    fail(str(e))
  print(json.dumps(record), flush=True)
  return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  p = Parser(prog="python -m benchmarks.train_step",
             description="Times an experiment's train step against a plain-JAX reference.")
  add_step_args(p, DEFAULT_EXP, steps=20, warmup=2)
  p.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True,
                 help="also time the plain-JAX reference (benchmarks/reference_lm.py).")
  p.add_argument("--check_equivalence", action="store_true",
                 help="from identical parameters, the first steps' losses and grad norms "
                      "of paxlike and the reference must agree; exit 1 if not.")
  p.add_argument("--equivalence_steps", type=int, default=3,
                 help="steps compared by --check_equivalence.")
  p.add_argument("--skip_nonfinite_steps", action="store_true",
                 help="time the step paxlike.main --skip_nonfinite_steps runs.")
  p.add_argument("--hlo_dir", default=None,
                 help="write both optimized HLOs here; op counts go into the JSON line.")
  args = p.parse_args(argv)
  check_counts(args, ("steps", "block", "num_batches", "equivalence_steps"))
  if args.check_equivalence and not args.reference:
    fail("--check_equivalence needs the reference; drop --no-reference.")
  return args


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  from paxlike import log

  log.setup()
  try:
    record, passed = run(args)
  except UserError as e:
    fail(str(e))
  print(json.dumps(record), flush=True)
  if not passed:
    fail("the reference and paxlike disagree on the first steps (see 'equivalence').", 1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
