"""A pipelined job's checkpoints across layouts; its eval, decode and export (issue 25, 4-5).

One uninterrupted pipelined run (LmCloudSpmdPipelineTiny at test size: 2 stages of 2
layers on 2 devices, Adam, 4 steps, checkpoints at 2 and 4, eval at 2 and 4, a
beam-search decode at the end) is the reference every other run is held to:

- resumed at step 2 with 4 stages (--restore_checkpoint_dir) and with no pipeline
  (the plain Adam template, scanned, from its own job_log_dir), each ends within
  1e-5 of it, its parameters restacked;
- killed (kill -9) at step 3 and rerun, it ends bitwise equal;
- two processes (the stage axis over DCN) match it;
- the plain model, started from its weights (INIT_FROM, restacked), decodes
  what it decoded, and exports the same weights and StableHLO program.

The CLI runs share a persistent compilation cache (fault_tools.env), so a run
of a program an earlier run compiled skips the compile.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import read_scalars, xla_flags_with_devices
from distributed_test import free_port
from fault_tools import (
    assert_checkpoints_equal,
    command,
    describe,
    env,
    read_checkpoint,
)
from fault_tools import run as run_cli

from paxlike import checkpoints as ckpt_lib
from paxlike import (
    config,
    decoding,
    evaluator,
    experiment,
    initial,
    learners,
    registry,
    relayout,
    resume,
)
from paxlike import export as export_lib
from paxlike import mesh as mesh_lib
from paxlike.errors import UserError
from paxlike.inputs import text
from paxlike.layers import pipeline
from paxlike.models.language_model import restack_tree
from paxlike.partitioning import SpmdPartitioner

LAYERS = 4
SMALL = ["MODEL_DIMS=16", "NUM_HEADS=2", "VOCAB_SIZE=264", "MAX_SEQ_LEN=16",
         "PERCORE_BATCH_SIZE=4", "NUM_TRAIN_STEPS=4", "CHECKPOINT_EVERY_N_STEPS=2",
         "SUMMARY_INTERVAL_STEPS=1", "LR_COS_WARMUP=0", "LR_COS_DECAY_START=0",
         f"NUM_LAYERS={LAYERS}"]  # a global batch of 8 rows on any mesh below
PIPE = "LmCloudSpmdPipelineTiny"  # Adam; 2 stages x 2 unrolled layers, 4 microbatches
PLAIN = "LmCloudSpmdTiny"  # the plain Adam template; with these, the same model, scanned
PLAIN_SETS = ["ACTIVATION='gelu'", "ICI_MESH_SHAPE=[1,2,1]", "USE_REPEATED_LAYER=True"]
STEPS = 4
PLAIN_LAYOUT = pipeline.Layout(LAYERS, True)


# Half the compile time of XLA's CPU backend; every CLI run below compiles with it.
FAST_COMPILE = "--xla_backend_optimization_level=0"


def _env(devices: int) -> dict[str, str]:
  return {"XLA_FLAGS": xla_flags_with_devices(devices, f"{os.environ['XLA_FLAGS']} "
                                              f"{FAST_COMPILE}")}


def run(args: list[str], cwd: Path, devices: int, **extra: str) -> subprocess.CompletedProcess:
  return run_cli(args, cwd, devices, **_env(devices), **extra)


def _args(exp: str, job: Path, sets: list[str], *flags: str) -> list[str]:
  out = [f"--exp={exp}", f"--job_log_dir={job}", "--peak_tflops_per_device=1", *flags]
  for s in SMALL + sets:
    out += ["--set", s]
  return out


def _eval_file(root: Path) -> Path:
  path = root / "test.jsonl"
  path.write_text("".join(json.dumps({"inputs": f"{a}+{a + 1}=", "targets": str(2 * a + 1)})
                          + "\n" for a in range(4)))
  return path


def _params(job: Path, step: int, layout: pipeline.Layout = PLAIN_LAYOUT) -> dict:
  """A checkpoint's parameters (and Adam's moments), restacked to `layout`."""
  ckpt = ckpt_lib.Checkpointer(str(job / "checkpoints"), read_only=True)
  state, _ = ckpt.restore_host(step)
  ckpt.close()
  adam = state["opt_state"][1][0]  # clip_by_global_norm, then praxis_adam
  return restack_tree({"params": state["params"], "mu": adam["mu"], "nu": adam["nu"]},
                      LAYERS, layout)


def _assert_close(got: dict, want: dict, rtol: float = 1e-5) -> None:
  """Every array within rtol of its counterpart, relative to the counterpart's largest entry."""
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want),
                          strict=True):
    scale = float(np.max(np.abs(b))) + 1e-12
    assert float(np.max(np.abs(a - b))) / scale < rtol, jax.tree_util.keystr(path)


