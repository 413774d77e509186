"""Shared test setup: 8 fake CPU devices, CLI and in-process run helpers.

XLA_FLAGS must be set before JAX is imported anywhere, so this module sets
it at import time and imports nothing from JAX at the top.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

DEVICE_FLAG = "--xla_force_host_platform_device_count"
NUM_FAKE_DEVICES = 8


def with_xla_flag(flags: str, flag: str, value: object | None) -> str:
  """flags with every setting of `flag` dropped, then `flag=value` added (unless None)."""
  kept = [f for f in flags.split() if not f.startswith(flag)]
  return " ".join(kept + ([] if value is None else [f"{flag}={value}"]))


def xla_flags_with_devices(n: int, base: str | None = None) -> str:
  """base's XLA flags with the fake-device count replaced by n."""
  base = os.environ.get("XLA_FLAGS", "") if base is None else base
  return with_xla_flag(base, DEVICE_FLAG, n)


# XLA's CPU backend with LLVM's optimisations off (the HLO passes, and so the programs'
# sharding, fusion and memory, are unchanged): the suite's tiny programs compile about
# a third faster and run about half as fast, and most tests compile far more than they
# run (a quarter less CPU time over a sample of the suite). The numbers are close to the
# optimised backend's, not bitwise equal, so no test compares one level with the other.
# A test that trains for hundreds of steps asks for the optimised backend
# (run_cli(optimized=True)), at which its thresholds were measured.
OPT_LEVEL_FLAG = "--xla_backend_optimization_level"
# JAX 0.10's XLA (what Python 3.11 installs) still has its older CPU fusion emitters.
# With them, the suite's level-0 programs compile in about half the time (LmCloudSpmdTiny's
# train step 1.6-2.0 s against 3.8-4.4 s; FlanT5Tiny's 3.7-4.5 s against 5.0-5.8 s), with
# the same losses and step times. At the default optimisation level its steps run 10-40%
# slower, so run_cli(optimized=True) drops it. JAX 0.12's XLA has no such flag, and XLA
# aborts on a flag it does not know, so it is set only where jaxlib is older than 0.11.
LEGACY_FUSION_FLAG = "--xla_cpu_use_fusion_emitters"


def _jaxlib_version() -> tuple[int, ...]:
  from importlib import metadata  # reads the installed version without importing jaxlib

  try:
    return tuple(int(p) for p in re.findall(r"\d+", metadata.version("jaxlib"))[:2])
  except metadata.PackageNotFoundError:
    return ()


_JAXLIB = _jaxlib_version()
LEGACY_FUSION = bool(_JAXLIB) and _JAXLIB < (0, 11)

os.environ["XLA_FLAGS"] = xla_flags_with_devices(NUM_FAKE_DEVICES, with_xla_flag(
    with_xla_flag(os.environ.get("XLA_FLAGS", ""), OPT_LEVEL_FLAG, 0),
    LEGACY_FUSION_FLAG, "false" if LEGACY_FUSION else None))
# The suite is written for fake CPU devices, even on a machine with an accelerator.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# On a GPU (pytest -m gpu) the test process and the CLI runs it starts share one
# device; with JAX's default preallocation (75% of it) the first to start would leave
# the others too little to start at all.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

REPO_ROOT = Path(__file__).resolve().parent.parent

# One persistent JAX compilation cache for the suite: the test process and every
# paxlike process it starts. Most tests compile the same tiny programs again (each
# CLI run, each in-process trainer.train builds new jitted functions), and a cache
# hit skips XLA's compile (about a second a program on 2 cores).
# PAXLIKE_TESTS_COMPILE_CACHE=DIR keeps it between runs of the suite.
if os.environ.get("PAXLIKE_TESTS_COMPILE_CACHE"):
  COMPILE_CACHE = Path(os.environ["PAXLIKE_TESTS_COMPILE_CACHE"])
