"""A pipelined experiment as Pax configures it, refused where it does not fit, and accounted.

praxis's tree of a pipelined LM (`stacked_transformer_tpl` a PipelinedTransformer
around one stage's StackedTransformer(Repeated)), read back onto the model;
every refusal of Pax's pipeline hyperparameters in one line naming both
numbers; the schedule and its bubble in the dry run, run_env.json and the
log, with MFU counted on model FLOPs only.
"""

from __future__ import annotations

import copy
import json

import fiddle as fdl
import jax
import pytest
from conftest import describe, run_cli

from paxlike import config, dry_run, experiment, flops, registry
from paxlike import train_state as ts
from paxlike.errors import UserError
from paxlike.layers import pipeline
from paxlike.pax import layers, pax_fiddle
from paxlike.pax.layers import transformers

PIPE = "LmCloudSpmdPipelineTiny"  # 2 stages x 2 layers, 4 microbatches, mesh [2, 1, 1, 1]
CIRCULAR = "LmCloudSpmdPipelineMultislice2BCircular"  # Pax's: 2 stages, repeat 3, 18 layers
SMALL = ["MODEL_DIMS=16", "NUM_HEADS=2", "VOCAB_SIZE=32", "MAX_SEQ_LEN=8",
         "PERCORE_BATCH_SIZE=2"]  # a global batch of 16 on the 8 test devices


def _exp(name_or_cls, overrides=()):
  cls = registry.get(name_or_cls) if isinstance(name_or_cls, str) else name_or_cls
  return experiment.instantiate(cls, list(overrides))


def _model(name_or_cls, overrides=()):
  exp = _exp(name_or_cls, overrides)
  return config.build(experiment.build_checked(exp).task).model


def _edited(base, edit):
  class Edited(registry.get(base)):
    def task(self):
      task_p = super().task()
      edit(task_p)
      return task_p

  return Edited


def _stacked(task_p):
  return task_p.model.lm_tpl.stacked_transformer_tpl


def _layer_p(task_p):
  """The layer template, found as Pax's c4.py and nvidia.py find it."""
  stacked_p = _stacked(task_p)
  if fdl.get_callable(stacked_p) == transformers.PipelinedTransformer:
    stacked_p = stacked_p.pipeline_stage
  if issubclass(fdl.get_callable(stacked_p), transformers.StackedTransformerRepeated):
    stacked_p = stacked_p.block
  return stacked_p.transformer_layer_params_tpl


def _count(model) -> int:
  batch = {k: jax.ShapeDtypeStruct((1, 8), jax.numpy.int32) for k in model.input_features()}
  params = jax.eval_shape(lambda: ts.init_params(model, jax.random.key(0),
                                                 model.init_batch(batch)))
  return ts.count_params(params)


# ------------------------------------------------------------ praxis's tree


@pytest.mark.parametrize("repeated", [False, True])
def test_the_tree_of_a_pipelined_lm_is_paxs_pipelined_transformer(repeated):
  seen = {}

  def look(task_p):  # the first task(): the --set check builds it again with other values
    seen.setdefault("stacked", copy.deepcopy(_stacked(task_p)))

  _model(_edited(CIRCULAR, look), [f"USE_REPEATED_LAYER={repeated}"])
  p = seen["stacked"]
  assert fdl.get_callable(p) is layers.PipelinedTransformer
  assert (p.num_pipeline_stages, p.circular_repeat, p.num_pipeline_microbatches,
          p.pipeline_microbatch_size, p.stream_io, p.pipeline_broadcast_inputs,
          p.checkpoint_policy) == (2, 3, None, 8, True, False,
                                   layers.AutodiffCheckpointType.SAVE_NOTHING)
  stage = p.pipeline_stage
  if repeated:  # Pax: num_layers 1 in the block, x_times the stage's layers
    assert fdl.get_callable(stage) is layers.StackedTransformerRepeated
    assert (stage.x_times, stage.block.num_layers) == (3, 1)
  else:
    assert fdl.get_callable(stage) is layers.StackedTransformer
    assert stage.num_layers == 18 // (2 * 3)


