"""Device meshes on 8 fake CPU devices: shapes, errors, and sharded training."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import NUM_FAKE_DEVICES, TINY, train_in_process

from paxlike import mesh
from paxlike.errors import UserError

# Global batch = PERCORE_BATCH_SIZE x 8 local devices = 8, divisible by data=4.
SMALL = ["PERCORE_BATCH_SIZE=1", "MAX_SEQ_LEN=16", "NUM_TRAIN_STEPS=4",
         "SUMMARY_INTERVAL_STEPS=1", "LR_COS_WARMUP=1", "LR_COS_DECAY_START=1"]


def test_fake_devices_are_there():
  assert jax.device_count() == NUM_FAKE_DEVICES


def test_mesh_axes_and_shape():
  m = mesh.build([1, 4, 2])
  assert m.axis_names == ("replica", "data", "mdl")
  assert dict(m.shape) == {"replica": 1, "data": 4, "mdl": 2}
  assert mesh.batch_divisor(m) == 4
  assert sorted(d.id for d in m.devices.flat) == sorted(d.id for d in jax.devices())


def test_mesh_that_does_not_match_the_device_count_names_both_numbers():
  with pytest.raises(UserError) as e:
    mesh.build([1, 3, 1])
  msg = str(e.value)
  assert "[1, 3, 1]" in msg
  assert "needs 3 devices" in msg and "8 are available" in msg


def test_a_mesh_refused_on_one_device_says_one_is_available():
  with pytest.raises(UserError) as e:
    mesh.build([1, 8, 1], devices=jax.devices()[:1])
  assert str(e.value) == (
      "the mesh ICI_MESH_SHAPE=[1, 8, 1] x DCN_MESH_SHAPE=[1, 1, 1] needs 8 devices but 1 is "
      "available; change the mesh shape or the device count.")
  with pytest.raises(UserError, match=r"needs 1 device but 8 are available;"):
    mesh.build([1, 1, 1])


def test_mesh_with_the_wrong_rank_fails():
  with pytest.raises(UserError, match="three|3 entries"):
    mesh.build([2, 4])


@pytest.fixture(scope="module")
def sharded_and_single(tmp_path_factory):
  sharded = train_in_process(TINY, [*SMALL, "ICI_MESH_SHAPE=[1, 4, 2]"],
                             tmp_path_factory.mktemp("sharded"), num_devices=8,
                             enable_checkpoint_saving=False)
  single = train_in_process(TINY, [*SMALL, "ICI_MESH_SHAPE=[1, 1, 1]"],
                            tmp_path_factory.mktemp("single"), num_devices=1,
                            enable_checkpoint_saving=False)
  return sharded, single


def test_params_are_sharded_over_mdl(sharded_and_single):
  (result, _, partitioner), _ = sharded_and_single
  assert dict(partitioner.mesh.shape) == {"replica": 1, "data": 4, "mdl": 2}
  emb = result.state.params["softmax"]["embedding"]
  assert emb.shape == (256, 64)
  assert "mdl" in tuple(emb.sharding.spec)
  assert len(emb.sharding.device_set) == 8
  shard_shapes = {s.data.shape for s in emb.addressable_shards}
  assert all(np.prod(s) < np.prod(emb.shape) for s in shard_shapes), shard_shapes
  # vocab over mdl (2) and embed over data (4).
  assert shard_shapes == {(128, 16)}

  ffn1 = result.state.params["transformer"]["repeat"]["ffn"]["ffn1"]["w"]
  assert "mdl" in tuple(ffn1.sharding.spec)
  assert {s.data.shape for s in ffn1.addressable_shards} == {(2, 16, 128)}


def test_optimizer_slots_are_sharded_like_their_params(sharded_and_single):
  (result, _, _), _ = sharded_and_single
  emb = result.state.params["softmax"]["embedding"]
  slots = [x for x in jax.tree.leaves(result.state.opt_state) if x.shape == emb.shape]
  assert len(slots) >= 2  # Adam's mu and nu
  for slot in slots:
    assert slot.sharding.is_equivalent_to(emb.sharding, emb.ndim)


def test_sharded_training_matches_single_device_training(sharded_and_single):
  (sharded, _, _), (single, _, _) = sharded_and_single
  assert sharded.final_step == single.final_step == 4
  sharded_loss = [h["loss"] for h in sharded.history]
  single_loss = [h["loss"] for h in single.history]
  np.testing.assert_allclose(sharded_loss, single_loss, rtol=1e-4)
  assert sharded_loss[-1] < sharded_loss[0]
  # Same parameters up to float32 reduction order (observed: ~1e-7 relative).
  sharded_params = jax.tree_util.tree_flatten_with_path(jax.device_get(sharded.state.params))[0]
  single_params = jax.tree.leaves(jax.device_get(single.state.params))
  for (path, a), b in zip(sharded_params, single_params, strict=True):
    rel = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12)
    assert rel < 1e-4, f"{jax.tree_util.keystr(path)}: relative difference {rel:.2e}"


def test_expert_parallel_mesh_trains_as_one_device_with_batch_and_embed_over_both_data_axes(
    sharded_and_single, tmp_path):
  """A 4-axis mesh without a pipeline is Pax's expert-parallel one, [replica, data,
  data_expert, mdl]: the batch and the weights' embed dims go over data x data_expert, and
  training matches one device's."""
  _, (single, _, _) = sharded_and_single
  result, _, partitioner = train_in_process(
      TINY, [*SMALL, "ICI_MESH_SHAPE=[1, 2, 2, 2]", "DCN_MESH_SHAPE=[1, 1, 1, 1]"], tmp_path,
      num_devices=8, enable_checkpoint_saving=False)
  assert partitioner.mesh.axis_names == ("replica", "data", "data_expert", "mdl")
  assert partitioner.num_batch_shards == 4
  emb = result.state.params["softmax"]["embedding"]
  assert {s.data.shape for s in emb.addressable_shards} == {(128, 16)}  # vocab/2, embed/4
  np.testing.assert_allclose([h["loss"] for h in result.history],
                             [h["loss"] for h in single.history], rtol=1e-4)
