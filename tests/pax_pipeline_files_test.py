"""Pax's own pipelined experiments, their import lines rewritten, configure and dry-run here.

Pax's files (paxml's tasks/lm/params/{lm_cloud,c4,nvidia}.py at b397693) are
not this project's text, so none is kept in the repository: the tests read
them from $PAXLIKE_PAXREF (default /work/paxref) and are skipped where they
are absent. Each is copied into a temporary directory with its `paxml` /
`praxis` import lines rewritten to `paxlike.pax`, nothing else; the copies are
named pax_<file> (a module named nvidia shadows the CUDA packages). t5, which
c4.py imports for its SeqIO tasks and which is not installed here, is stood in
for by seqio's classes that t5.data re-exports and the three t5 preprocessors
c4.py's tasks run (T5_STAND_IN).

Every pipelined class gets the parameter count Pax's configuration implies
(computed below from its dims alone) and Pax's schedule, on the batch its
mesh's devices give. NVIDIA_CIRCULAR_REPEAT (circular, 8 devices, one layer
per stage: the cheapest to compile) is dry-run end to end; the others' dry
runs take from half a minute (lm_cloud's circular 2B, 3 layers a stage) to
many minutes each on a CPU, so they are run by hand, not here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import re
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import describe, registrations_undone, run_cli, train_in_process

from paxlike import config, dry_run, experiment, flops, registry
from paxlike import train_state as ts
from paxlike.errors import UserError
from paxlike.steps import fp8_meta

PAXREF = Path(os.environ.get("PAXLIKE_PAXREF", "/work/paxref"))
FILES = ("lm_cloud", "c4", "nvidia")
IMPORT_LINE = re.compile(r"^(from|import)\s+(paxml|praxis)\b.*$", re.M)

pytestmark = pytest.mark.skipif(
    not all((PAXREF / f"{name}.py").is_file() for name in FILES),
    reason=f"Pax's lm_cloud.py, c4.py and nvidia.py are not in {PAXREF} (set PAXLIKE_PAXREF)")

# t5.data as c4.py uses it: seqio's classes, t5's TaskRegistry.add, and the three t5
# preprocessors its C4 tasks run (paxlike writes two for Pax's GPU tasks). This
# machine reaches no gs:// bucket, so a gs:// SentencePiece model is seqio's own test model.
T5_STAND_IN = {
    "t5/__init__.py": "from t5 import data  # noqa: F401\n",
    "t5/data/__init__.py": textwrap.dedent("""\
        import os

        import seqio
        from seqio import Feature, PassThroughVocabulary  # noqa: F401

        from t5.data import preprocessors  # noqa: F401

        TEST_MODEL = os.path.join(os.path.dirname(seqio.__file__), "test_data",
                                  "sentencepiece", "sentencepiece.model")


        class SentencePieceVocabulary(seqio.SentencePieceVocabulary):
          def __init__(self, path, *args, **kwargs):
            super().__init__(TEST_MODEL if path.startswith("gs://") else path, *args,
                             **kwargs)


        class TaskRegistry(seqio.TaskRegistry):
          @classmethod
          def add(cls, name, task_cls=seqio.Task, **kwargs):
            return seqio.TaskRegistry.add(name, task_cls=task_cls, **kwargs)
        """),
    "t5/data/preprocessors.py": textwrap.dedent("""\
        import seqio

        from paxlike.inputs.seqio_preprocessors import (  # noqa: F401
            reduce_concat_tokens, split_tokens_to_targets_length)

        rekey = seqio.preprocessors.rekey
        """),
}


def write_t5_stand_in(root: Path) -> None:
  """The stand-in above under root, unless t5 itself is installed."""
  if importlib.util.find_spec("t5") is None:
    for rel, text in T5_STAND_IN.items():
      (root / rel).parent.mkdir(parents=True, exist_ok=True)
      (root / rel).write_text(text)


def rewrite_imports(text: str) -> str:
  """Pax's file with `paxml` and `praxis` replaced by `paxlike.pax` on its import lines only."""
  return IMPORT_LINE.sub(lambda m: re.sub(r"\b(paxml|praxis)\b", "paxlike.pax", m.group(0)),
                         text)


def _import_ports(root, files):
  """Pax's files rewritten into root and imported (pax_<file>); cleaned up after: their
  registrations, SeqIO tasks and modules (t5's stand-in included)."""
  for name in files:
    (root / f"pax_{name}.py").write_text(rewrite_imports((PAXREF / f"{name}.py").read_text()))
  with registrations_undone():  # the shipped experiments, imported first, stay registered
    seqio = sys.modules.get("seqio")  # not imported yet: no SeqIO task is registered yet
    before_mods = set(sys.modules)
    tasks_before = set(seqio.TaskRegistry.names()) if seqio else set()
    sys.path.insert(0, str(root))
    try:
      yield {name: importlib.import_module(f"pax_{name}") for name in files}
    finally:
      sys.path.remove(str(root))
      seqio = sys.modules.get("seqio")  # c4.py imports it
      if seqio:
        for name in set(seqio.TaskRegistry.names()) - tasks_before:
          seqio.TaskRegistry.remove(name)
      for mod in set(sys.modules) - before_mods:
        if mod.startswith(("pax_", "t5")):
          del sys.modules[mod]


@pytest.fixture(scope="module")
def pax_modules(tmp_path_factory):
  """The three rewritten files imported (pax_lm_cloud, pax_c4, pax_nvidia)."""
  pytest.importorskip("seqio")  # c4.py registers its SeqIO tasks at import
  root = tmp_path_factory.mktemp("pax_files")
  write_t5_stand_in(root)
  yield from _import_ports(root, FILES)


def test_only_import_lines_change(pax_modules):
  for name in FILES:
    pax = (PAXREF / f"{name}.py").read_text().splitlines()
    ours = rewrite_imports("\n".join(pax)).splitlines()
    changed = [(a, b) for a, b in zip(pax, ours, strict=True) if a != b]
    assert changed and all(IMPORT_LINE.match(a) and "paxlike.pax" in b for a, b in changed)


# ------------------------------------------------------------- Pax's numbers