def test_an_untouched_pipelined_tree_builds_the_same_model():
  def read(task_p):
    assert _layer_p(task_p).tr_atten_tpl.cls == layers.DotProductAttention

  assert repr(_model(_edited(CIRCULAR, read))) == repr(_model(CIRCULAR))


def test_edits_of_the_stage_and_the_pipeline_reach_the_model():
  def edit(task_p):
    layer_p = _layer_p(task_p)
    layer_p.tr_atten_tpl.use_bias = True
    layer_p.tr_fflayer_tpl.activation_tpl = pax_fiddle.Config(layers.ReLU)
    stacked_p = _stacked(task_p)
    stacked_p.num_pipeline_microbatches, stacked_p.pipeline_microbatch_size = 4, None
    stacked_p.stream_io = False
    stacked_p.pipeline_stage.num_layers = 1  # 1 per stage x 2 stages x 3 repeats

  m = _model(_edited(CIRCULAR, edit))
  assert (m.use_bias, m.activation, m.num_microbatches, m.microbatch_size, m.stream_io,
          m.num_layers, m.num_stages, m.circular_repeat) == (True, "relu", 4, None, False, 6,
                                                             2, 3)


def test_a_task_that_builds_its_own_pipeline_gets_that_model(caplog):
  """A PipelinedTransformer built in task() around a repeated stage, with sharding hints."""
  def build(task_p):
    stage = copy.deepcopy(_stacked(task_p).pipeline_stage)  # 2 layers, Pax's fields
    stage.num_layers = 1
    _stacked_p = pax_fiddle.Config(
        layers.PipelinedTransformer,
        pipeline_stage=pax_fiddle.Config(layers.StackedTransformerRepeated, block=stage,
                                         x_times=2),
        num_pipeline_stages=2, circular_repeat=2, num_pipeline_microbatches=2)
    _stacked_p.weight_split_dims_mapping.stages = ["stage"]
    task_p.model.lm_tpl.stacked_transformer_tpl = _stacked_p

  exp = _exp(_edited(PIPE, build), SMALL)
  with caplog.at_level("WARNING"):
    m = config.build(experiment.build_checked(exp).task).model
  assert (m.num_layers, m.use_repeated_layer, m.num_stages, m.circular_repeat,
          m.num_microbatches, m.microbatch_size) == (8, True, 2, 2, 2, None)
  assert m.layout() == pipeline.Layout(8, True, 2, 2)
  # The same parameters as the unpipelined model of 8 layers, in [R, S, L, ...] stacks.
  assert _count(m) == _count(m.unpipelined())
  hint = [r.getMessage() for r in caplog.records if "weight_split_dims_mapping" in r.getMessage()]
  assert hint and "not applied" in hint[0] and "stacked_transformer_tpl" in hint[0]


def _set(*path_value):
  *path, value = path_value

  def edit(task_p):
    node = _stacked(task_p)
    for name in path[:-1]:
      node = getattr(node, name)
    setattr(node, path[-1], value)

  return edit


