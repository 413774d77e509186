"""--mode=dry_run: will this experiment fit its pod? Answered on a CPU.

Nothing is allocated: the train state is abstract (jax.eval_shape), the
batch is shapes only, and the train step is lowered and compiled by XLA's
SPMD partitioner for the experiment's own mesh, on fake CPU devices (the
command re-executes itself with --xla_force_host_platform_device_count set
to the mesh size). Reported per device: parameter and optimizer-state bytes
(exact, from their shardings), the compiled step's memory analysis, FLOPs
per step (analytic model FLOPs vs XLA's count), and whether that fits the
memory of a target device.

The compiled numbers come from XLA's CPU compiler: buffer assignment,
fusion and bf16 handling differ from the TPU/GPU compilers (no
latency-hiding scheduler, which on accelerators holds extra buffers), so
the peak is an estimate; the state bytes are exact.
"""

from __future__ import annotations

import copy
import enum
import json
import math
import os
import sys
import time
from typing import Any

from paxlike import log as logging
from paxlike.errors import UserError

GIB = 1 << 30
MIB = 1 << 20
# Memory per device. GPUs: nvidia-smi's total; a run gets the fraction the GPU
# preset gives JAX (XLA_PYTHON_CLIENT_MEM_FRACTION), TPUs all of their HBM.
TARGETS: dict[str, dict[str, Any]] = {
    "tpu_v4": {"bytes": 32 * GIB, "usable": 1.0, "name": "TPU v4 (32 GiB HBM)"},
    "tpu_v5e": {"bytes": 16 * GIB, "usable": 1.0, "name": "TPU v5e (16 GiB HBM)"},
    "tpu_v5p": {"bytes": 95 * GIB, "usable": 1.0, "name": "TPU v5p (95 GiB HBM)"},
    "tpu_v6e": {"bytes": 32 * GIB, "usable": 1.0, "name": "TPU v6e (32 GiB HBM)"},
    "a100": {"bytes": 81920 * MIB, "usable": 0.85, "name": "A100 80GB"},
    "h100": {"bytes": 81559 * MIB, "usable": 0.85, "name": "H100 80GB"},
    "h200": {"bytes": 143771 * MIB, "usable": 0.85, "name": "H200 141GB"},
}
DEVICE_FLAG = "--xla_force_host_platform_device_count"


def _jaxlib_before(*version: int) -> bool:
  from importlib import metadata

  installed = tuple(int(p) for p in metadata.version("jaxlib").split(".")[:2])
  return installed < version


# XLA's CPU compiler has no native bf16 matmul: it converts a scanned layer
# stack's saved bf16 activations to f32 and hoists that convert out of the
# loop, a whole f32 copy of every layer's activations that no TPU/GPU compile
# makes (+27 GiB per device on C4Spmd16BAdam32Replicas). Loop-invariant code
# motion is off for the dry run's compile.
# Under jaxlib 0.10 and 0.11 XLA's CPU scheduler favours concurrency over memory: in an
# unrolled stack it starts every layer's weight all-gather (the weights split over 'data')
# at once and keeps them all live, which no memory-aware TPU/GPU scheduler does (+2.2 GiB
# per layer on bert.py's BertSpmdL33H12kBiggerBatch: a 198 GiB peak per device instead of
# 77). The dry run compiles with the memory-minimising scheduler there; jaxlib 0.12's
# default does not do it (a scanned stack was never affected).
CPU_COMPILE_FLAGS = ("--xla_disable_hlo_passes=while-loop-invariant-code-motion",
                     *(("--xla_cpu_enable_concurrency_optimized_scheduler=false",)
                       if _jaxlib_before(0, 12) else ()))
REEXEC_MARK = "PAXLIKE_DRY_RUN_REEXEC"


def mesh_size(exp: Any) -> tuple[list[int], int]:
  """(the combined ICI x DCN mesh shape, its device count)."""
  from paxlike import experiment

  if experiment.is_pmap(exp):
    raise UserError("--mode=dry_run checks SPMD experiments; this one has ICI_MESH_SHAPE=None "
                    "(pmap): set ICI_MESH_SHAPE, e.g. --set ICI_MESH_SHAPE=[1,8,1].")
  ici = list(exp.ICI_MESH_SHAPE)
  dcn = list(exp.DCN_MESH_SHAPE or [1] * len(ici))
  shape = [i * d for i, d in zip(ici, dcn, strict=True)]
  return shape, math.prod(shape)


def _env_device_count(environ: dict[str, str]) -> int | None:
  for token in environ.get("XLA_FLAGS", "").split():
    if token.startswith(DEVICE_FLAG + "="):
      return int(token.split("=", 1)[1])
  return None