@dataclasses.dataclass(frozen=True)
class Pax:
  """What Pax's file and templates configure for one pipelined class."""

  layers: int
  model: int
  heads: int
  dims_per_head: int
  vocab: int
  stages: int
  microbatches: int  # Pax's M: the global batch of its mesh over MICROBATCH_SIZE
  devices: int  # ICI x DCN
  repeat: int = 1
  hidden: int | None = None  # None: 4 x model
  position_table: int = 0  # rows of the trainable position embedding
  gpt3: bool = False  # configure_gpt3_task: attention biases, no per-dim scale or softmax bias
  # Knobs the class sets that neither its task() nor its templates read, in Pax as here:
  # paxlike refuses them by name; the test then reads them in a subclass's task().
  unread: tuple[str, ...] = ()


LM_CLOUD = dict(dims_per_head=128, vocab=32000)
GPT3 = dict(layers=96, model=12288, heads=96, dims_per_head=128, vocab=51200,
            position_table=16384, gpt3=True)
NVIDIA = dict(dims_per_head=128, vocab=51200, position_table=2048)
PAX = {
    "pax_lm_cloud.LmCloudSpmdPipeline9B": Pax(48, 4096, 32, stages=16, microbatches=128,
                                              devices=64, **LM_CLOUD),
    "pax_lm_cloud.LmCloudSpmdPipeline175B": Pax(96, 12288, 96, stages=8, microbatches=48,
                                                devices=128, **LM_CLOUD),
    "pax_lm_cloud.LmCloudSpmdPipelineMultislice2B": Pax(18, 3072, 24, stages=2,
                                                        microbatches=32, devices=8, **LM_CLOUD),
    "pax_lm_cloud.LmCloudSpmdPipelineMultislice2BCircular": Pax(
        18, 3072, 24, stages=2, microbatches=16, devices=8, repeat=3, **LM_CLOUD),
    "pax_c4.C4SpmdPipelineAdam": Pax(24, 2048, 32, 64, 32128, stages=2, microbatches=4,
                                     devices=8),
    "pax_c4.C4SpmdPipelineGpt3AdamMLPerfHPBS1p5k768Replicas": Pax(
        stages=8, microbatches=192, devices=768, **GPT3),
    "pax_c4.C4SpmdPipelineGpt3AdamMLPerfHPBS2k512Replicas": Pax(
        stages=8, microbatches=256, devices=512, **GPT3),
    "pax_c4.C4SpmdPipelineGpt3AdamMLPerfHPBS3k768Replicas": Pax(
        stages=4, microbatches=192, devices=768, **GPT3),
    "pax_c4.C4SpmdPipelineGpt3AdamMLPerfHPBS4k1024Replicas": Pax(
        stages=8, microbatches=512, devices=1024, **GPT3),
    "pax_c4.C4SpmdPipelineGpt3AdamMLPerfHPBS8k1024Replicas": Pax(
        stages=4, microbatches=512, devices=1024, **GPT3),
    "pax_c4.C4SpmdPipelineGpt3SmallAdam8Replicas": Pax(
        **dict(GPT3, layers=24, model=3072, heads=24), stages=2, microbatches=64, devices=8),
    "pax_nvidia.NVIDIA5B": Pax(24, 4096, 32, stages=4, microbatches=8, devices=16, **NVIDIA),
    "pax_nvidia.NVIDIA40BProxy": Pax(12, 8192, 64, stages=2, microbatches=64, devices=16,
                                     **NVIDIA),
    "pax_nvidia.NVIDIA70BProxy": Pax(20, 8192, 64, stages=2, microbatches=32, devices=16,
                                     **NVIDIA),
    "pax_nvidia.NVIDIA116BProxy": Pax(16, 12288, 96, stages=4, microbatches=48, devices=16,
                                      **NVIDIA),
    "pax_nvidia.NVIDIA175BProxy": Pax(24, 12288, 96, stages=4, microbatches=96, devices=16,
                                      **NVIDIA),
    # ENABLE_BFLOAT16 (read by Pax's BERT templates only): checked against FPROP_DTYPE.
    "pax_nvidia.NVIDIA175B": Pax(96, 12288, 96, stages=6, microbatches=6, devices=96,
                                 **NVIDIA),
    "pax_nvidia.TestSmallConfig": Pax(16, 4096, 32, stages=2, microbatches=16, devices=16,
                                      **NVIDIA),
    # INIT_STD and SOFTMAX_INIT_STD: read by NVIDIA5B's task(), which this class does not
    # inherit; MAX_STEPS: by Grok's only.
    "pax_nvidia.NVIDIA_CIRCULAR_REPEAT": Pax(
        32, 4096, 32, 128, 32000, stages=8, microbatches=8, devices=8, repeat=4,
        unread=("INIT_STD", "MAX_STEPS", "SOFTMAX_INIT_STD")),
}


def pax_param_count(p: Pax) -> int:
  """Parameters of praxis's TransformerLm with these dims.

  Per layer: q, k, v and the output projection (4 x model x heads x dims),
  the query's per-dim scale (not in GPT-3), attention biases (GPT-3 only),
  the FFN's two matmuls with biases, two LayerNorms (scale and bias). Then
  the tied embedding/softmax table (its bias, not in GPT-3), the final
  LayerNorm and a trainable position table where set.
  """
  d, f, width = p.model, p.hidden or 4 * p.model, p.heads * p.dims_per_head
  layer = 4 * d * width + 2 * d * f + f + d + 2 * 2 * d
  layer += 3 * width + d if p.gpt3 else p.dims_per_head
  return (p.layers * layer + p.vocab * d + (0 if p.gpt3 else p.vocab) + 2 * d
          + p.position_table * d)


def test_pax_formula_by_hand_for_lm_cloud_9b():
  # 48 x (4·4096² + 2·4096·16384 + 16384 + 4096 + 4·4096 + 128) + 32000·4096 + 32000 + 2·4096
  assert pax_param_count(PAX["pax_lm_cloud.LmCloudSpmdPipeline9B"]) == 9_796_564_224


def _on_devices(monkeypatch, n: int) -> None:
  """The batch and learning rate a file computes on its mesh's n devices (one process)."""
  monkeypatch.setattr(jax, "local_device_count", lambda *a, **k: n)
  monkeypatch.setattr(jax, "device_count", lambda *a, **k: n)