@pytest.mark.parametrize("edit,names", [
    (_set("num_pipeline_stages", 4), ("num_pipeline_stages = 4", "NUM_STAGES=2")),
    (_set("num_pipeline_microbatches", None), ("num_pipeline_microbatches", "both None")),
    (_set("pipeline_broadcast_inputs", True), ("pipeline_broadcast_inputs = True",)),
    (_set("circular_repeat", 2), ("num_pipeline_microbatches = 1", "num_pipeline_stages = 2")),
    (_set("pipeline_stage", "num_layers", 0), ("pipeline_stage.num_layers = 0",)),
    (_set("pipeline_stage", pax_fiddle.Config(layers.PipelinedTransformer)),
     ("pipeline_stage = pax_fiddle.Config(PipelinedTransformer)",)),
    (_set("bf16_accum_in_fp32", True), ("bf16_accum_in_fp32",)),
    (lambda t: setattr(t.model.lm_tpl, "stacked_transformer_tpl",
                       copy.deepcopy(_stacked(t).pipeline_stage)),
     ("Config(StackedTransformer) on a pipelined experiment (NUM_STAGES=2)",)),
])
def test_a_pipeline_edit_paxlike_cannot_honour_is_one_line_naming_the_path(edit, names):
  overrides = ["NUM_MICROBATCHES=1"] if "num_pipeline_microbatches = 1" in names[0] else []
  with pytest.raises(UserError) as err:
    _model(_edited(PIPE, edit), overrides)
  text = str(err.value)
  assert "\n" not in text and "task_p.model.lm_tpl.stacked_transformer_tpl" in text, text
  assert all(n in text for n in names), text


def test_a_pipeline_on_an_experiment_without_a_stage_axis_is_refused():
  def edit(task_p):
    task_p.model.lm_tpl.stacked_transformer_tpl = pax_fiddle.Config(
        layers.PipelinedTransformer, pipeline_stage=_stacked(task_p),
        num_pipeline_stages=2, num_pipeline_microbatches=2)

  with pytest.raises(UserError, match="no stage axis.*TransformerLmSpmdPipelineAdafactor"):
    _model(_edited("LmCloudSpmdTiny", edit))


# ------------------------------------------------- Pax's pipeline hyperparameters


@pytest.mark.parametrize("overrides,numbers", [
    (["NUM_LAYERS=6", "NUM_STAGES=2", "CIRCULAR_REPEAT=2", "ICI_MESH_SHAPE=[2,1,1,1]"],
     ("NUM_LAYERS=6", "2 x 2 = 4")),
    (["NUM_MICROBATCHES=None"], ("NUM_MICROBATCHES", "MICROBATCH_SIZE")),
    (["NUM_STAGES=4", "NUM_LAYERS=8"], ("= 2)", "NUM_STAGES=4")),
    (["CIRCULAR_REPEAT=2", "NUM_MICROBATCHES=1"], ("NUM_MICROBATCHES=1", "NUM_STAGES=2")),
    (["ICI_MESH_SHAPE=[2,1,1]"], ("four", "[2, 1, 1]")),
])
def test_a_pipeline_hyperparameter_that_does_not_fit_is_one_line(overrides, numbers):
  with pytest.raises(UserError) as err:
    _exp(PIPE, overrides)
  text = str(err.value)
  assert "\n" not in text and all(n in text for n in numbers), text


@pytest.mark.parametrize("overrides,numbers", [
    (["NUM_MICROBATCHES=3"], ("NUM_MICROBATCHES=3", "16 rows")),
    (["NUM_MICROBATCHES=None", "MICROBATCH_SIZE=5"], ("MICROBATCH_SIZE=5", "16 rows")),
    (["NUM_MICROBATCHES=None", "MICROBATCH_SIZE=16", "CIRCULAR_REPEAT=2"],
     ("makes 1 microbatch, fewer than", "NUM_STAGES=2")),
    # The pipeline's gradient accumulation is named by the knob that sets it; its
    # NUM_MICROBATCHES (4) are the pipeline's own.
    (["GRADIENT_ACCUMULATION_STEPS=3"], ("GRADIENT_ACCUMULATION_STEPS=3 must be", "batch 16",
                                         "change GRADIENT_ACCUMULATION_STEPS")),
    # praxis's stream buffer is [stages, M / stages]: M a multiple of the stages.
    (["STREAM_IO=True", "NUM_MICROBATCHES=3", "PERCORE_BATCH_SIZE=3"],
     ("STREAM_IO=True", "24 rows makes 3 microbatches on NUM_STAGES=2", "multiple of 2")),
])
def test_microbatches_that_do_not_split_the_batch_are_one_line(overrides, numbers):
  exp = _exp(PIPE, [*SMALL, *overrides])
  experiment.build_checked(exp)
  with pytest.raises(UserError) as err:
    dry_run.analyse(exp)  # refused before anything is compiled
  text = str(err.value)
  assert "\n" not in text and all(n in text for n in numbers), text
  assert "NUM_MICROBATCHES=3 must" not in text