else:
  COMPILE_CACHE = Path(tempfile.mkdtemp(prefix="paxlike_tests_jax_cache_"))
  atexit.register(shutil.rmtree, COMPILE_CACHE, True)
# Set before JAX is imported, like XLA_FLAGS; subprocesses inherit it.
os.environ.update({"JAX_COMPILATION_CACHE_DIR": str(COMPILE_CACHE),
                   "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                   "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"})


# CI runs this suite under Python 3.11 (JAX 0.10) and 3.12 (JAX 0.12) side by side on
# two cores. The end-to-end runs of Pax's own files (marker one_python, about 450 s of a
# suite) test how paxlike reads those files, which no JAX release changes; the code they
# run is the trainer, inputs and checkpoints the rest of the suite runs under both. Each
# runs under one of CI's two Pythons, the one its marker names: most under 3.11, whose
# JAX compiles the suite's programs faster (LEGACY_FUSION above), so that the two suites
# take about as long (the 3.12 suite ran 60 min to 3.11's 44 with all of them under 3.12).
# Any other Python runs them all; PAXLIKE_TESTS_EVERY_PYTHON=1 runs them everywhere.
CI_PYTHONS = ("3.11", "3.12")


def pytest_collection_modifyitems(config, items):
  here = f"{sys.version_info[0]}.{sys.version_info[1]}"
  if here not in CI_PYTHONS or os.environ.get("PAXLIKE_TESTS_EVERY_PYTHON"):
    return
  for item in items:
    marker = item.get_closest_marker("one_python")
    if marker and marker.args[0] != here:
      item.add_marker(pytest.mark.skip(
          reason=f"an end-to-end run of Pax's files: CI runs it under Python {marker.args[0]} "
                 "(PAXLIKE_TESTS_EVERY_PYTHON=1 runs it here)"))


def subprocess_env(devices: int = 1, optimized: bool = False) -> dict[str, str]:
  """The environment of a paxlike subprocess: this one's (the shared compile cache
  included) with `devices` fake devices; optimized: XLA's CPU backend at its default
  optimisation level, for a run whose steps cost more than its compiles."""
  flags = xla_flags_with_devices(devices)
  if optimized:
    flags = with_xla_flag(with_xla_flag(flags, OPT_LEVEL_FLAG, None), LEGACY_FUSION_FLAG, None)
  return dict(os.environ, XLA_FLAGS=flags)


TINY = "LmCloudSpmdTiny"
TINY_KEY = "experiments.lm.lm_cloud.LmCloudSpmdTiny"
TRAINED_RE = re.compile(
    r"trained steps (\d+)\.\.(\d+): loss ([\d.]+) \(step (\d+)\) -> ([\d.]+) \(step (\d+)\)")


@contextlib.contextmanager
def registrations_undone():
  """Unregisters what the block registers. The shipped experiments are imported first, so
  they stay: a module that registered inside the block and stays in sys.modules would not
  register again, and a later test would find its names gone."""
  from paxlike import registry

  registry.import_shipped()
  before = set(registry.list_names())
  try:
    yield
  finally:
    for key in set(registry.list_names()) - before:
      registry.unregister(key)


def run_cli(args: list[str], cwd: Path, devices: int = 1, script: bool = False,
            pythonpath: list[Path] = (), timeout: float = 240, optimized: bool = False
            ) -> subprocess.CompletedProcess:
  """Runs `python -m paxlike.main ARGS` (or `python paxlike/main.py`) in a subprocess
  (optimized: see subprocess_env)."""
  env = subprocess_env(devices, optimized)
  # This checkout's paxlike, whatever an editable install of the venv points at.
  pythonpath = [*pythonpath, REPO_ROOT]
  if pythonpath:
    extra = os.pathsep.join(str(p) for p in pythonpath)
    env["PYTHONPATH"] = extra + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  entry = [str(REPO_ROOT / "paxlike" / "main.py")] if script else ["-m", "paxlike.main"]
  return subprocess.run([sys.executable, *entry, *args], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=timeout)


def cuda_only() -> list:
  """A GPU test module's pytestmark: marker `gpu`, skipped without a CUDA GPU."""
  import pytest

  from paxlike.layers import attention

  reason = "needs a CUDA GPU (JAX_PLATFORMS=cuda python -m pytest -m gpu)"
  return [pytest.mark.gpu,
          pytest.mark.skipif(attention.lowering_platform() != "cuda", reason=reason)]


@pytest.fixture
def key_mask_fold():
  """The cuDNN path's key-mask fold on for one test (attention_policy.set_key_mask_fold)."""
  from paxlike.layers import attention_policy

  attention_policy.set_key_mask_fold(True)
  yield
  attention_policy.set_key_mask_fold(False)


@pytest.fixture
def masks_as_bias():
  """The cuDNN path's key counts off for one test: every mask becomes an additive bias
  (attention_policy.set_key_mask_lengths)."""
  from paxlike.layers import attention_policy

  attention_policy.set_key_mask_lengths(False)
  yield
  attention_policy.set_key_mask_lengths(True)


@pytest.fixture
def cudnn_via_xla(monkeypatch):
  """jax.nn's cuDNN attention answered by jax.nn's XLA implementation of the same arguments
  (this host has no cuDNN); the list of calls: each one's head dim, is_causal and the
  shapes of its bias, mask and key counts (None where absent)."""
  import jax

  real = jax.nn.dot_product_attention
  calls = []

  def through_xla(q, k, v, *, implementation=None, **kwargs):
    assert implementation == "cudnn"
    calls.append({"head_dim": q.shape[-1], "is_causal": kwargs.get("is_causal", False), **{
        name: None if kwargs.get(name) is None else kwargs[name].shape
        for name in ("bias", "mask", "key_value_seq_lengths")}})
    return real(q, k, v, implementation="xla", **kwargs)

  monkeypatch.setattr(jax.nn, "dot_product_attention", through_xla)
  return calls


def describe(proc: subprocess.CompletedProcess) -> str:
  """Exit code and output of a finished CLI run, for assertion messages."""
  return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-4000:]}"