def _model_of(cls):
  exp = experiment.instantiate(cls)
  configs = experiment.build_checked(exp)
  task = config.build(configs.task)
  rows = configs.datasets[0].batch_size  # one process: the global batch
  return exp, task.model, rows // task.train.num_microbatches


def _count(model) -> int:
  batch = {k: jax.ShapeDtypeStruct((1, 8), jax.numpy.int32) for k in model.input_features()}
  params = jax.eval_shape(lambda: ts.init_params(model, jax.random.key(0),
                                                 model.init_batch(batch)))
  return ts.count_params(params) - model.padding_params()


def _class(name: str, unread: tuple[str, ...] | None = None):
  """The registered class; one whose file sets knobs nothing reads (`unread`, by default
  Pax.unread), refused by name as written, is taken with those knobs read in a subclass's
  task()."""
  cls = registry.get(name)
  unread = PAX[name].unread if unread is None else unread
  if not unread:
    return cls
  with pytest.raises(UserError) as err:
    _model_of(cls)
  lines = str(err.value).splitlines()
  assert sorted(line.split(" ")[0] for line in lines) == sorted(unread), lines
  assert all("nothing reads it" in line for line in lines), lines

  class Acknowledged(cls):
    def task(self):
      for knob in unread:
        getattr(self, knob)
      return super().task()

  return Acknowledged


@pytest.mark.parametrize("name", sorted(PAX))
def test_pipelined_class_has_paxs_parameter_count_and_schedule(pax_modules, monkeypatch, name):
  p = PAX[name]
  _on_devices(monkeypatch, p.devices)
  exp, model, rows = _model_of(_class(name))
  model.check_batch(rows)  # Pax's microbatches split Pax's batch
  m = rows // model.microbatch_size if model.num_microbatches is None else model.num_microbatches
  assert (model.num_layers, model.num_stages, model.circular_repeat, m,
          math.prod(exp.ICI_MESH_SHAPE) * math.prod(exp.DCN_MESH_SHAPE)) == (
              p.layers, p.stages, p.repeat, p.microbatches, p.devices)
  assert _count(model) == pax_param_count(p)


def mlp_param_count(layers: int, dims: int, hidden: int) -> int:
  """praxis's ClassificationMLPModel: MLPBlock's biased layers and the shared softmax."""
  widths = [dims] + [hidden] * (layers - 1) + [dims]
  return sum(a * b + b for a, b in zip(widths, widths[1:], strict=False)) + dims * dims + dims


@pytest.mark.parametrize(("name", "dims", "hidden"), [("SmallMlp", 1024, 1024),
                                                      ("LargeMlp", 4096, 7168)])
def test_lm_clouds_mlp_benchmarks_have_paxs_count(pax_modules, monkeypatch, name, dims, hidden):
  _on_devices(monkeypatch, 8)
  exp, model, rows = _model_of(registry.get(f"pax_lm_cloud.{name}"))
  assert (exp.ICI_MESH_SHAPE, rows) == ([8, 1, 1], 16 * 8)
  assert _count(model) == mlp_param_count(8, dims, hidden)


@pytest.mark.one_python("3.11")
def test_lm_clouds_small_mlp_trains_as_written_forward_only(pax_modules, tmp_path):
  """SmallMlp, its batch and length cut down, trains its 10 steps on its 8 devices: praxis's
  loss for it is the accuracy, which has no gradient."""
  result, _, _ = train_in_process("pax_lm_cloud.SmallMlp",
                                  ["PERCORE_BATCH_SIZE=1", "MAX_SEQ_LEN=64"], tmp_path / "job",
                                  num_devices=8, main_rules=True)
  assert [h["step"] for h in result.history][-1] == 10
  for h in result.history:
    assert h["loss"] == h["accuracy"] and h["grad_norm"] == 0.0, h


def test_c4s_misspelled_microbatch_size_is_refused_by_name(pax_modules):
  """C4SpmdPipelineGpt3AdamOrgHPBS1p5k768Replicas sets MICROBATCH_SIAZE = 8 (Pax silently
  keeps its parent's MICROBATCH_SIZE = 2)."""
  with pytest.raises(UserError, match=r"^MICROBATCH_SIAZE = 8 .*did you mean MICROBATCH_SIZE"):
    _model_of(registry.get("pax_c4.C4SpmdPipelineGpt3AdamOrgHPBS1p5k768Replicas"))


def test_knobs_pax_sets_and_never_reads_run_as_written_checked_against_what_decides(
    pax_modules, monkeypatch, capsys):
  """NUM_GPUS (the Grok classes) and an LM's ENABLE_BFLOAT16 (NVIDIA175B, Llama33BProxy):
  nothing reads them in Pax; paxlike checks them against the mesh and FPROP_DTYPE. Where the
  file's numbers hold, nothing is said; Grok_Proxy_PP's NUM_GPUS = 64 beside its mesh of
  512 devices is a warning (the mesh decides, as in Pax); a --set that does not hold is
  refused in one line."""
  _on_devices(monkeypatch, 96)  # NVIDIA175B's batch: 1/16 of a row per device
  _model_of(registry.get("pax_nvidia.NVIDIA175B"))
  _on_devices(monkeypatch, 64)
  _model_of(registry.get("pax_nvidia.Grok_Proxy"))
  out = capsys.readouterr().out
  assert "NUM_GPUS" not in out and "ENABLE_BFLOAT16" not in out
  _on_devices(monkeypatch, 512)
  _model_of(registry.get("pax_nvidia.Grok_Proxy_PP"))
  assert ("warning: NUM_GPUS = 64 on Grok_Proxy_PP does not hold: the run takes 512 devices "
          "(ICI_MESH_SHAPE [1, 1, 1, 8, 1] x DCN_MESH_SHAPE [8, 1, 8, 1, 1]); Pax reads "
          "NUM_GPUS nowhere") in capsys.readouterr().out
  with pytest.raises(UserError, match=r"^--set NUM_GPUS=128: the run takes 64 devices "
                     r"\(ICI_MESH_SHAPE \[1, 1, 8, 1\] x DCN_MESH_SHAPE \[1, 8, 1, 1\]\);"
                     r"[^\n]*\(or --set NUM_GPUS=None\)\.$"):
    experiment.build_checked(experiment.instantiate(registry.get("pax_nvidia.Grok_Proxy"),
                                                    ["NUM_GPUS=128"]))