def test_stream_io_takes_microbatches_that_split_over_the_stages():
  pipeline.check_batch(24, 2, 4, None, 1, stream_io=True)
  pipeline.check_batch(24, 3, None, 8, 1, stream_io=True)  # 3 microbatches on 3 stages
  with pytest.raises(UserError, match=r"makes 3 microbatches on NUM_STAGES=2"):
    pipeline.check_batch(24, 2, None, 8, 1, stream_io=True)


def test_a_four_axis_mesh_on_an_unpipelined_experiment_is_one_line():
  """Four axes without NUM_STAGES are the expert-parallel mesh; beside a 3-axis DCN shape the
  line names both 4-axis meshes and where a pipeline's comes from."""
  with pytest.raises(UserError) as err:
    _exp("LmCloudSpmdTiny", ["ICI_MESH_SHAPE=[2,1,1,1]", "DCN_MESH_SHAPE=[1,1,1]"])
  text = str(err.value)
  assert "\n" not in text and "[2, 1, 1, 1]" in text and "TransformerLmSpmdPipeline" in text
  assert "data_expert" in text


@pytest.mark.parametrize("mode,setting,error", [
    ("train", "NUM_MICROBATCHES=3", "NUM_MICROBATCHES=3 does not divide the batch of 4 rows."),
    # Refused by the step's batch check, which comes after the job's directory is made.
    ("train", "GRADIENT_ACCUMULATION_STEPS=3", "GRADIENT_ACCUMULATION_STEPS=3 must be a "
     "positive divisor of the global batch 4"),
    ("dry_run", "GRADIENT_ACCUMULATION_STEPS=3", "GRADIENT_ACCUMULATION_STEPS=3 must be a "
     "positive divisor of the global batch 4"),
])
def test_the_cli_refuses_with_exit_2_and_leaves_no_job_dir(tmp_path, mode, setting, error):
  job = tmp_path / "job"
  proc = run_cli([f"--exp={PIPE}", f"--job_log_dir={job}", f"--mode={mode}", "--set", setting,
                  *[a for s in SMALL for a in ("--set", s)]], cwd=tmp_path, devices=2)
  assert proc.returncode == 2, describe(proc)
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and errors[0].startswith(f"error: {error}"), describe(proc)
  assert not job.exists()
  # No schedule of microbatches the batch cannot make is logged before the refusal.
  assert "pipeline: GPipe" not in proc.stderr + proc.stdout, describe(proc)


# ---------------------------------------------------------------- accounting


@pytest.mark.parametrize("s,m,r,bubble,iters", [
    (2, 4, 1, 1 / 5, 5), (4, 8, 1, 3 / 11, 11), (2, 4, 2, 1 / 9, 9), (4, 8, 2, 3 / 19, 19)])
def test_the_schedule_record_has_paxs_bubble(s, m, r, bubble, iters):
  model = _model(PIPE, [*SMALL, "NUM_LAYERS=8", f"NUM_STAGES={s}", f"NUM_MICROBATCHES={m}",
                        f"CIRCULAR_REPEAT={r}", f"ICI_MESH_SHAPE=[{s},1,1,1]"])
  rec = flops.pipeline_schedule(model, 32)
  assert rec == {"schedule": "gpipe" if r == 1 else "circular", "stages": s, "microbatches": m,
                 "microbatch_size": 32 // m, "circular_repeat": r,
                 "layers_per_stage": 8 // (s * r), "stream_io": False, "scanned_stage": False,
                 "iteration_remat": True, "layer_remat": False, "iterations": iters,
                 "bubble_fraction": pytest.approx(bubble)}
  line = flops.describe_pipeline(rec)
  assert f"bubble {100 * bubble:.1f}%" in line and "MFU counts model FLOPs only" in line
  assert flops.pipeline_schedule(model.unpipelined(), 32) is None