def _losses(job: Path) -> list[float]:
  return [v for _, v in read_scalars(job / "summaries" / "train")["loss"]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted pipelined run, with evals through its pipeline and a decode."""
  root = tmp_path_factory.mktemp("pipeline_layout")
  data = _eval_file(root)
  job = root / "reference"
  proc = run(_args(PIPE, job, [f"EVAL_FILES=[{data}]", "EVAL_INTERVAL_STEPS=2"],
                   "--decode_num_beams=2"), root, devices=2)
  assert proc.returncode == 0, describe(proc)
  return root, job, data, proc


def test_eval_runs_through_the_pipeline_and_decode_through_the_plain_model(reference):
  _, job, _, proc = reference
  for step in (2, 4):
    assert f"eval test at step {step}: loss" in proc.stderr, describe(proc)
  name = f"decode_{STEPS:08d}_beams2_a0.6.jsonl"  # a 2-beam decode's own name
  rows = [json.loads(line) for line in
          (job / "decoder_out" / "test" / name).read_text().splitlines()]
  assert len(rows) == 4 and all(len(r["beams"]) == 2 for r in rows)


@pytest.mark.parametrize("how", ["4 stages", "none"])
def test_a_run_resumes_in_another_stage_layout_as_the_unchanged_run(reference, tmp_path, how):
  root, ref, _, _ = reference
  job = tmp_path / "job"
  if how == "4 stages":  # from --restore_checkpoint_dir, on 4 devices, the same global batch
    args = _args(PIPE, job, ["NUM_STAGES=4", "ICI_MESH_SHAPE=[4,1,1,1]",
                             "PERCORE_BATCH_SIZE=2"],
                 f"--restore_checkpoint_dir={ref / 'checkpoints'}", "--restore_checkpoint_step=2")
    devices, source = 4, "2 stages x 2 layers (unrolled)"
    target = "4 stages x 1 layer (unrolled)"
  else:  # the plain template, from its own job_log_dir (a copy of the step-2 checkpoint)
    (job / "checkpoints").mkdir(parents=True)
    shutil.copytree(ref / "checkpoints" / "checkpoint_00000002",
                    job / "checkpoints" / "checkpoint_00000002")
    args = _args(PLAIN, job, PLAIN_SETS)
    devices, source, target = 2, "2 stages x 2 layers (unrolled)", "4 layers, scanned"
  proc = run(args, root, devices=devices)
  assert proc.returncode == 0, describe(proc)
  assert "restored step 2 from" in proc.stderr, describe(proc)
  assert f"from {source} to {target}" in proc.stderr, describe(proc)
  assert "start from zeros" not in proc.stderr  # Adam's moments restack exactly
  np.testing.assert_allclose(_losses(job), _losses(ref)[2:], rtol=1e-5)
  _assert_close(_params(job, STEPS), _params(ref, STEPS))


def test_kill_9_in_a_pipelined_run_resumes_bitwise(reference, tmp_path):
  root, ref, _, _ = reference
  args = _args(PIPE, tmp_path / "job", [], "--nojax_fully_async_checkpoint")
  killed = run(args, root, devices=2, PAXLIKE_TEST_FAULT="kill:step:3")
  assert killed.returncode == -signal.SIGKILL, describe(killed)
  resumed = run(args, root, devices=2)
  assert resumed.returncode == 0, describe(resumed)
  assert "restored step 2 from" in resumed.stderr, describe(resumed)
  assert "restacked" not in resumed.stderr
  assert_checkpoints_equal(read_checkpoint(tmp_path / "job", STEPS), read_checkpoint(ref, STEPS))


def test_two_processes_with_the_stages_over_dcn_match_one_process(reference, tmp_path):
  root, ref, _, _ = reference
  job = tmp_path / "job"
  port = free_port()
  args = _args(PIPE, job, ["ICI_MESH_SHAPE=[1,1,1,1]", "DCN_MESH_SHAPE=[2,1,1,1]"],
               f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
               "--distributed_timeout_s=120")
  procs = [subprocess.Popen(command([*args, f"--process_id={i}"]), cwd=root,
                            env=env(1, **_env(1)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
           for i in (0, 1)]
  outs = [p.communicate(timeout=400) for p in procs]
  for p, (out, err) in zip(procs, outs, strict=True):
    assert p.returncode == 0, f"exit {p.returncode}\n{out}\n{err[-3000:]}"
  np.testing.assert_allclose(_losses(job), _losses(ref), rtol=1e-5)
  _assert_close(_params(job, STEPS), _params(ref, STEPS))


_LOC = re.compile(r"\s?loc\((?:[^()]|\([^()]*\))*\)")


def _program(export_dir: Path) -> str:
  """An export's StableHLO as text, without debug locations."""
  exported = jax.export.deserialize((export_dir / "model.stablehlo").read_bytes())
  return "\n".join(_LOC.sub("", line) for line in exported.mlir_module().splitlines()
                   if not line.startswith("#loc"))


def _plain_job(data: Path, job: Path):
  """The plain model's task, inputs and partitioner, built as main builds them."""
  exp = experiment.instantiate(registry.get(PLAIN), [*SMALL, *PLAIN_SETS, f"EVAL_FILES=[{data}]"])
  configs = experiment.build_checked(exp)
  text.resolve_vocabularies([*configs.datasets, *configs.decode_datasets], None, str(job))
  task = config.build(configs.task)
  inputs = [config.build(c) for c in [*configs.datasets, *configs.decode_datasets]]
  for inp in inputs:
    inp.bind_host(jax.process_count(), jax.process_index())
  train_input = next(i for i in inputs if i.is_training)
  evals = [i for i in inputs[:len(configs.datasets)] if not i.is_training]
  partitioner = SpmdPartitioner(mesh_lib.build([1, 2, 1], None, devices=jax.devices()[:2]),
                                rules=mesh_lib.rules_for(exp))
  return task, train_input, evals, inputs[len(configs.datasets):], partitioner


def test_the_plain_model_decodes_and_exports_what_the_pipelined_job_does(reference, tmp_path):
  root, ref, data, _ = reference
  exported = tmp_path / "pipelined_export"
  proc = run(_args(PIPE, ref, [f"EVAL_FILES=[{data}]"], "--mode=export",
                   "--export_format=stablehlo", "--export_platforms=cpu",
                   f"--export_dir={exported}"), root, devices=2)
  assert proc.returncode == 0, describe(proc)

  job = tmp_path / "plain"
  job.mkdir()
  task, train_input, eval_inputs, decode_inputs, partitioner = _plain_job(data, job)
  model = task.model
  # The plain model started from the pipelined job's weights (INIT_FROM, restacked)
  # evaluates as the pipeline did and decodes what the job decoded.
  init = initial.InitFrom(f"paxlike:{ref}@{STEPS}")
  state, _ = evaluator.restore_for_eval(task, train_input, partitioner, str(job),
                                        init_from=init)
  settings = decoding.DecodeSettings(num_beams=2, **model.special_ids())
  plain = evaluator.Evaluator(model, partitioner, eval_inputs, decode_inputs, str(job),
                              enable_summary_writer=False, settings=settings)
  pipelined_loss = read_scalars(ref / "summaries" / "eval_test_test")["loss"][-1]
  assert pipelined_loss[0] == STEPS
  np.testing.assert_allclose(plain.evaluate(state, STEPS)["test"]["loss"], pipelined_loss[1],
                             rtol=1e-5)
  plain.decode(state, STEPS)
  name = f"decoder_out/test/decode_{STEPS:08d}_beams2_a0.6.jsonl"
  want = [json.loads(line) for line in (ref / name).read_text().splitlines()]
  got = [json.loads(line) for line in (job / name).read_text().splitlines()]
  assert [r["generation"] for r in got] == [r["generation"] for r in want]
  np.testing.assert_allclose([b["log_prob"] for r in got for b in r["beams"]],
                             [b["log_prob"] for r in want for b in r["beams"]], rtol=1e-5)

  # Export: the same artifact from the plain model restored from the pipelined checkpoints.
  state, step = evaluator.restore_for_eval(task, train_input, partitioner, str(job),
                                           restore_dir=str(ref / "checkpoints"))
  exporter = export_lib.get("stablehlo")
  decode_inputs[0].reset()  # the decode above read it to its end
  plan = exporter.check(export_lib.describe(
      "plain", task, train_input, decode_inputs, decoding.DecodeSettings(**model.special_ids()),
      ("cpu",), str(job)))
  ours = tmp_path / "plain_export"
  ours.mkdir()
  # main's export: the parameters in the layout of the model that decodes (unrolled).
  exporter.write(plan, decoding.decoding_model(model, partitioner.to_saveable(state).params)[1],
                 step, str(ours))
  assert (ours / "params.safetensors").read_bytes() == \
      (exported / "params.safetensors").read_bytes()
  # The same program; only its source locations (which frames traced it) may differ.
  assert _program(ours) == _program(exported)
  manifests = [json.loads((d / "manifest.json").read_text()) for d in (ours, exported)]
  for m in manifests:
    del m["experiment"], m["job_log_dir"]
  assert manifests[0] == manifests[1]


# ------------------------------------------------------------ in-process checks


def _stack(layout: pipeline.Layout, shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  layers = [{k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
            for _ in range(layout.num_layers)]
  return pipeline.from_layers(layers, layout)


def test_adafactor_slots_without_a_per_layer_form_start_from_zeros_with_one_warning(
    monkeypatch):
  """praxis's sharded Adafactor (int8 momentum, factored second moments): what is per layer
  restacks exactly, the rest starts from zeros, and one warning counts it."""
  source, target = pipeline.Layout(4, True), pipeline.Layout(4, False, 2, 1)
  tx = learners.sharded_adafactor(lambda _: 1e-3, learners.AdafactorSettings(beta1=0.9))
  shapes = {"w": (8, 6), "b": (6,)}  # one layer's matrix and vector
  params = {"transformer": _stack(source, shapes), "emb": np.ones((5, 6), np.float32)}
  rng = np.random.default_rng(1)
  slots = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(x.dtype),  # any values
                       jax.eval_shape(tx.init, params))
  stored = {"step": np.int32(3), "params": params, "opt_state": dict(slots._asdict())}
  target_params = {"transformer": _stack(target, shapes), "emb": params["emb"]}
  abstract = jax.eval_shape(lambda p: {"step": np.int32(0), "params": p,
                                       "opt_state": dict(tx.init(p)._asdict())}, target_params)

  class Model:  # the LM's layout contract
    def layout(self):
      return target

    def stack_form(self):
      return pipeline.StackForm()

  plan = relayout.change(stored, Model())
  assert plan == relayout.Restack(source, target, (("transformer",),))
  restacked, fresh = plan.apply(stored, abstract)
  assert ckpt_lib.first_mismatch(abstract, restacked) is None
  # Per layer: the matrix's factored moments and the vector's row moment. Not: the
  # vector's column moment (a mean over the stacked layers) and the int8 momentum with
  # its scales (one per column over the first, stacked, dim).
  assert len(fresh) == 10  # 5 in each of the 2 unrolled x_layers_j of a stage
  assert {(n.split("/")[1], n.split("/")[-1]) for n in fresh} == {
      ("m", "w"), ("m", "b"), ("m_scale", "w"), ("m_scale", "b"), ("vc", "b")}
  got = restacked["opt_state"]["vr"]["transformer"]["pipeline"]
  want = stored["opt_state"]["vr"]["transformer"]["repeat"]
  np.testing.assert_array_equal(got["x_layers_1"]["w"][0, 1], want["w"][3])  # layer 3
  np.testing.assert_array_equal(got["x_layers_0"]["b"][0], want["b"][[0, 2]])
  assert not restacked["opt_state"]["vc"]["transformer"]["pipeline"]["x_layers_0"]["b"].any()
  lines = []
  monkeypatch.setattr(relayout.logging, "info", lambda msg, *a: lines.append(msg % a))
  monkeypatch.setattr(relayout.logging, "warning", lambda msg, *a: lines.append(msg % a))
  plan.log("checkpoint step 3", fresh)
  assert lines[0] == ("restacked the layers of checkpoint step 3 from 4 layers, scanned to "
                      "2 stages x 2 layers (unrolled)")
  assert len(lines) == 2 and lines[1].startswith("10 optimizer slot arrays of the layer stack")


def test_other_differences_are_still_refused_in_one_line(reference, tmp_path):
  """A wider model, or another layer count, is refused before anything is read."""
  _, ref, data, _ = reference
  source = resume.Source(ckpt_lib.Checkpointer(str(ref / "checkpoints"), read_only=True), 2,
                         False)
  for change, problem in (
      ("MODEL_DIMS=32", "params/final_norm/bias has shape (16,) float32 in the checkpoint but "
                        "shape (32,) float32 in this run"),
      ("NUM_LAYERS=8", "its layer stack holds 4 layers (2 stages x 2 layers (unrolled)) but "
                       "this run's holds 8")):
    exp = experiment.instantiate(registry.get(PLAIN), [*SMALL, *PLAIN_SETS, change])
    task = config.build(experiment.task_config(exp))
    train_input = config.build(exp.datasets()[0])
    abstract = resume.abstract_train_state(task, train_input)
    with pytest.raises(UserError) as e:
      resume.check_compatible(source, 2, abstract, task.model)
    assert problem in str(e.value) and "\n" not in str(e.value)