def test_knobs_a_class_sets_that_only_other_classes_read_are_refused(pax_modules):
  """NVIDIA_CIRCULAR_REPEAT sets INIT_STD, SOFTMAX_INIT_STD (NVIDIA1_3B's and NVIDIA5B's
  task() read them) and MAX_STEPS (Grok's and Llama2_7B's), none of which it inherits: in
  Pax they change nothing for it, and paxlike refuses them by name (see PAX.unread)."""
  with pytest.raises(UserError) as err:
    _model_of(registry.get("pax_nvidia.NVIDIA_CIRCULAR_REPEAT"))
  assert [line.split(" on ")[0] for line in str(err.value).splitlines()] == [
      "INIT_STD = 0.01", "MAX_STEPS = 2000", "SOFTMAX_INIT_STD = 0.01"]


@pytest.mark.parametrize(("name", "layers"), [("Grok_Proxy_PP", 16), ("Grok_PP", 64)])
def test_pipelined_grok_has_paxs_count_stages_and_experts(pax_modules, monkeypatch, name,
                                                          layers):
  """Grok_Proxy_PP / Grok_PP: grok's pipelined builder over 8 stages on the 5-axis mesh
  [stage, replica, data, data_expert, mdl] of 512 devices, 32 microbatches (the builder's;
  the file's MICROBATCH_SIZE = 8 does not reach its pipeline, in Pax either), every layer
  with 8 experts; the count is the unpipelined Grok's."""
  _on_devices(monkeypatch, 512)
  exp, model, rows = _model_of(registry.get(f"pax_nvidia.{name}"))
  assert exp.mesh_axis_names() == ("stage", "replica", "data", "data_expert", "mdl")
  assert (rows, model.num_stages, model.num_microbatches, model.microbatch_size,
          model.num_layers, model.moe_layers, model.num_experts) == (
              512, 8, 32, None, layers, tuple(range(layers)), 8)
  model.check_batch(rows)
  assert _count(model) == _grok_count(layers)


# ------------------------------------------------------------------ dry runs


def test_nvidias_circular_pipeline_dry_runs_with_paxs_count(pax_modules):
  """The cheapest of Pax's pipelined classes to compile (one layer per stage, 8 devices)."""
  name = "pax_nvidia.NVIDIA_CIRCULAR_REPEAT"
  p = PAX[name]
  exp = experiment.instantiate(_class(name))
  experiment.build_checked(exp)
  report = dry_run.analyse(exp)
  assert report["num_devices"] == 8 and list(report["mesh"]) == ["stage", "replica", "data",
                                                                  "mdl"]
  assert report["params"] == pax_param_count(p)
  sched = report["pipeline"]
  assert (sched["schedule"], sched["stages"], sched["microbatches"], sched["circular_repeat"]) == (
      "circular", p.stages, p.microbatches, p.repeat)
  assert sched["bubble_fraction"] == pytest.approx(
      (p.stages - 1) / (p.microbatches * p.repeat + p.stages - 1))
  assert 0 < report["compiled_memory_per_device"]["peak"] < 95 * dry_run.GIB  # fits a v5p


# ------------------------------------------- Pax's other LM files, where present

# c4_multislice.py and optimal_scaling.py subclass c4.py's and lm_cloud.py's classes through
# Pax's import paths, which paxlike.pax serves with its shipped experiments of those files.
OTHER_FILES = ("c4_multislice", "optimal_scaling")
MULTISLICE_22B = Pax(48, 6144, 24, 256, 32768, stages=1, microbatches=1, devices=0)
MULTISLICE = {  # class: (dims, Pax's global batch, from each class's docstring)
    "C4Spmd22BAdamMaxText": (MULTISLICE_22B, 128),
    "C4Spmd22BAdam1xv4_128": (MULTISLICE_22B, 1024),
    "C4Spmd22BAdam2xv4_128LimitSteps": (MULTISLICE_22B, 2048),
    "C4Spmd22BAdam4xv4_128": (MULTISLICE_22B, 4096),
    "C4Spmd22BAdam2xv4_384": (Pax(24, 9216, 24, 384, 32768, stages=1, microbatches=1,
                                  devices=0), 3840),
    "C4Spmd22BAdam4xv4_8LimitSteps": (Pax(16, 2048, 8, 256, 32768, stages=1, microbatches=1,
                                          devices=0), 256),
    "C4Spmd32BAdam2xv5_256": (Pax(40, 8192, 32, 256, 32768, stages=1, microbatches=1,
                                  devices=0), 512),
}


@pytest.fixture(scope="module")
def other_pax_modules(tmp_path_factory):
  if not all((PAXREF / f"{name}.py").is_file() for name in OTHER_FILES):
    pytest.skip(f"Pax's c4_multislice.py and optimal_scaling.py are not in {PAXREF}")
  yield from _import_ports(tmp_path_factory.mktemp("pax_other_files"), OTHER_FILES)


def _devices_and_model(monkeypatch, cls):
  exp = experiment.instantiate(cls)
  _on_devices(monkeypatch, math.prod(exp.ICI_MESH_SHAPE) * math.prod(exp.DCN_MESH_SHAPE or [1]))
  _, model, rows = _model_of(cls)
  return model, rows


@pytest.mark.parametrize("name", sorted(MULTISLICE))
def test_multislice_class_has_paxs_count_and_batch(other_pax_modules, monkeypatch, name):
  pax, batch = MULTISLICE[name]
  model, rows = _devices_and_model(monkeypatch, registry.get(f"pax_c4_multislice.{name}"))
  assert (model.num_layers, rows, _count(model)) == (pax.layers, batch, pax_param_count(pax))


def test_multislices_misnamed_checkpoint_knob_is_refused_by_name(other_pax_modules):
  """C4SpmdGpt3AdamDataParallel2x16x16 sets CHECKPOINT_SAVE_MAX_TO_KEEP = 20, which only Pax's
  BERT template reads (its LM templates read CHECKPOINT_MAX_TO_KEEP): Pax keeps 10."""
  with pytest.raises(UserError, match=r"^CHECKPOINT_SAVE_MAX_TO_KEEP = 20 .*did you mean "
                                      r"CHECKPOINT_MAX_TO_KEEP"):
    _model_of(registry.get("pax_c4_multislice.C4SpmdGpt3AdamDataParallel2x16x16"))


