"""A pipelined LM trains as the same layers run plainly (8 fake CPU devices, float32).

Started from the same weights (the plain model's, restacked into the pipeline's
[circular_repeat, stages, ...] layout), GPipe and circular schedules give the
plain model's loss at every step and its parameters after three Adam steps.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from paxlike import config, experiment, registry
from paxlike import mesh as mesh_lib
from paxlike import train_state as ts
from paxlike.layers import pipeline
from paxlike.partitioning import SpmdPartitioner
from paxlike.steps import make_train_step

SMALL = ["NUM_LAYERS=4", "MODEL_DIMS=32", "DIMS_PER_HEAD=8", "VOCAB_SIZE=64", "MAX_SEQ_LEN=16",
         "LR_COS_WARMUP=0", "LR_COS_DECAY_START=0"]
BATCH = 16
STEPS = 3


def _task(overrides: list[str]):
  exp = experiment.instantiate(registry.get("LmCloudSpmdPipelineTiny"), SMALL + overrides)
  return exp, config.build(experiment.task_config(exp))


def _batches(vocab: int, seq: int) -> list[dict[str, np.ndarray]]:
  rng = np.random.default_rng(0)
  out = []
  for _ in range(STEPS):
    ids = rng.integers(1, vocab, (BATCH, seq + 1)).astype(np.int32)
    weights = (rng.random((BATCH, seq)) > 0.1).astype(np.float32)
    out.append({"ids": ids[:, :-1], "labels": ids[:, 1:], "weights": weights})
  return out


def _train(model, task, params, batches, partitioner):
  """Three steps from params; (losses, final params as numpy)."""
  tx = task.learner.transform()
  sample = model.init_batch({k: jax.ShapeDtypeStruct(v.shape, v.dtype)
                             for k, v in batches[0].items()})
  _, logical = ts.logical_specs(model, tx, sample)
  partitioner.set_state_specs(logical)
  state = partitioner.shard_state(ts.TrainState(step=np.zeros((), np.int32), params=params,
                                                opt_state=tx.init(params)))
  step = partitioner.compile(make_train_step(model, tx, task.learner.lr_schedule(),
                                             partitioner.reduce))
  losses = []
  with partitioner.context():
    for batch in batches:
      state, metrics = step(state, partitioner.shard_batch(batch), jax.random.key(0))
      losses.append(float(metrics["loss"]))
  return losses, jax.tree.map(np.asarray, jax.device_get(state.params))


@pytest.fixture(scope="module")
def reference():
  """The plain (unpipelined, scanned) model's run on one device."""
  _, task = _task([])
  return plain_run(task, _batches(task.model.vocab_size, 16))


def plain_run(task, batches):
  """(initial params, batches, losses, final params) of the task's model unpipelined, on
  one device: what a pipelined run must reproduce (also llama_pipeline_test)."""
  plain = task.model.unpipelined()
  sample = plain.init_batch({k: jax.ShapeDtypeStruct(v.shape, v.dtype)
                             for k, v in batches[0].items()})
  params = jax.tree.map(np.asarray, jax.device_get(
      ts.init_fn(plain, task.learner.transform(), sample)(jax.random.key(3)).params))
  partitioner = SpmdPartitioner(mesh_lib.build([1, 1, 1], devices=jax.devices()[:1]))
  losses, final = _train(plain, task, params, batches, partitioner)
  return params, batches, losses, final


def _max_rel(a: dict, b: dict) -> float:
  """The largest |a - b| / |a| over the parameters (each parameter's norm)."""
  worst = 0.0
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    worst = max(worst, float(np.linalg.norm(x - y) / (np.linalg.norm(x) + 1e-12)))
  return worst


@pytest.mark.parametrize("stages,microbatches,repeat,repeated,mesh", [
    (2, 4, 1, False, [2, 1, 2, 1]),  # GPipe: 2 stages x 2 layers unrolled, 2-way data
    (4, 8, 1, True, [4, 1, 1, 1]),  # GPipe: 4 stages x 1 layer scanned
    (2, 4, 2, False, [2, 1, 1, 2]),  # circular: 2 passes over 2 stages of 1 layer, 2-way model
])
def test_pipeline_trains_as_the_plain_stack(reference, stages, microbatches, repeat, repeated,
                                            mesh):
  assert_trains_as_plain(_task, reference, stages, microbatches, repeat, repeated, mesh)


def assert_trains_as_plain(make_task, reference, stages: int, microbatches: int, repeat: int,
                           repeated: bool, mesh: list[int]) -> None:
  """The pipelined task (make_task(overrides)) started from the reference's weights gives its
  losses at every step and its parameters at the end, within 1e-5 (also llama_pipeline_test)."""
  params, batches, want_losses, want_final = reference
  exp, task = make_task([f"NUM_STAGES={stages}", f"NUM_MICROBATCHES={microbatches}",
                         f"CIRCULAR_REPEAT={repeat}", f"USE_REPEATED_LAYER={repeated}",
                         f"ICI_MESH_SHAPE={mesh}"])
  model = task.model
  assert model.layout() == pipeline.Layout(exp.NUM_LAYERS, repeated, stages, repeat)
  devices = jax.devices()[:int(np.prod(mesh))]
  partitioner = SpmdPartitioner(mesh_lib.build(mesh, [1, 1, 1, 1], devices=devices),
                                rules=mesh_lib.rules_for(exp))
  losses, final = _train(model, task, model.restack_params(params), batches, partitioner)
  np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
  assert want_losses[-1] < want_losses[0]  # it trained
  assert _max_rel(want_final, model.unpipelined().restack_params(final)) < 1e-5


def test_layouts_round_trip_and_the_bubble():
  rng = np.random.default_rng(0)
  stack = {"repeat": {"w": rng.normal(size=(12, 3, 2)), "scale": rng.normal(size=(12, 3))}}
  layouts = [pipeline.Layout(12, False), pipeline.Layout(12, True, 3, 2),
             pipeline.Layout(12, False, 2, 3), pipeline.Layout(12, True, 4)]
  for layout in layouts:
    there = pipeline.restack(stack, 12, layout)
    assert pipeline.layout_of(there, 12) == layout
    back = pipeline.restack(there, 12, pipeline.Layout(12, True))
    np.testing.assert_array_equal(back["repeat"]["w"], stack["repeat"]["w"])
  # Logical layer l sits at repeat l // (S x L), stage (l // L) % S, slot l % L.
  circ = pipeline.restack(stack, 12, pipeline.Layout(12, True, 3, 2))  # L = 2
  np.testing.assert_array_equal(circ["pipeline"]["repeat"]["w"][1, 2, 0], stack["repeat"]["w"][10])
  assert pipeline.bubble_fraction(4, 8) == pytest.approx(3 / 11)
  assert pipeline.bubble_fraction(4, 8, 2) == pytest.approx(3 / 19)