def ensure_fake_devices(n: int) -> None:
  """Makes this process one with n fake CPU devices, re-executing it if need be.

  Raises:
    UserError: a backend already started with another device count.
  """
  from paxlike import xla_flags

  env = dict(os.environ)
  flags = env.get("XLA_FLAGS", "").split()
  ready = (env.get("JAX_PLATFORMS", "") == "cpu" and _env_device_count(env) == n
           and all(f in flags for f in CPU_COMPILE_FLAGS))
  if xla_flags.backend_started():
    import jax

    if jax.default_backend() == "cpu" and jax.device_count() >= n:
      return  # in-process (tests): the compile flags are whatever this process has
    raise UserError(f"the dry run needs {n} CPU devices but this process already runs "
                    f"{jax.device_count()} {jax.default_backend()} devices; run it as its own "
                    "command.")
  if ready:
    return
  if env.get(REEXEC_MARK):
    raise UserError(f"could not start {n} fake CPU devices (XLA_FLAGS={env.get('XLA_FLAGS')!r}).")
  kept = [f for f in flags if not f.startswith(DEVICE_FLAG) and f not in CPU_COMPILE_FLAGS]
  env["XLA_FLAGS"] = " ".join([*kept, *CPU_COMPILE_FLAGS, f"{DEVICE_FLAG}={n}"])
  env["JAX_PLATFORMS"] = "cpu"
  env[REEXEC_MARK] = "1"
  logging.info("dry run: restarting with %d fake CPU devices", n)
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def _bytes_per_device(tree: Any) -> int:
  """Bytes one device holds of a tree of ShapeDtypeStructs with shardings."""
  import jax
  import numpy as np

  total = 0
  for leaf in jax.tree.leaves(tree):
    shard = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    total += math.prod(shard) * np.dtype(leaf.dtype).itemsize
  return total


def input_specs(dataset_cfg: Any, model: Any = None) -> dict[str, Any]:
  """Shapes and dtypes of a training input's global batch, reading one row only.

  Pod-scale batches (thousands of rows) are never generated: the input is
  built with batch_size=1, and the leading dim scaled back up. A wrapper's
  config (Pax's LingvoInputAdaptor) is read as the input it wraps. With the
  model, the input is checked against it first (and takes what it needs from
  it, as a training run's does).
  """
  import jax

  from paxlike import config, experiment

  dataset_cfg = experiment.input_config(dataset_cfg)
  global_batch = dataset_cfg.batch_size
  one = copy.deepcopy(dataset_cfg)
  one.batch_size = 1
  inp = config.build(one)
  inp.bind_host(1, 0)
  if model is not None:
    inp.check_model(model)
  return {k: jax.ShapeDtypeStruct((global_batch, *v.shape[1:]), v.dtype)
          for k, v in inp.peek_specs().items()}