@pytest.mark.parametrize("name,layers,percore,devices", [
    ("OptimalScaling2x2x1", 28, 16, 4), ("OptimalScaling4x4x4", 45, 8, 64),
    ("OptimalScaling4x16x32", 64, 1, 2048)])
def test_optimal_scaling_sets_its_dims_in_task_as_pax_does(other_pax_modules, monkeypatch, name,
                                                           layers, percore, devices):
  """OptimalScaling.task() assigns MODEL_DIMS = 128 x NUM_LAYERS and HIDDEN_DIMS = 4 x that
  before the template reads them (heads of 128 dims, lm_cloud's 32000-token vocabulary)."""
  model, rows = _devices_and_model(monkeypatch, registry.get(f"pax_optimal_scaling.{name}"))
  pax = Pax(layers, 128 * layers, layers, 128, 32000, stages=1, microbatches=1, devices=0)
  assert (model.model_dims, model.hidden_dims, rows, _count(model)) == (
      128 * layers, 512 * layers, percore * devices, pax_param_count(pax))


# --------------------------------------------------------- mixture of experts


def test_nvidias_moe_large_has_paxs_experts_and_count(pax_modules, monkeypatch):
  """MoELarge: maybe_setup_moe_params turns every layer's feed-forward into 16 experts
  (GELU, LayerNorm and hidden dims copied from the dense one), routed in 16 groups."""
  _on_devices(monkeypatch, 32)
  _, model, _ = _model_of(registry.get("pax_nvidia.MoELarge"))
  assert (model.num_layers, model.num_experts, model.num_groups, model.moe_layers,
          model.activation, model.norm_type, model.moe_hidden_dims or model.hidden_dims) == (
              12, 16, 16, tuple(range(12)), "gelu", "layernorm", 16384)
  p = Pax(12, 4096, 32, stages=1, microbatches=1, devices=32, **NVIDIA)
  d, f, e = 4096, 16384, 16
  # Each layer's feed-forward (two matmuls with biases) becomes a [d, e] router and e
  # experts of two bias-free matmuls; its LayerNorm stays.
  moe = 12 * ((d * e + 2 * e * d * f) - (2 * d * f + f + d))
  assert _count(model) == pax_param_count(p) + moe
  assert flops.param_count(model.flops_dims(8)) == _count(model)


@pytest.mark.one_python("3.11")
def test_nvidias_moe_large_as_written_dry_runs_within_an_80gb_gpu(pax_modules, tmp_path):
  """The pod check on a CPU: MoELarge on its own 32-device mesh compiles with Pax's count.
  Its 16 experts do not divide the 32-way data axis, so each is split on its embed dim, and
  with the routing done by gathers the step fits an 80 GB GPU (the one-hot einsums' step
  needed 153 GiB a device)."""
  root = Path(pax_modules["nvidia"].__file__).parent
  job = tmp_path / "job"
  proc = run_cli(["--exp=pax_nvidia.MoELarge", "--mode=dry_run", f"--job_log_dir={job}"],
                 tmp_path, pythonpath=[root])
  assert proc.returncode == 0, describe(proc)
  report = json.loads((job / "dry_run.json").read_text())
  assert (report["num_devices"], report["params"]) == (32, 26_794_257_920)
  assert report["fits"]["h100"]["fits"] and report["fits"]["a100"]["fits"], report["fits"]


MOE_SMALL = ["NUM_LAYERS=2", "MODEL_DIMS=32", "HIDDEN_DIMS=64", "NUM_HEADS=4",
             "DIMS_PER_HEAD=8", "VOCAB_SIZE=64", "MAX_SEQ_LEN=16", "NUM_EXPERTS=8",
             "NUM_GROUPS=8", "PERCORE_BATCH_SIZE=1", "ICI_MESH_SHAPE=[1,8,1]",
             "DCN_MESH_SHAPE=[1,1,1]", "FPROP_DTYPE=float32"]


@pytest.mark.one_python("3.11")
def test_nvidias_moe_large_trains_with_its_experts_over_the_data_axis(pax_modules, tmp_path):
  """MoELarge cut down to 8 devices: the cross-entropy and the load-balancing loss fall, and
  each device holds one of the 8 experts of each layer."""
  result, _, _ = train_in_process(
      "pax_nvidia.MoELarge", [*MOE_SMALL, "NUM_TRAIN_STEPS=30", "LEARNING_RATE=3e-3",
                               "SUMMARY_INTERVAL_STEPS=1"],
      tmp_path / "job", num_devices=8)
  first, last = result.history[0], result.history[-1]
  assert last["log_pplx"] < 0.85 * first["log_pplx"], (first, last)
  # The loss is praxis's total_loss: the cross-entropy plus both layers' balancing losses.
  assert last["loss"] == pytest.approx(last["log_pplx"] + last["aux_loss"], rel=1e-5)
  assert last["aux_loss"] < first["aux_loss"]
  assert 0.0 <= last["moe_over_capacity"] < 0.5  # the share of choices its expert turned away
  wi = result.state.params["transformer"]["repeat"]["moe"]["wi"]
  wi = getattr(wi, "value", wi)
  assert wi.shape == (2, 8, 32, 64)
  assert {s.data.shape for s in wi.addressable_shards} == {(2, 1, 32, 64)}


def test_fdl_config_names_a_class_nobody_registered_as_pax_does(pax_modules):
  """Pax's --fdl_config builds a class by its import path, registered or not (the GLaM
  classes of nvidia.py and configs.py are not); --exp still wants the registration."""
  glam = sys.modules["pax_nvidia"].GLaM64B64EProxy
  assert registry.get(f"{registry.FDL_CONFIG}pax_nvidia.GLaM64B64EProxy") is glam
  assert registry.get(f"{registry.FDL_CONFIG}pax_nvidia.MoELarge") is registry.get(
      "pax_nvidia.MoELarge")
  with pytest.raises(UserError, match="is not a registered experiment"):
    registry.get("pax_nvidia.GLaM64B64EProxy")