def write_tfds(data_dir: Path, name: str, version: str, features: dict[str, Any],
               splits: dict[str, list[dict[str, Any]]], config: str | None = None) -> None:
  """A TFDS dataset name[/config]:version with these splits' rows under data_dir, as a
  builder of that name writes it (not registered: TFDS reads it from the files)."""
  import tensorflow_datasets as tfds

  feature_dict = tfds.features.FeaturesDict(features)
  attrs = {
      "name": name, "VERSION": tfds.core.Version(version),
      "_info": lambda self: tfds.core.DatasetInfo(builder=self, features=feature_dict),
      "_split_generators": lambda self, dl_manager: {
          split: self._generate_examples(rows) for split, rows in splits.items()},
      "_generate_examples": lambda self, rows: enumerate(rows),
  }
  if config:
    attrs["BUILDER_CONFIGS"] = [tfds.core.BuilderConfig(name=config)]
  builder = type(name, (tfds.core.GeneratorBasedBuilder,), attrs, skip_registration=True)
  builder(data_dir=str(data_dir)).download_and_prepare()


def parse_trained_line(stdout: str) -> dict[str, float]:
  """The final `trained steps A..B: loss X (step a) -> Y (step b)` line, as numbers."""
  matches = TRAINED_RE.findall(stdout)
  assert matches, f"no 'trained steps' line in stdout:\n{stdout}"
  start, final, first_loss, first_step, last_loss, last_step = matches[-1]
  return {"start_step": int(start), "final_step": int(final), "first_loss": float(first_loss),
          "first_step": int(first_step), "last_loss": float(last_loss),
          "last_step": int(last_step)}