def analyse(exp: Any) -> dict[str, Any]:
  """Compiles the train step abstractly on the current devices; the report's numbers."""
  import jax
  import numpy as np
  from jax.sharding import Mesh

  from paxlike import config, experiment, flops
  from paxlike import memory as memory_lib
  from paxlike import mesh as mesh_lib
  from paxlike import train_state as ts
  from paxlike.partitioning import SpmdPartitioner
  from paxlike.steps import check_step_batch, make_train_step

  shape, n = mesh_size(exp)
  devices = jax.devices()[:n]
  # One process stands in for every slice/host: DCN folds into the mesh axes.
  axes = mesh_lib.axis_names(exp)
  device_mesh = Mesh(np.asarray(devices).reshape(shape), axes)
  partitioner = SpmdPartitioner(
      device_mesh, rules=mesh_lib.rules_for(exp))
  task = config.build(experiment.task_config(exp))  # with --set a.b=V applied
  train_cfgs = [c for c in experiment.call_user(exp, "datasets")
                if getattr(c, "is_training", True)]
  if not train_cfgs:
    raise UserError(f"{type(exp).__name__}.datasets() has no input with is_training=True.")
  specs = input_specs(train_cfgs[0], task.model)
  global_batch = next(iter(specs.values())).shape[0]
  check_step_batch(task.model, partitioner, global_batch, task.train.num_microbatches)

  tx = task.learner.transform()
  t0 = time.perf_counter()
  abstract, logical = ts.logical_specs(task.model, tx, task.model.init_batch(specs))
  partitioner.set_state_specs(logical)
  state = partitioner.abstract_state(abstract)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=partitioner.batch_sharding)
           for k, v in specs.items()}
  key = jax.eval_shape(lambda: jax.random.key(0))
  step_fn = partitioner.compile(make_train_step(task.model, tx, task.learner.lr_schedule(),
                                                partitioner.reduce,
                                                num_microbatches=task.train.num_microbatches,
                                                reduce_sum=partitioner.reduce_sum))
  try:
    lowered = step_fn.lower(state, batch, key)
  except ValueError as e:  # a dim the mesh does not divide (jax names the array and dim)
    raise UserError(f"the train state does not shard over the mesh {shape}: "
                    f"{str(e).splitlines()[0]}; change the mesh or pad that dimension.") from None
  t_lower = time.perf_counter() - t0
  t0 = time.perf_counter()
  compiled = lowered.compile()
  t_compile = time.perf_counter() - t0

  memory = memory_lib.step_memory(compiled)
  hw = flops.hardware_flops(step_fn, (state, batch, key), n, compiled=compiled)
  model_flops = task.model.model_flops_per_step(specs)
  return {
      "mesh": dict(zip(axes, shape, strict=True)),
      "ici_mesh_shape": list(exp.ICI_MESH_SHAPE),
      "dcn_mesh_shape": list(exp.DCN_MESH_SHAPE) if exp.DCN_MESH_SHAPE else None,
      "num_devices": n,
      "global_batch": int(global_batch),
      "features": {k: list(v.shape[1:]) for k, v in specs.items()},
      "compute_dtype": task.model.compute_dtype(),
      "training_optimized_sharding": bool(exp.TRAINING_OPTIMIZED_SHARDING),
      # Pax's count: rows padding a table to the mesh (LanguageModel) are not parameters.
      "params": ts.count_params(abstract.params) - task.model.padding_params(),
      "bytes_per_device": {
          "params": _bytes_per_device(state.params),
          "opt_state": _bytes_per_device(state.opt_state),
          "state": _bytes_per_device(state),
      },
      "compiled_memory_per_device": memory,
      "flops_per_step": {
          "model_analytic": model_flops,
          "model_source": task.model.flops_source(),
          "hardware_compiled": hw.total if hw else None,
          "xla_cost_analysis": hw.xla_flops if hw else None,
          "loop_correction": hw.loop_correction if hw else None,
          "hardware_over_model": (hw.total / model_flops) if hw and model_flops else None,
      },
      "seconds": {"trace_and_lower": t_lower, "compile": t_compile},
      "pipeline": flops.pipeline_schedule(task.model,
                                          global_batch // task.train.num_microbatches),
  }


def fits(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
  """Per target: usable bytes, the fraction the compiled peak uses, and whether it fits."""
  need = report["compiled_memory_per_device"]["peak"]
  out = {}
  for name, t in TARGETS.items():
    usable = int(t["bytes"] * t["usable"])
    out[name] = {"device": t["name"], "usable_bytes": usable, "used_fraction": need / usable,
                 "fits": need <= usable}
  return out


def _gib(b: float) -> str:
  return f"{b / GIB:,.2f} GiB"


def format_table(report: dict[str, Any], target: str) -> str:
  """The human-readable report."""
  mem = report["compiled_memory_per_device"]
  fl = report["flops_per_step"]
  by = report["bytes_per_device"]
  t = report["fits"][target]
  rows = [
      ("experiment", report["experiment"]),
      (f"mesh ({', '.join(report['mesh'])})", f"{list(report['mesh'].values())} = "
       f"{report['num_devices']} devices (ICI {report['ici_mesh_shape']}, "
       f"DCN {report['dcn_mesh_shape']})"),
      ("global batch x features", f"{report['global_batch']} x "
       + ", ".join(f"{k} {v}" for k, v in report["features"].items())
       + f" ({report['compute_dtype']})"),
      ("parameters", f"{report['params']:,} ({report['params'] / 1e9:.2f} B)"),
      ("params / device", _gib(by["params"])),
      ("optimizer state / device", _gib(by["opt_state"])),
      ("compiled: arguments / device", _gib(mem["argument"])),
      ("compiled: temporaries / device", _gib(mem["temp"])),
      ("compiled: peak / device", _gib(mem["peak"])),
      (f"model FLOPs / step ({fl['model_source']})", f"{fl['model_analytic']:.4g}"
       if fl["model_analytic"] else "n/a"),
      ("hardware FLOPs / step (compiled)", f"{fl['hardware_compiled']:.4g}"
       f" ({fl['hardware_over_model']:.2f}x model)" if fl["hardware_over_model"] else "n/a"),
      ("lower / compile seconds", f"{report['seconds']['trace_and_lower']:.1f} / "
       f"{report['seconds']['compile']:.1f}"),
      (f"fits {target}", f"{'YES' if t['fits'] else 'NO'}: {100 * t['used_fraction']:.0f}% of "
       f"{_gib(t['usable_bytes'])} usable on {t['device']}"),
  ]
  after_peak = [k for k, _ in rows].index("compiled: peak / device") + 1
  rows[after_peak:after_peak] = _pipeline_rows(report)
  width = max(len(k) for k, _ in rows)
  lines = [f"{k:<{width}}  {v}" for k, v in rows]
  others = [name for name, f in report["fits"].items() if f["fits"]]
  lines.append(f"{'fits on':<{width}}  {', '.join(others) if others else 'none of the targets'}")
  return "\n".join(lines)


def _pipeline_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
  """The table's pipeline lines: the schedule and its bubble (nothing without a pipeline)."""
  p = report.get("pipeline")
  if not p:
    return []
  from paxlike import flops

  return [
      ("pipeline schedule", f"{flops.schedule_name(p)}: {flops.stages_text(p)}, "
       f"{flops.microbatches_text(p)}"
       f"{', stream_io' if p['stream_io'] else ''}"),
      ("pipeline iterations / bubble", f"{p['iterations']} / {100 * p['bubble_fraction']:.1f}% "
       "of each stage's iterations idle ((S-1)/(M x R + S-1)); MFU counts model FLOPs only"),
      ("pipeline in-flight memory", "included in the compiled peak above (every iteration's "
       "stage inputs, saved for the backward pass, and the io buffer of all microbatches)"),
      ("pipeline stage memory", _stage_memory(p)),
  ]


def _stage_memory(p: dict[str, Any]) -> str:
  """What an iteration's backward pass holds of its stage's activations."""
  if p["layer_remat"]:
    return "one layer's activations at a time in an iteration's backward pass"
  if not p["iteration_remat"]:
    return ("every layer's activations of every iteration (CHECKPOINT_POLICY=SAVE_EVERYTHING "
            "rematerialises nothing)")
  return ("every layer's of the stage at once in an iteration's backward pass; a scanned stage "
          "(USE_REPEATED_LAYER=True) holds one layer's at a time when CHECKPOINT_POLICY "
          "rematerialises, for one more forward pass of each layer")


def _plain(value: Any) -> Any:
  """A --set value as JSON holds it: an enum's value (Pax's AutodiffCheckpointType), a
  dtype's or class's name; lists, numbers, strings and None as they are."""
  if isinstance(value, enum.Enum):
    return value.value
  if isinstance(value, list | tuple):
    return [_plain(v) for v in value]
  if value is None or isinstance(value, bool | int | float | str):
    return value
  return getattr(value, "__name__", str(value))


def run(exp: Any, job_log_dir: str, target: str, layouts: bool = False,
        overrides: list[str] | tuple[str, ...] = ()) -> int:
  """The dry-run command: arranges the devices, analyses, writes dry_run.json, prints.

  layouts: also compile every candidate layout of --mode=tune (the run's --set
  values are `overrides`) and write their memory table to job_log_dir/dry_run/.
  """
  if target not in TARGETS:
    raise UserError(f"--target={target} is not one of {', '.join(TARGETS)}.")
  _, n = mesh_size(exp)
  ensure_fake_devices(n)
  report = {"experiment": f"{type(exp).__module__}.{type(exp).__qualname__}",
            "overrides": {k: _plain(v) for k, v in exp.overrides.items()}, "target": target}
  report.update(analyse(exp))
  report["fits"] = fits(report)
  report["xla_flags"] = os.environ.get("XLA_FLAGS", "")
  report["note"] = ("state bytes are exact (from the shardings); compiled memory and FLOPs "
                    "come from XLA's CPU compiler and estimate what a TPU/GPU compile needs")
  with open(os.path.join(job_log_dir, "dry_run.json"), "w") as f:
    json.dump(report, f, indent=2, sort_keys=True)
    f.write("\n")
  print(format_table(report, target))
  print(f"report: {os.path.join(job_log_dir, 'dry_run.json')}")
  _layouts(exp, job_log_dir, report, target, layouts, overrides)
  return 0


def _layouts(exp: Any, job_log_dir: str, report: dict[str, Any], target: str, wanted: bool,
             overrides: list[str] | tuple[str, ...]) -> None:
  """--dry_run_layouts: --mode=tune's candidate layouts, each compiled as above; untimed."""
  from paxlike import tune

  if not wanted:
    print("layouts: --dry_run_layouts also compiles the other step layouts (scanned or "
          "unrolled, each remat policy) and tables their memory per device")
    return
  tune.untimed_table(exp, list(overrides), job_log_dir, report["fits"][target]["usable_bytes"],
                     lambda e: analyse(e)["compiled_memory_per_device"]["peak"],
                     configured_peak=report["compiled_memory_per_device"]["peak"])