@pytest.mark.one_python("3.11")
def test_nvidias_glam_trains_with_its_experts_relative_bias_and_z_loss(pax_modules, tmp_path):
  """GLaM64B64EProxy (glam.GlamUniTransformerLmHParams, the file's own class) cut down to 8
  devices: blocks of an MoE and a dense layer, scanned; the cross-entropy falls, and the
  loss is praxis's total: cross-entropy + load-balancing + z-loss."""
  result, _, _ = train_in_process(  # unregistered in Pax's file: by path, as --fdl_config
      f"{registry.FDL_CONFIG}pax_nvidia.GLaM64B64EProxy",
      [*MOE_SMALL, "NUM_LAYERS=4", "DCN_MESH_SHAPE=None", "NUM_TRAIN_STEPS=30",
       "LEARNING_RATE=2e-2", "SUMMARY_INTERVAL_STEPS=1"], tmp_path / "job", num_devices=8)
  first, last = result.history[0], result.history[-1]
  assert last["log_pplx"] < 0.7 * first["log_pplx"], (first, last)
  assert 0 < last["z_loss"] and 0 < last["aux_loss"]
  assert last["loss"] == pytest.approx(last["log_pplx"] + last["aux_loss"] + last["z_loss"],
                                       rel=1e-5)
  params = result.state.params["transformer"]["repeat"]
  value = lambda x: getattr(x, "value", x)  # noqa: E731
  assert value(params["layer_0"]["moe"]["wi"]).shape == (2, 8, 32, 64)
  assert value(params["layer_1"]["ffn"]["ffn1_gate"]["w"]).shape == (2, 32, 64)
  assert value(params["layer_0"]["attention"]["relative_bias"]["rel_embedding"]).shape == (
      2, 32, 4)


@pytest.mark.one_python("3.11")
def test_nvidias_expert_parallel_glam_trains_with_experts_over_data_expert(pax_modules,
                                                                          tmp_path):
  """GLaM64B64EProxy_EP as written (set_sharding_params_with_expert_parallelism on a 4-axis
  mesh) cut down to 8 devices, [replica, data, data_expert, mdl] = [1, 2, 4, 1]: each device
  holds one of each MoE layer's 4 experts, split in two on its embed dim over 'data', and
  the batch goes over data x data_expert; the cross-entropy falls."""
  result, _, _ = train_in_process(
      f"{registry.FDL_CONFIG}pax_nvidia.GLaM64B64EProxy_EP",
      [*MOE_SMALL, "NUM_LAYERS=4", "NUM_EXPERTS=4", "ICI_MESH_SHAPE=[1,2,4,1]",
       "DCN_MESH_SHAPE=None", "NUM_TRAIN_STEPS=30", "LEARNING_RATE=2e-2",
       "SUMMARY_INTERVAL_STEPS=1"], tmp_path / "job", num_devices=8)
  first, last = result.history[0], result.history[-1]
  assert last["log_pplx"] < 0.7 * first["log_pplx"], (first, last)
  assert last["loss"] == pytest.approx(last["log_pplx"] + last["aux_loss"] + last["z_loss"],
                                       rel=1e-5)
  wi = result.state.params["transformer"]["repeat"]["layer_0"]["moe"]["wi"]
  wi = getattr(wi, "value", wi)
  assert wi.shape == (2, 4, 32, 64)
  assert wi.sharding.spec[1:3] == ("data_expert", "data")
  assert {s.data.shape for s in wi.addressable_shards} == {(2, 1, 16, 64)}


GROK_SMALL = [s for s in MOE_SMALL if not s.startswith(("ICI_", "DCN_", "NUM_EXPERTS"))] + [
    "NUM_EXPERTS=4", "NUM_KV_HEADS=2", "ICI_MESH_SHAPE=[1,2,4,1]", "DCN_MESH_SHAPE=[1,1,1,1]",
    "MAX_STEPS=30", "LEARNING_RATE=2e-2", "SUMMARY_INTERVAL_STEPS=1"]


@pytest.mark.one_python("3.11")
def test_nvidias_grok_proxy_trains_with_gqa_rope_and_experts_in_every_layer(pax_modules,
                                                                            tmp_path):
  """Grok_Proxy as written (grok.GrokUniTransformerLmHParams, USE_EXPERT_PARALLEL on its
  4-axis mesh, rotary positions turned on in its task()) cut down to 8 devices: every layer
  a mixture of 4 gated-GELU experts over data_expert, multi-query attention with 2
  key/value heads and biases; it runs its own MAX_STEPS and the cross-entropy falls."""
  result, exp, _ = train_in_process("pax_nvidia.Grok_Proxy", GROK_SMALL, tmp_path / "job",
                                    num_devices=8)
  assert len(result.history) == 30
  first, last = result.history[0], result.history[-1]
  assert last["log_pplx"] < 0.7 * first["log_pplx"], (first, last)
  model = config.build(exp.task()).model
  assert (model.moe_layers, model.num_kv_heads, model.rope_timescales, model.use_bias,
          model.moe_gated_activation, model.moe_activation, model.norm_type) == (
              (0, 1), 2, (1.0, 10_000.0), True, True, "gelu", "rmsnorm")
  params = result.state.params["transformer"]["repeat"]
  value = lambda x: getattr(x, "value", x)  # noqa: E731
  assert value(params["moe"]["wi_gate"]).shape == (2, 4, 32, 64)
  assert value(params["attention"]["key"]["w"]).shape == (2, 32, 2, 8)
  assert value(params["attention"]["key"]["b"]).shape == (2, 2, 8)


