"""Hugging Face imports stream: each tensor goes to its devices as it is read.

A run that starts from `INIT_FROM = "hf:DIR"` places the checkpoint's
parameters one at a time in the run's layout (initial.start_state), so the
host holds about one tensor, not the checkpoint. Measured in a subprocess
with tracemalloc, which counts numpy's buffers: the peak of host memory
allocated during the import of a ~200 MB float32 checkpoint. (RSS would not
tell: on a CPU the devices' buffers are host memory too.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO_ROOT, subprocess_env

# ~45M parameters (180 MB in float32) in 8 unscanned layers: the largest tensor
# (the embedding table and the head, 8192 x 768) is 25 MB.
LLAMA = ["NUM_LAYERS=8", "MODEL_DIMS=768", "NUM_HEADS=6", "NUM_KV_HEADS=2", "DIMS_PER_HEAD=128",
         "HIDDEN_DIMS=1536", "VOCAB_SIZE=8192", "USE_REPEATED_LAYER=False", "PERCORE_BATCH_SIZE=1",
         "MAX_SEQ_LEN=16"]
# ~48M parameters (190 MB) with scanned (stacked) layers: the largest stacked
# parameter is 3 x 768 x 2048 floats (19 MB), each read one layer at a time.
T5 = ["NUM_ENCODER_LAYERS=3", "NUM_DECODER_LAYERS=3", "MODEL_DIMS=768", "NUM_HEADS=12",
      "DIMS_PER_HEAD=64", "HIDDEN_DIMS=2048", "VOCAB_SIZE=8192", "USE_REPEATED_LAYER=True",
      "PERCORE_BATCH_SIZE=1", "MAX_INPUT_LEN=16", "MAX_TARGET_LEN=8"]

SCRIPT = r"""
import json, sys, tracemalloc
import jax, numpy as np
from paxlike import config, experiment, initial, mesh, registry, trainer
from paxlike.interop import hf
from paxlike.partitioning import SpmdPartitioner

name, overrides, directory, shape = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
exp = experiment.instantiate(registry.get(name), overrides)
task = config.build(exp.task())
inp = config.build(exp.datasets()[0])
inp.bind_host(1, 0)
part = SpmdPartitioner(mesh.build(json.loads(shape), None))
program = trainer.build_train_program(task, inp, part)
model = task.model


# A random checkpoint of this shape, tensor by tensor. The same process measures its import:
# these arrays are freed before tracemalloc starts, which counts only what is allocated
# after it starts.
rng = np.random.default_rng(1)
params = jax.tree.map(lambda a: rng.standard_normal(a.shape, np.float32) * 0.02,
                      program.abstract.params)
hf.export_params(params, model, directory)
del params
# The state the import replaces parameters of: in the run's layout, as init_state makes it,
# but zeros (its values are replaced or deleted; a random init of 45M parameters costs
# ~10 s of CPU to compile and run).
fresh = part.init_state(lambda key: jax.tree.map(
    lambda a: jax.numpy.zeros(a.shape, a.dtype), program.abstract), 7)
jax.block_until_ready(fresh)
fresh_shardings = [x.sharding for x in jax.tree.leaves(fresh.params)]
# Host memory is what Python and numpy allocate (tracemalloc sees numpy's
# buffers); the devices' own buffers are not host memory on an accelerator.
tracemalloc.start()
state, plan = initial.start_state(initial.InitFrom("hf:" + directory), model, program.abstract,
                                  part, fresh)
jax.block_until_ready(state)
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
expected = hf.import_params(directory, model)
same = all(np.array_equal(np.asarray(a), b) for a, b in zip(
    jax.tree.leaves(jax.device_get(state.params)), jax.tree.leaves(expected), strict=True))
shardings_kept = all(a.sharding == b for a, b in zip(
    jax.tree.leaves(state.params), fresh_shardings, strict=True))
print(json.dumps({"peak": peak, "same": same, "taken": plan.counts()["from_source"],
                  "shardings_kept": shardings_kept}))
"""


def _run(tmp_path, name, overrides, directory, mesh_shape, devices=1):
  """Writes a random checkpoint of the model to directory, then measures its import."""
  env = subprocess_env(devices)
  proc = subprocess.run([sys.executable, "-c", SCRIPT, name, json.dumps(overrides),
                         str(directory), json.dumps(mesh_shape)],
                        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _checkpoint_bytes(directory) -> int:
  return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
             if f.endswith(".safetensors"))


@pytest.mark.parametrize("name,overrides,largest", [
    ("LlamaTiny", LLAMA, 8192 * 768 * 4),
    ("FlanT5Tiny", T5, 8192 * 768 * 4),
])
def test_import_peak_host_memory_is_about_one_tensor(tmp_path, name, overrides, largest):
  directory = tmp_path / "hf"
  got = _run(tmp_path, name, overrides, directory, [1, 1, 1])
  size = _checkpoint_bytes(directory)
  assert size > 120e6, size
  assert got["same"] and got["shardings_kept"], got
  print(f"\n{name}: checkpoint {size / 1e6:.0f} MB, peak host memory of the import "
        f"{got['peak'] / 1e6:.1f} MB (largest tensor {largest / 1e6:.0f} MB)")
  # Reading the whole model first would hold the checkpoint's size at least; the
  # stream holds one block and the tensor it is cut from (the transposed largest
  # table: two copies of it, 50 MB here on JAX 0.10 and 0.12 alike).
  assert got["peak"] < min(2.5 * largest, 0.5 * size), (got, size)


def test_sharded_parameters_read_their_blocks_into_place(tmp_path):
  """On a [1, 1, 2] mesh the mdl-sharded parameters are built from their two halves."""
  directory = tmp_path / "hf"
  small = ["NUM_LAYERS=2", "USE_REPEATED_LAYER=True"]
  got = _run(tmp_path, "LlamaTiny", small, directory, [1, 1, 2], devices=2)
  assert got["same"] and got["shardings_kept"] and got["taken"] > 0, got


def test_lazy_blocks_equal_slices_of_the_whole():
  from paxlike.interop.hf_files import LazyParam

  rows = [np.arange(12, dtype=np.float32).reshape(3, 4) + 100 * i for i in range(5)]
  param = LazyParam((5, 3, 4), [lambda r=r: r for r in rows], stacked=True)
  whole = np.stack(rows)
  np.testing.assert_array_equal(param.read(), whole)
  index = (slice(1, 4), slice(0, 3), slice(2, 4))
  np.testing.assert_array_equal(param.read(index), whole[index])
