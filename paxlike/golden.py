"""Golden records: what every shipped experiment means, one reviewable text file each.

A record (tests/golden/<ExperimentName>.txt) holds one `key = value` line
per field, in a fixed order: the UPPERCASE hyperparameters (as repr), the
task and input configs after derivation (hidden dims, heads, per-host
batch ...), the model family and parameter count, parameter and
optimizer-state bytes per device on the experiment's own mesh, model FLOPs
per step, the mesh and the logical-axis rules in force, and the input
features with the global batch.

Everything is abstract: shapes come from `jax.eval_shape`, per-device bytes
from the logical partition specs, the mesh rules and the mesh axis sizes
(arithmetic, no Mesh is built), so the 1T model costs what the tiny one
costs and the records do not depend on this process's device count.

    python -m paxlike.golden            # compare; print what moved, exit 1 if anything did
    python -m paxlike.golden --update   # rewrite every record (after an intended change)
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RECORD_DIR = Path(__file__).resolve().parent.parent / "tests" / "golden"
UPDATE_COMMAND = "python -m paxlike.golden --update"
# A pmap experiment (no mesh) is recorded as run on this many devices of one host.
PMAP_DEVICES = 8
# An input that cannot be built in this environment (an optional extra such as seqio
# is not installed): the fields that need its shapes are left out of the record,
# and not compared while either side lacks them.
UNAVAILABLE = "unavailable here"
INPUT_DEPENDENT = ("input.", "model.", "bytes_per_device.", "flops.")
# The compiled step's peak bytes per device (the dry run's XLA CPU compile) of each
# pod-scale experiment, one field per JAX release (XLA's buffer assignment moves by
# more than 10% between releases: LmCloudSpmd128B is 28.6 GiB on JAX 0.10 and 25.5
# on 0.12): compiled by `--compile-all` under that release (minutes for the set),
# carried over by a plain --update, and compared with a relative tolerance within
# the release.
COMPILED_PREFIX = "compiled.peak_bytes_per_device"


def compiled_field() -> str:
  """The compiled-peak field of the running JAX release, e.g. `...[jax 0.10]`."""
  import jax

  return f"{COMPILED_PREFIX}[jax {'.'.join(jax.__version__.split('.')[:2])}]"


COMPILE_TOLERANCE = 0.10
COMPILE_COMMAND = "python -m paxlike.golden --compile-all --update"
POD_PARAMS = 10**9  # SPMD experiments from a billion parameters up, or on more than 8 devices
HEADER = f"# Golden record; regenerate with `{UPDATE_COMMAND}` and review the diff.\n"


# ------------------------------------------------------------------ records


def shipped_keys() -> list[str]:
  """Registry keys of every experiment the shipped `experiments` package registers."""
  from paxlike import registry

  registry.import_shipped()
  return [k for k in registry.list_names()
          if k.startswith(registry.SHIPPED_PACKAGE + ".")]


def record_names(keys: list[str]) -> dict[str, str]:
  """key -> record file stem: the class name, or the full key where class names collide."""
  leaves: dict[str, int] = {}
  for k in keys:
    leaves[k.rsplit(".", 1)[1]] = leaves.get(k.rsplit(".", 1)[1], 0) + 1
  return {k: k.rsplit(".", 1)[1] if leaves[k.rsplit(".", 1)[1]] == 1 else k for k in keys}


@contextlib.contextmanager
def _devices_per_host(n: int) -> Iterator[None]:
  """jax.local_device_count() and device_count() answer n: one host holds the whole mesh.

  Templates derive the per-host batch from the local device count; the
  record fixes it to the mesh's size (as the dry run does), so the global
  batch is the experiment's own and not this process's.
  """
  import jax

  saved = jax.local_device_count, jax.device_count
  jax.local_device_count = lambda *a, **k: n
  jax.device_count = lambda *a, **k: n
  try:
    yield
  finally:
    jax.local_device_count, jax.device_count = saved


def _show(value: Any) -> str:
  """A stable repr: dtypes by name, classes and functions by qualified name."""
  import numpy as np

  from paxlike.experiment import _is_dtype_like

  if _is_dtype_like(value):
    return np.dtype(value).name
  if isinstance(value, type) or callable(value):
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    return f"{getattr(value, '__module__', '?')}.{name}"
  if isinstance(value, set | frozenset):  # set order follows string hashing, which varies
    return "{" + ", ".join(sorted(repr(v) for v in value)) + "}"
  text = repr(value)
  return text if " at 0x" not in text else f"<{type(value).__qualname__}>"


def _config_lines(cfg: Any, prefix: str) -> dict[str, str]:
  from paxlike import config

  out = {}
  for line in config.flattened(cfg, prefix).splitlines():
    # fiddle writes `path: annotation = value`; annotations print differently across
    # Python versions, so only the path and the value are kept.
    left, _, value = line.partition(" = ")
    value = value.strip()
    out[left.split(":", 1)[0].strip()] = value if " at 0x" not in value else "<object>"
  return out


def _mesh_axis_sizes(exp: Any) -> tuple[dict[str, int], bool]:
  """({mesh axis: size}, is_spmd); a pmap experiment counts as PMAP_DEVICES replicas."""
  from paxlike import experiment
  from paxlike import mesh as mesh_lib
  from paxlike.dry_run import mesh_size

  if experiment.is_pmap(exp):
    return dict(zip(mesh_lib.MESH_AXES, (1, PMAP_DEVICES, 1), strict=True)), False
  shape, _ = mesh_size(exp)
  return dict(zip(mesh_lib.axis_names(exp), shape, strict=True)), True


def _bytes_per_device(abstract: Any, logical: Any, rules: Any, axes: dict[str, int]
                      ) -> tuple[int, list[str]]:
  """(bytes one device holds, leaves whose dims the mesh does not divide), arithmetically."""
  import flax.linen as nn
  import jax
  import numpy as np
  from jax.sharding import PartitionSpec

  leaves, _ = jax.tree_util.tree_flatten_with_path(abstract)
  specs = jax.tree.leaves(logical, is_leaf=lambda x: isinstance(x, PartitionSpec))
  total, uneven = 0, []
  for (path, leaf), spec in zip(leaves, specs, strict=True):
    mesh_spec = nn.logical_to_mesh_axes(tuple(spec), rules) if rules is not None else ()
    shard = list(leaf.shape)
    for i, names in enumerate(tuple(mesh_spec or ())):
      if names is None or i >= len(shard):
        continue
      ways = math.prod(axes[a] for a in ((names,) if isinstance(names, str) else names))
      if shard[i] % ways:
        uneven.append(f"{jax.tree_util.keystr(path)} dim {i} ({shard[i]}) over {ways}")
      shard[i] = -(-shard[i] // ways)
    total += math.prod(shard) * np.dtype(leaf.dtype).itemsize
  return total, uneven


def _model_flops(model: Any, specs: dict[str, Any]) -> str:
  try:
    return repr(float(model.model_flops_per_step(specs)))
  except NotImplementedError:
    return f"n/a ({type(model).__name__} has no model_flops_per_step formula)"
  except Exception as e:  # noqa: BLE001  (a new family's formula may not fit these specs)
    return f"n/a ({type(model).__name__}.model_flops_per_step: {type(e).__name__}: {e})"


def compute(key: str) -> dict[str, str]:
  """The record of one registered experiment: field -> value, in the record's order."""
  from paxlike import experiment as experiment_lib
  from paxlike import mesh as mesh_lib
  from paxlike import registry
  from paxlike.dry_run import input_specs

  cls = registry.get(key)
  exp = experiment_lib.instantiate(cls)
  axes, spmd = _mesh_axis_sizes(exp)
  n = math.prod(axes.values())
  rec: dict[str, str] = {"experiment": key}
  for h in experiment_lib.hparams(exp):
    rec[f"hparam.{h.name}"] = _show(h.value)
  with _devices_per_host(n):
    task_cfg = exp.task()
    dataset_cfgs = exp.datasets()
  rec.update(_config_lines(task_cfg, "task"))
  for i, ds in enumerate(dataset_cfgs):
    rec.update(_config_lines(ds, f"datasets[{i}]"))

  rec["mesh.kind"] = "spmd" if spmd else f"pmap (recorded on {PMAP_DEVICES} devices)"
  rec["mesh.shape"] = repr(axes)
  rec["mesh.num_devices"] = repr(n)
  rules = mesh_lib.rules_for(exp) if spmd else None
  if spmd:
    for name, mesh_axes in rules:
      rec[f"mesh.rule.{name}"] = repr(mesh_axes)
  else:
    rec["mesh.rules"] = "n/a (pmap replicates the state)"

  train = [c for c in dataset_cfgs if getattr(c, "is_training", True)]
  if not train:
    rec["input"] = "n/a (datasets() has no input with is_training=True)"
    return rec
  global_batch = train[0].batch_size
  shards = math.prod(axes[a] for a in mesh_lib.batch_axes(tuple(axes)))
  rec["batch.global"] = repr(global_batch)
  rec["batch.per_host"] = f"{global_batch} (one host holding all {n} devices)"
  rec["batch.per_batch_shard"] = repr(global_batch / shards if global_batch % shards
                                      else global_batch // shards)
  try:
    specs = input_specs(train[0])
  except Exception as e:  # noqa: BLE001  (e.g. an optional input library is not installed)
    rec["input"] = f"{UNAVAILABLE} ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
    return rec
  for name in sorted(specs):
    rec[f"input.feature.{name}"] = f"{tuple(specs[name].shape)} {specs[name].dtype}"

  try:
    _model_and_state(rec, task_cfg, specs, rules, axes)
  except NotImplementedError as e:  # a family that does not meet the whole model contract yet
    rec["model.state"] = f"n/a (NotImplementedError: {e})"
  return rec


_STATE_CACHE: dict[str, tuple[Any, Any]] = {}


def _abstract_state(model: Any, tx: Any, sample_batch: dict[str, Any]) -> tuple[Any, Any]:
  """(abstract state, logical specs) as train_state.logical_specs gives, tracing the model once.

  The model's init is traced once (logical_specs traces it twice, once boxed
  and once inside the state's init): a 32-layer model without a layer scan
  costs seconds per trace on this machine.
  """
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec

  from paxlike import train_state as ts

  boxed = jax.eval_shape(lambda: ts.init_params(model, jax.random.key(0), sample_batch))
  params = nn.unbox(boxed)
  opt_state = jax.eval_shape(tx.init, params)
  opt_specs = ts.opt_state_specs(
      tx, opt_state, nn.get_partition_spec(boxed), params,
      lambda slot, spec, param: spec if getattr(slot, "shape", None) == param.shape
      else PartitionSpec())
  step = jax.ShapeDtypeStruct((), jnp.int32)
  return (ts.TrainState(step=step, params=params, opt_state=opt_state),
          ts.TrainState(step=PartitionSpec(), params=nn.get_partition_spec(boxed),
                        opt_state=opt_specs))


def _model_and_state(rec: dict[str, str], task_cfg: Any, specs: dict[str, Any], rules: Any,
                     axes: dict[str, int]) -> None:
  """Adds the model family, parameter count, bytes per device and model FLOPs to rec."""
  from paxlike import config
  from paxlike import train_state as ts

  task = config.build(task_cfg)
  model = task.model
  rec["model.family"] = f"{type(model).__module__}.{type(model).__qualname__}"
  # Experiments that differ only in cadence or mesh share their model's trace.
  cache_key = "".join(f"{k}={v};" for k, v in rec.items() if k.startswith(
      ("model.family", "task.model.", "task.learner.", "input.feature.")))
  if cache_key not in _STATE_CACHE:
    _STATE_CACHE[cache_key] = _abstract_state(model, task.learner.transform(),
                                              model.init_batch(specs))
  abstract, logical = _STATE_CACHE[cache_key]
  rec["model.params"] = repr(ts.count_params(abstract.params))
  for part in ("params", "opt_state"):
    nbytes, uneven = _bytes_per_device(getattr(abstract, part), getattr(logical, part),
                                       rules, axes)
    rec[f"bytes_per_device.{part}"] = repr(nbytes)
    if uneven:
      rec[f"bytes_per_device.{part}.uneven"] = "; ".join(uneven)
  rec["flops.model_per_step"] = _model_flops(model, specs)


def render(rec: dict[str, str]) -> str:
  return HEADER + "".join(f"{k} = {v}\n" for k, v in rec.items())


def parse(text: str) -> dict[str, str]:
  out = {}
  for line in text.splitlines():
    if not line or line.startswith("#"):
      continue
    key, _, value = line.partition(" = ")
    out[key] = value
  return out


# -------------------------------------------------------------- comparing


def diff(old: dict[str, str], new: dict[str, str]) -> list[str]:
  """'field: old -> new' for each field that moved, appeared or went away."""
  if any(r.get("input", "").startswith(UNAVAILABLE) for r in (old, new)):
    old, new = ({k: v for k, v in r.items() if k != "input" and not k.startswith(INPUT_DEPENDENT)}
                for r in (old, new))
  out = []
  for k in list(old) + [k for k in new if k not in old]:
    if k.startswith(COMPILED_PREFIX):
      if k in new and k in old and not within_tolerance(old[k], new[k]):
        out.append(f"{k}: {old[k]} -> {new[k]} (over the {COMPILE_TOLERANCE:.0%} tolerance)")
      continue  # compared only where both sides compiled (--compile-all)
    if k not in new:
      out.append(f"{k}: {old[k]} -> (gone)")
    elif k not in old:
      out.append(f"{k}: (new) -> {new[k]}")
    elif old[k] != new[k]:
      out.append(f"{k}: {old[k]} -> {new[k]}")
  return out


def within_tolerance(old: str, new: str) -> bool:
  a, b = int(old.split()[0]), int(new.split()[0])
  return abs(b - a) <= COMPILE_TOLERANCE * max(a, 1)


def is_pod_scale(rec: dict[str, str]) -> bool:
  """Too large to train on a CPU: SPMD, and a billion parameters or more than 8 devices."""
  if rec.get("mesh.kind") != "spmd" or "model.params" not in rec:
    return False
  return int(rec["model.params"]) >= POD_PARAMS or int(rec["mesh.num_devices"]) > PMAP_DEVICES


def compiled_peak(key: str) -> int:
  """The compiled train step's peak bytes per device, from `--mode=dry_run` in a subprocess.

  A subprocess because the dry run needs as many fake CPU devices as the
  experiment's mesh, and a JAX process fixes its device count when it starts.
  """
  import json
  import subprocess
  import tempfile

  with tempfile.TemporaryDirectory() as job:
    proc = subprocess.run(
        [sys.executable, "-m", "paxlike.main", f"--exp={key}", f"--job_log_dir={job}",
         "--mode=dry_run", "--target=tpu_v4"], capture_output=True, text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"}, cwd=RECORD_DIR.parent.parent)
    if proc.returncode:
      raise RuntimeError(f"the dry run of {key} failed (exit {proc.returncode}):\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    with open(os.path.join(job, "dry_run.json")) as f:
      return int(json.load(f)["compiled_memory_per_device"]["peak"])


def compiled_value(peak: int) -> str:
  return f"{peak} (~{peak / 2**30:.2f} GiB; within {COMPILE_TOLERANCE:.0%} matches)"


def pod_scale_keys(keys: list[str] | None = None) -> list[str]:
  """The shipped experiments whose dry run the golden records keep (sorted)."""
  keys = shipped_keys() if keys is None else keys
  _STATE_CACHE.clear()
  return [k for k in keys if is_pod_scale(compute(k))]


def recorded_pod_scale_keys(record_dir: Path = RECORD_DIR) -> list[str]:
  """pod_scale_keys() read from the records (seconds cheaper; the golden test keeps them true)."""
  keys = shipped_keys()
  names = record_names(keys)
  return [k for k in keys if (record_dir / f"{names[k]}.txt").exists()
          and is_pod_scale(parse((record_dir / f"{names[k]}.txt").read_text()))]


def rotating_subset(keys: list[str], day: int, per_day: int = 1) -> list[str]:
  """per_day of keys, a different slice each day, covering all of them every len/per_day days."""
  if not keys:
    return []
  start = (day * per_day) % len(keys)
  return [keys[(start + i) % len(keys)] for i in range(min(per_day, len(keys)))]


def check_compiled(keys: list[str], record_dir: Path = RECORD_DIR
                   ) -> tuple[dict[str, list[str]], list[str]]:
  """Dry-runs keys and compares their compiled peak with the records' (tolerance).

  Returns:
    ({record name: [moved field]}, names whose record has no compiled peak yet).
  """
  names = record_names(shipped_keys())
  moved, missing = {}, []
  for key in keys:
    old = parse((record_dir / f"{names[key]}.txt").read_text()) if (
        record_dir / f"{names[key]}.txt").exists() else {}
    field = compiled_field()
    if field not in old:
      missing.append(names[key])
      continue
    changes = diff({field: old[field]}, {field: compiled_value(compiled_peak(key))})
    if changes:
      moved[names[key]] = changes
  return moved, missing


def check(keys: list[str] | None = None, record_dir: Path = RECORD_DIR
          ) -> tuple[dict[str, list[str]], list[str], list[str]]:
  """Compares experiments with their records.

  Returns:
    ({record name: moved fields}, names with no record, record files of
    experiments no longer registered).
  """
  keys = shipped_keys() if keys is None else keys
  names = record_names(keys)
  _STATE_CACHE.clear()  # shared within one check only: code may have changed since
  moved, missing = {}, []
  for key in keys:
    path = record_dir / f"{names[key]}.txt"
    if not path.exists():
      missing.append(names[key])
      continue
    try:
      changes = diff(parse(path.read_text()), compute(key))
    except Exception as e:  # noqa: BLE001  (name the experiment; go on with the others)
      changes = [f"(the record cannot be computed: {type(e).__name__}: {e})"]
    if changes:
      moved[names[key]] = changes
  stale = sorted(p.name for p in record_dir.glob("*.txt") if p.stem not in names.values())
  return moved, missing, stale


def report(moved: dict[str, list[str]], missing: list[str], stale: list[str]) -> str:
  """The human-readable result of check(), with the command that accepts the change."""
  lines = []
  for name, changes in moved.items():
    lines.append(f"{name}: {len(changes)} field(s) moved")
    lines.extend(f"  {c}" for c in changes)
  if missing:
    lines.append(f"no golden record for: {', '.join(missing)}")
  if stale:
    lines.append(f"records of experiments no longer registered: {', '.join(stale)}")
  if lines:
    lines.append(f"if these changes are intended, run `{UPDATE_COMMAND}` and review the diff "
                 f"of {RECORD_DIR.relative_to(RECORD_DIR.parent.parent)}/.")
  return "\n".join(lines)


def update(record_dir: Path = RECORD_DIR, compile_all: bool = False,
           compile_missing: bool = False) -> list[str]:
  """Rewrites every record and removes those of unregistered experiments; the names written.

  A pod-scale experiment's compiled peak is dry-run anew with compile_all
  (with compile_missing, only where the running release has none), and
  otherwise carried over from its old record.
  """
  record_dir.mkdir(parents=True, exist_ok=True)
  keys = shipped_keys()
  names = record_names(keys)
  _STATE_CACHE.clear()
  for key in keys:
    path = record_dir / f"{names[key]}.txt"
    try:
      rec = compute(key)
    except Exception as e:
      raise RuntimeError(f"the golden record of {key} cannot be computed: {e}") from e
    if is_pod_scale(rec):
      old = parse(path.read_text()) if path.exists() else {}
      # Every release's peaks are kept; --compile-all (re)compiles the running one's.
      rec.update({k: v for k, v in old.items() if k.startswith(COMPILED_PREFIX)})
      if compile_all or (compile_missing and compiled_field() not in rec):
        print(f"dry run: {names[key]}", flush=True)
        rec[compiled_field()] = compiled_value(compiled_peak(key))
    path.write_text(render(rec))
  for p in record_dir.glob("*.txt"):
    if p.stem not in names.values():
      p.unlink()
  return [names[k] for k in keys]


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m paxlike.golden", description=__doc__.split(
      "\n")[0])
  parser.add_argument("--update", action="store_true",
                      help="rewrite every record (after an intended change), then review the diff")
  parser.add_argument("--compile-all", action="store_true",
                      help="also dry-run every pod-scale experiment (minutes) and compare (or, "
                      "with --update, record) its compiled peak bytes per device")
  parser.add_argument("--compile-missing", action="store_true",
                      help="with --update, dry-run only the pod-scale experiments whose record "
                      "has no compiled peak for this JAX release (a new experiment)")
  args = parser.parse_args(argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  if args.update:
    written = update(compile_all=args.compile_all, compile_missing=args.compile_missing)
    print(f"wrote {len(written)} records under {RECORD_DIR}")
    return 0
  moved, missing, stale = check()
  if args.compile_all:
    compiled_moved, no_peak = check_compiled(pod_scale_keys())
    for name, changes in compiled_moved.items():
      moved.setdefault(name, []).extend(changes)
    if no_peak:
      print(f"no compiled peak recorded for: {', '.join(no_peak)} (run `{COMPILE_COMMAND}`)")
  text = report(moved, missing, stale)
  print(text or f"all {len(shipped_keys())} records match")
  return 1 if text else 0


if __name__ == "__main__":
  sys.exit(main())