@pytest.mark.one_python("3.11")
def test_nvidias_grok_proxy_with_use_fp8_runs_its_projections_and_experts_in_fp8(pax_modules,
                                                                               tmp_path):
  """USE_FP8 = True on Grok_Proxy (praxis's builder puts Fp8EinsumOp on the attention's
  projections and the experts' einsums): every one of them gets its delayed-scaling state,
  which the step writes (the experts' kernel history follows their largest weight), and the
  cross-entropy falls."""
  result, exp, _ = train_in_process("pax_nvidia.Grok_Proxy", [*GROK_SMALL, "USE_FP8=True",
                                                              "MAX_STEPS=16"],
                                    tmp_path / "job", num_devices=8)
  first, last = result.history[0], result.history[-1]
  # 4.16 -> 3.54 in 16 steps (token accuracy 0.02 -> 0.60)
  assert last["log_pplx"] < first["log_pplx"] - 0.4, (first, last)
  model = config.build(exp.task()).model
  assert (model.use_fp8, model.moe_fp8) == (True, True)
  params = jax.device_get(result.state.params)
  meta = fp8_meta(params)
  scopes = {k.rsplit("/", 1)[0].split("/repeat/")[-1] for k in meta}
  assert scopes == {"attention/query/fp8", "attention/key/fp8", "attention/value/fp8",
                    "attention/post_fp8", "moe/wi_fp8", "moe/wi_gate_fp8", "moe/wo_fp8"}, scopes
  value = lambda x: getattr(x, "value", x)  # noqa: E731
  wo = np.asarray(value(params["transformer"]["repeat"]["moe"]["wo"]))
  history = np.asarray(meta["transformer/repeat/moe/wo_fp8/kernel_amax_history"])
  # Per layer: the newest entry is the experts' largest |wo| one update ago; 16 entries.
  np.testing.assert_allclose(history[:, 0], np.abs(wo).reshape(len(wo), -1).max(1), rtol=0.05)
  assert ((history > 0).sum(axis=1) == 16).all()


def _small_fp8_grok_tree(kv_heads: int) -> dict:
  """The tree config_tree reads of a 2-layer Grok built by praxis's builder with use_fp8."""
  from paxlike.pax import pax_fiddle, praxis_layers
  from paxlike.pax.layers import grok

  lm = grok.GrokUniTransformerLmHParams(
      vocab_size=64, model_dim=32, ff_dim=64, attention_num_heads=4,
      attention_num_groups=kv_heads, attention_key_value_dim=8, num_transformer_layers=2,
      moe=True, e_dim=4, num_groups=1, capacity_factor=2.0, use_fp8=True)
  return {"lm_tpl": lm, "params_init": None, "num_stages": None, "report_strict_acc": False,
          "decoder_tpl": pax_fiddle.Config(praxis_layers.DecoderHParams, eos_id=1)}


def test_fp8_on_only_some_of_the_experts_einsums_is_refused_in_one_line():
  """praxis runs a gated expert's pair through einsum_gated_tpl and its output through
  einsum_tpl; paxlike's experts are in FP8 or not, so a tree that mixes them is refused."""
  import fiddle as fdl

  from paxlike.pax import config_tree, pax_fiddle
  from paxlike.pax.layers.injection import fp8_nvidia_gpu
  from paxlike.pax.praxis_layers import EinsumOp

  tree = _small_fp8_grok_tree(kv_heads=2)
  moe = tree["lm_tpl"].stacked_transformer_tpl.block.moe_layer_tpl
  assert fdl.get_callable(moe.einsum_gated_tpl) is fp8_nvidia_gpu.Fp8EinsumGatedOp
  values, _ = config_tree.read_tree(tree)
  assert (values["use_fp8"], values["moe_fp8"]) == (True, True)
  moe.einsum_tpl = pax_fiddle.Config(EinsumOp)
  with pytest.raises(UserError) as err:
    config_tree.read_tree(tree)
  message = str(err.value)
  assert "\n" not in message and ".moe_layer_tpl.einsum_gated_tpl is FP8" in message, message
  assert "set both alike" in message


def test_one_key_value_head_projects_its_keys_and_values_as_praxis_does_with_use_fp8():
  """With one key/value head, praxis projects k and v through headless_proj_tpl, which
  Grok's builder leaves without FP8: paxlike's LM reads kv_fp8=False beside use_fp8, writes
  the same tree back, and an Fp8EinsumOp set there by hand turns them FP8 too."""
  import fiddle as fdl

  from paxlike.models.language_model import LanguageModel
  from paxlike.pax import config_tree, pax_fiddle, praxis_layers
  from paxlike.pax.layers.injection import fp8_nvidia_gpu

  tree = _small_fp8_grok_tree(kv_heads=1)
  values, _ = config_tree.read_tree(tree)
  assert (values["num_kv_heads"], values["use_fp8"], values["kv_fp8"]) == (1, True, False)
  m = fdl.Config(LanguageModel, **{k: v for k, v in values.items()
                                   if k not in ("packed_input", "report_strict_acc")})
  stack = config_tree.tree_of(m).stacked_transformer_tpl
  atten = stack.block.transformer_layer_params_tpl.tr_atten_tpl
  assert fdl.get_callable(atten.proj_tpl.einsum_tpl) is fp8_nvidia_gpu.Fp8EinsumOp
  assert fdl.get_callable(atten.headless_proj_tpl.einsum_tpl) is praxis_layers.EinsumOp
  block = tree["lm_tpl"].stacked_transformer_tpl.block.transformer_layer_params_tpl.tr_atten_tpl
  block.headless_proj_tpl.einsum_tpl = pax_fiddle.Config(fp8_nvidia_gpu.Fp8EinsumOp)
  assert config_tree.read_tree(tree)[0]["kv_fp8"] is None  # as use_fp8: every projection


def _grok_count(layers: int) -> int:
  """Grok's parameters from its dims: per layer, multi-query attention with biases (48
  query and 8 key/value heads of 128), two RMS norms, a [6144, 8] router and 8 gated
  experts of 32768; then the final norm and the 131072-token table."""
  d, n, kv, h, f, e, v = 6144, 48, 8, 128, 32768, 8, 131072
  attention = d * n * h + n * h + 2 * (d * kv * h + kv * h) + n * h * d + d
  return layers * (attention + 2 * d + d * e + 3 * e * d * f) + d + v * d


@pytest.mark.parametrize(("name", "layers", "devices"), [("Grok_Proxy", 16, 64),
                                                         ("Grok", 64, 256)])