def parse_cls_vars(text: str) -> dict[str, dict[str, str]]:
  """experiment_cls_vars.txt -> {source: {NAME: value text}}."""
  sections: dict[str, dict[str, str]] = {}
  current = None
  for line in text.splitlines():
    if line.startswith("# from "):
      current = sections.setdefault(line[len("# from "):].strip(), {})
    elif " : " in line and current is not None:
      name, value = line.split(" : ", 1)
      current[name.strip()] = value.strip()
  return sections


def read_scalars(event_dir: Path) -> dict[str, list[tuple[int, float]]]:
  """All scalars in a TensorBoard directory: tag -> [(step, value)], in file order."""
  from tensorboardX.proto import event_pb2

  out: dict[str, list[tuple[int, float]]] = {}
  for path in sorted(event_dir.glob("events.out.tfevents.*")):
    data = path.read_bytes()
    i = 0
    while i + 12 <= len(data):
      # TFRecord framing: uint64 length, uint32 crc, payload, uint32 crc.
      (n,) = struct.unpack("<Q", data[i:i + 8])
      event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
      i += 12 + n + 4
      for v in event.summary.value:
        out.setdefault(v.tag, []).append((event.step, v.simple_value))
  return out


def expected_param_count(num_layers: int, model_dims: int, hidden_dims: int,
                         vocab_size: int, dims_per_head: int) -> int:
  """Parameters of the LM: shared embedding and its softmax bias, per layer attention
  (q, k, v, post, the per-dim query scale), FFN with biases and two LayerNorms, and
  the final LayerNorm."""
  d, h = model_dims, hidden_dims
  per_layer = 4 * d * d + dims_per_head + (d * h + h) + (h * d + d) + 2 * (2 * d)
  return vocab_size * (d + 1) + num_layers * per_layer + 2 * d


def parse_model_analysis(text: str) -> tuple[dict[str, dict[str, str]], int]:
  """model_analysis.txt -> ({param name: {shape, dtype, spec, count}}, total)."""
  rows, total = {}, None
  for line in text.splitlines():
    if line.startswith("total parameters:"):
      total = int(line.split(":", 1)[1].strip().replace(",", ""))
      continue
    name, rest = line.split("  ", 1)
    fields = dict(re.findall(r"(\w+)=(\([^)]*\)|P\([^)]*\)|\S+)", rest))
    rows[name] = fields
  assert total is not None, f"no 'total parameters' line in:\n{text}"
  return rows, total


def train_in_process(exp_name: str, overrides: list[str], job_log_dir: Path,
                     num_devices: int = 1, main_rules: bool = False, **option_kwargs):
  """What main.run does for a train job, in this process, on the first num_devices devices.

  main_rules: shard by the experiment's own rules (paxlike.mesh.rules_for), as main
  does, instead of the mesh's plain ones.

  Returns:
    (TrainResult, experiment, partitioner).
  """
  import jax

  from paxlike import config, experiment, mesh, registry, trainer
  from paxlike.partitioning import SpmdPartitioner

  exp = experiment.instantiate(registry.get(exp_name), overrides)
  device_mesh = mesh.build(exp.ICI_MESH_SHAPE, exp.DCN_MESH_SHAPE,
                           devices=jax.devices()[:num_devices], names=mesh.axis_names(exp))
  partitioner = SpmdPartitioner(device_mesh, rules=mesh.rules_for(exp) if main_rules else None)
  task = config.build(exp.task())
  inputs = [config.build(c) for c in exp.datasets()]
  for inp in inputs:
    inp.bind_host(jax.process_count(), jax.process_index())
  train_input = next(i for i in inputs if i.is_training)
  option_kwargs.setdefault("enable_summary_writer", False)
  option_kwargs.setdefault("async_checkpoint", False)
  options = trainer.TrainOptions(**option_kwargs)
  os.makedirs(job_log_dir, exist_ok=True)
  result = trainer.train(task, train_input, partitioner, str(job_log_dir), options)
  return result, exp, partitioner