@pytest.mark.parametrize("policy", [
    "SAVE_EVERYTHING", layers.AutodiffCheckpointType.SAVE_EVERYTHING,
    "SAVE_NOTHING", layers.AutodiffCheckpointType.SAVE_NOTHING])
def test_the_schedule_record_reads_pax_remat_enums_as_their_names(policy):
  class Scanned(registry.get(PIPE)):
    CHECKPOINT_POLICY = policy
    USE_REPEATED_LAYER = True

  rec = flops.pipeline_schedule(_model(Scanned, SMALL), 16)
  remat = "NOTHING" in str(policy)
  assert (rec["iteration_remat"], rec["layer_remat"]) == (remat, remat)


def test_mfu_counts_the_models_flops_not_the_pipelines():
  model = _model(PIPE, SMALL)
  specs = {k: jax.ShapeDtypeStruct((16, 8), jax.numpy.int32) for k in model.input_features()}
  assert model.model_flops_per_step(specs) == model.unpipelined().model_flops_per_step(specs)


def test_the_dry_run_reports_the_schedule_and_the_bubble():
  exp = _exp(PIPE, [*SMALL, "NUM_LAYERS=2", "NUM_MICROBATCHES=None", "MICROBATCH_SIZE=4"])
  experiment.build_checked(exp)
  report = {"experiment": "x", "overrides": {}, "target": "tpu_v5p", **dry_run.analyse(exp)}
  assert report["pipeline"] == {
      "schedule": "gpipe", "stages": 2, "microbatches": 4, "microbatch_size": 4,
      "circular_repeat": 1, "layers_per_stage": 1, "stream_io": False, "scanned_stage": False,
      "iteration_remat": True, "layer_remat": False, "iterations": 5,
      "bubble_fraction": 0.2}
  json.dumps(report)  # dry_run.json holds it as it is
  report["fits"] = dry_run.fits(report)
  table = dry_run.format_table(report, "tpu_v5p")
  assert "mesh (stage, replica, data, mdl)  [2, 1, 1, 1]" in table
  assert "GPipe: 2 stages x 1 layer (unrolled), 4 microbatches of 4 rows" in table
  assert "5 / 20.0% of each stage's iterations idle" in table
  assert "in-flight memory" in table and "included in the compiled peak" in table
  # The unrolled stage's table names the scanned one as the way to hold less.
  assert "a scanned stage (USE_REPEATED_LAYER=True) holds one layer's at a time" in table
  # A stage of either form that rematerialises nothing (SAVE_EVERYTHING) is not told
  # to scan: it holds every iteration's activations.
  for scanned in (True, False):
    report["pipeline"] = {**report["pipeline"], "scanned_stage": scanned,
                          "iteration_remat": False}
    table = dry_run.format_table(report, "tpu_v5p")
    assert "USE_REPEATED_LAYER=True" not in table and "of every iteration" in table
  # The table and the run's log line name a circular schedule alike.
  report["pipeline"] = {**report["pipeline"], "schedule": "circular", "circular_repeat": 2}
  assert "circular (repeat 2): 2 stages" in dry_run.format_table(report, "tpu_v5p")
  assert flops.describe_pipeline(report["pipeline"]).startswith("pipeline: circular (repeat 2), ")