def test_nvidias_grok_classes_have_paxs_count_on_the_expert_parallel_mesh(
    pax_modules, monkeypatch, name, layers, devices):
  """Grok (Grok-1's 314B) and Grok_Proxy, as written (their NUM_GPUS is their mesh's
  count): Pax's count, every layer with 8 experts, one per device of the mesh's
  data_expert axis."""
  _on_devices(monkeypatch, devices)
  exp, model, rows = _model_of(registry.get(f"pax_nvidia.{name}"))
  assert exp.mesh_axis_names() == ("replica", "data", "data_expert", "mdl")
  assert (rows, model.num_layers, model.moe_layers, model.num_experts, model.num_groups,
          model.expert_shards) == (devices, layers, tuple(range(layers)), 8, devices, 8)
  assert _count(model) == _grok_count(layers)
  assert flops.param_count(model.flops_dims(8)) == _count(model)


@pytest.mark.one_python("3.11")
def test_nvidias_grok_proxy_dry_runs_on_its_64_device_expert_parallel_mesh(pax_modules,
                                                                          tmp_path):
  """The pod check on a CPU of Grok_Proxy as written, with two of its 16 layers: the mesh
  [replica, data, data_expert, mdl] = [1, 8, 8, 1] from ICI x DCN, Pax's count, and the
  --set values (an AutodiffCheckpointType among them) written to dry_run.json."""
  root = Path(pax_modules["nvidia"].__file__).parent
  job = tmp_path / "job"
  proc = run_cli(["--exp=pax_nvidia.Grok_Proxy", "--mode=dry_run", f"--job_log_dir={job}",
                  "--set", "NUM_LAYERS=2", "--set", "CHECKPOINT_POLICY=SAVE_NOTHING"],
                 tmp_path, pythonpath=[root])
  assert proc.returncode == 0, describe(proc)
  report = json.loads((job / "dry_run.json").read_text())
  assert report["mesh"] == {"replica": 1, "data": 8, "data_expert": 8, "mdl": 1}
  assert (report["num_devices"], report["params"]) == (64, _grok_count(2))
  assert report["overrides"] == {"NUM_LAYERS": 2, "CHECKPOINT_POLICY": "SAVE_NOTHING"}


def test_expert_parallelism_without_its_mesh_is_refused_in_one_line(pax_modules):
  """USE_EXPERT_PARALLEL (Grok's) and set_sharding_params_with_expert_parallelism
  (GLaM64B64EProxy_EP's) on a 3-axis mesh: each one sentence naming the 4-axis mesh."""
  three_axes = ["ICI_MESH_SHAPE=[1,8,1]", "DCN_MESH_SHAPE=[1,8,1]"]
  with pytest.raises(UserError, match=r"^USE_EXPERT_PARALLEL=True needs the 4-axis mesh "
                                      r"\[replica, data, data_expert, mdl\]") as err:
    experiment.build_checked(experiment.instantiate(
        registry.get("pax_nvidia.Grok_Proxy"), three_axes))
  assert "\n" not in str(err.value)
  with pytest.raises(UserError, match=r"^set_sharding_params_with_expert_parallelism shards "
                                      r"over 4 mesh axes .* ICI_MESH_SHAPE=\[1, 8, 1\]") as err:
    experiment.build_checked(experiment.instantiate(
        registry.get(f"{registry.FDL_CONFIG}pax_nvidia.GLaM64B64EProxy_EP"),
        [three_axes[0], "DCN_MESH_SHAPE=None"]))
  assert "\n" not in str(err.value)


@pytest.mark.one_python("3.11")
def test_nvidias_pipelined_grok_trains_with_experts_in_every_stage(pax_modules, tmp_path):
  """Grok_Proxy_PP as written (grok's pipelined builder on the 5-axis mesh [stage, replica,
  data, data_expert, mdl]) cut down to 8 devices, [2, 1, 1, 2, 2]: two stages of two layers,
  every layer a mixture of 2 experts over data_expert; four microbatches. The cross-entropy
  falls, and the loss adds the balancing losses of the microbatches' passes, not the
  bubble's."""
  small = [s for s in GROK_SMALL if not s.startswith(("ICI_", "DCN_", "NUM_EXPERTS",
                                                      "NUM_GROUPS"))]
  result, exp, _ = train_in_process(
      "pax_nvidia.Grok_Proxy_PP",
      [*small, "NUM_LAYERS=4", "NUM_STAGES=2", "NUM_EXPERTS=2", "NUM_GROUPS=4",
       "NUM_MICROBATCHES=4", "MICROBATCH_SIZE=None", "ICI_MESH_SHAPE=[2,1,1,2,2]",
       "DCN_MESH_SHAPE=[1,1,1,1,1]"], tmp_path / "job", num_devices=8)
  assert exp.mesh_axis_names() == ("stage", "replica", "data", "data_expert", "mdl")
  first, last = result.history[0], result.history[-1]
  assert last["log_pplx"] < 0.7 * first["log_pplx"], (first, last)
  # Four MoE layers, each >= 1 (1 for an even router) times the weight 0.01.
  assert 4 * 0.01 <= last["aux_loss"] < 4 * 0.01 * 2
  assert last["loss"] == pytest.approx(last["log_pplx"] + last["aux_loss"] + last["z_loss"],
                                       rel=1e-5)
  wi = result.state.params["transformer"]["pipeline"]["x_layers_0"]["moe"]["wi"]
  wi = getattr(wi, "value", wi)
  assert wi.shape == (1, 2, 2, 32, 64)  # [repeat, stage, expert, embed, hidden]
  assert {s.data.shape for s in wi.addressable_shards} == {(1, 1, 1, 32, 32)}


def test_inputs_split_mapping_over_paxs_batch_axes_is_accepted_and_another_refused():
  """Grok_Proxy_PP's mapping (stage, replica, data, data_expert) is how paxlike splits the
  batch already; a mapping over 'mdl' is not, and is refused in one line."""
  from paxlike.pax.py_utils import NestedMap
  from paxlike.task import TrainSettings

  axes = ("stage", "replica", "data", "data_expert")
  TrainSettings(inputs_split_mapping=NestedMap(map_1d=(axes,), map_2d=(axes, None)))
  for other in (("mdl",), ("replica",)):  # not a batch axis; not all of the batch's
    with pytest.raises(UserError, match=r"^task.train.inputs_split_mapping = .*drop the "
                                        "mapping") as err:
      TrainSettings(inputs_split_mapping=NestedMap(map_1d=(other,), map_2d=(other, None)))
    assert "\n" not in str(err.value)