def test_a_training_run_records_the_schedule_in_run_env(tmp_path):
  job = tmp_path / "job"
  sets = [*SMALL, "NUM_LAYERS=2", "NUM_TRAIN_STEPS=2", "SUMMARY_INTERVAL_STEPS=1",
          "CHECKPOINT_EVERY_N_STEPS=2", "NUM_MICROBATCHES=2"]
  proc = run_cli([f"--exp={PIPE}", f"--job_log_dir={job}",
                  *[a for s in sets for a in ("--set", s)]], cwd=tmp_path, devices=2)
  assert proc.returncode == 0, describe(proc)
  env = json.loads((job / "run_env.json").read_text())
  assert env["pipeline"] == {
      "schedule": "gpipe", "stages": 2, "microbatches": 2, "microbatch_size": 2,
      "circular_repeat": 1, "layers_per_stage": 1, "stream_io": False, "scanned_stage": False,
      "iteration_remat": True, "layer_remat": False, "iterations": 3,
      "bubble_fraction": pytest.approx(1 / 3)}
  log = proc.stdout + proc.stderr
  assert ("pipeline: GPipe, 2 stages x 1 layer (unrolled), 2 microbatches of 2 rows, "
          "3 iterations, bubble 33.3%") in log, describe(proc)
  assert "MFU counts model FLOPs only" in log, describe(proc)


def test_sharded_adafactor_slots_of_stage_weights_keep_the_stage_axis():
  """praxis's ShardedAdafactor keeps an int8 momentum and its float scale of shape
  param.shape[1:]: for [repeats, stages, ...] weights that scale is nearly the whole
  weight, so it is sharded as the weight is (over 'stage'), not replicated."""
  from jax.sharding import PartitionSpec

  from paxlike.pax.tasks.lm import model_params

  class Adafactor(registry.get(PIPE)):
    def task(self):
      task_p = super().task()
      model_params.set_default_adafactor(task_p, 1e-3, 0.0)
      return task_p

  task = config.build(experiment.build_checked(_exp(Adafactor, SMALL)).task)
  batch = {k: jax.ShapeDtypeStruct((1, 8), jax.numpy.int32) for k in task.model.input_features()}
  abstract, specs = ts.logical_specs(task.model, task.learner.transform(),
                                     task.model.init_batch(batch))
  leaves = jax.tree.leaves(abstract.opt_state)
  spec_leaves = jax.tree.leaves(specs.opt_state, is_leaf=lambda x: isinstance(x, PartitionSpec))
  assert len(leaves) == len(spec_leaves)
  scales = [(leaf.shape, spec) for leaf, spec in zip(leaves, spec_leaves, strict=True)
            if leaf.dtype == jax.numpy.float32 and leaf.ndim >= 3 and leaf.shape[0] == 2]
  assert scales and all(spec and spec[0] == pipeline.STAGE_AXIS for _, spec in scales), scales


def test_a_scanned_stage_holds_one_layers_activations_at_a_time():
  """A scanned stage rematerialises each of its layers by CHECKPOINT_POLICY (Pax's
  StackedTransformerRepeated stage), so the compiled step's temporaries stay put as the
  stage gets more layers (without it, the iteration's backward pass held every layer's
  activations, here mostly attention scores: 1.5x the temporaries for twice the layers)."""
  long_rows = ["MODEL_DIMS=16", "NUM_HEADS=8", "VOCAB_SIZE=32", "MAX_SEQ_LEN=256",
               "PERCORE_BATCH_SIZE=2", "CHECKPOINT_POLICY=SAVE_NOTHING"]

  def temporaries(layers_per_stage):
    exp = _exp(PIPE, [*long_rows, f"NUM_LAYERS={2 * layers_per_stage}",
                      "USE_REPEATED_LAYER=True"])
    experiment.build_checked(exp)
    report = dry_run.analyse(exp)
    assert report["pipeline"]["layer_remat"] is True
    return report["compiled_memory_per_device"]["temp"]

  two, four = temporaries(2), temporaries(4)
  assert four < 1.05 * two, (two, four)
