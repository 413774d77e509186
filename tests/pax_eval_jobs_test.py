"""A Pax user's eval and decode jobs (the experiments of tests/pax_eval_experiments.py).

- An experiment with no training input initialises its model from the shapes its
  get_input_specs_provider_params() gives, as in Pax, and decodes a trained job.
- A finite eval and decode set that two hosts hold unevenly (8 and 4 of 12 examples, so
  one host runs fillers for two steps) is evaluated and decoded over every example
  exactly once, under SPMD and under pmap: the metrics are the one-process run's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO_ROOT, describe, registrations_undone, run_cli, subprocess_env
from distributed_test import free_port

TESTS = REPO_ROOT / "tests"
EXP = "--exp=pax_eval_experiments."


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A job of Regress trained 4 steps on one process (SPMD, [1, 1, 1])."""
  job = tmp_path_factory.mktemp("eval_jobs") / "job"
  proc = run_cli([EXP + "Regress", f"--job_log_dir={job}"], job.parent, pythonpath=[TESTS])
  assert proc.returncode == 0, describe(proc)
  return job


def _metrics(job, name: str, step: int = 4) -> dict[str, float]:
  """The newest decode metrics file of decode set `name` at `step`."""
  paths = sorted((job / "decoder_out" / name).glob(f"metrics_{step:08d}*.json"),
                 key=os.path.getmtime)
  return json.loads(paths[-1].read_text())


def _decoded(job, name: str = "rows", step: int = 4) -> list[dict]:
  paths = sorted((job / "decoder_out" / name).glob(f"decode_{step:08d}*.jsonl"),
                 key=os.path.getmtime)
  return [json.loads(line) for line in paths[-1].read_text().splitlines()]


def _eval_line(out: str) -> str:
  return next(line for line in out.splitlines() if line.startswith("eval held at step 4:"))


def test_a_decode_only_experiment_initialises_from_its_input_specs_provider(trained):
  cwd = trained.parent
  proc = run_cli([EXP + "Regress", f"--job_log_dir={trained}", "--mode=decode_once"], cwd,
                 pythonpath=[TESTS])
  assert proc.returncode == 0, describe(proc)
  reference = _metrics(trained, "rows")
  # No datasets() at all: the provider's shapes initialise the model, then step 4 restores.
  proc = run_cli([EXP + "RegressDecodeOnly", f"--job_log_dir={trained}", "--mode=decode_once"],
                 cwd, pythonpath=[TESTS])
  assert proc.returncode == 0, describe(proc)
  assert "restored step 4" in proc.stderr
  assert _metrics(trained, "rows") == pytest.approx(reference, rel=1e-6)
  assert sorted(row["idx"] for row in _decoded(trained)) == list(range(12))

  # Without a provider, and asked to train: one line each, exit 2.
  for exp, mode, expected in (
      ("RegressDecodeOnlyNoSpecs", "decode_once",
       "RegressDecodeOnlyNoSpecs.datasets() has no input with is_training=True to initialise "
       "the model from; override get_input_specs_provider_params()"),
      ("RegressDecodeOnly", "train", "RegressDecodeOnly is a decode-only experiment")):
    proc = run_cli([EXP + exp, f"--job_log_dir={trained}", f"--mode={mode}"], cwd,
                   pythonpath=[TESTS])
    assert proc.returncode == 2, describe(proc)
    assert f"error: {expected}" in proc.stderr and "Traceback" not in proc.stderr, describe(proc)
  assert (trained / "checkpoints" / "checkpoint_00000004").is_dir()  # nothing lost


def _two_processes(job, *extra: str) -> list[str]:
  port = free_port()
  env = subprocess_env(1)
  env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(REPO_ROOT), env.get("PYTHONPATH", "")])
  procs = [subprocess.Popen(
      [sys.executable, "-m", "paxlike.main", EXP + "Regress", f"--job_log_dir={job}",
       f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}",
       "--distributed_timeout_s=120", *extra],
      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (0, 1)]
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (out, err) in zip(procs, outs, strict=True):
    assert p.returncode == 0, f"exit {p.returncode}\n{out}\n{err[-3000:]}"
  return [out for out, _ in outs]


@pytest.mark.parametrize("layout", [["--set", "DCN_MESH_SHAPE=[2,1,1]"],
                                    ["--set", "ICI_MESH_SHAPE=None"]], ids=["spmd", "pmap"])
def test_hosts_holding_a_set_unevenly_evaluate_and_decode_each_example_once(trained, layout):
  cwd, run = trained.parent, ["--mode=decode_once", "--eval_during_decode"]
  proc = run_cli([EXP + "Regress", f"--job_log_dir={trained}", *run], cwd, pythonpath=[TESTS])
  assert proc.returncode == 0, describe(proc)
  one_eval, one_decode = _eval_line(proc.stdout), _metrics(trained, "rows")
  one_rows = {row["idx"]: row["err"] for row in _decoded(trained)}

  outs = _two_processes(trained, *run, "--set", "EVAL_SHARES=(8,4)", *layout)
  for out in outs:  # both hosts report the whole set, as the one process did
    assert _eval_line(out) == one_eval, (out, one_eval)
  assert "num_examples 12.0000" in one_eval
  assert _metrics(trained, "rows") == pytest.approx(one_decode, rel=1e-5)
  rows = _decoded(trained)
  assert sorted(row["idx"] for row in rows) == list(range(12))  # no filler row, no repeat
  np.testing.assert_allclose([row["err"] for row in rows],
                             [one_rows[row["idx"]] for row in rows], rtol=1e-5)


def test_input_specs_providers_and_what_they_may_return():
  import jax
  import jax.numpy as jnp

  from paxlike import config, experiment
  from paxlike.errors import UserError
  from paxlike.inputs.base_input import specs_input
  from paxlike.pax import base_input, pax_fiddle

  sys.path.insert(0, str(TESTS))
  try:
    with registrations_undone():
      import pax_eval_experiments as m

    exp = experiment.instantiate(m.Regress)
    assert config.build(exp.training_dataset()).is_training  # Pax's training_dataset()
    # praxis's DatasetInputSpecsProvider: a batch of the input it configures.
    given = config.build(pax_fiddle.Config(base_input.DatasetInputSpecsProvider,
                                           input_p=exp.decode_datasets()[0])).get_input_specs()
    assert {k: (v.shape, v.dtype) for k, v in given.items()} == {
        "x": ((2, 4), np.float32), "y": ((2, 3), np.float32), "idx": ((2,), np.int32)}
  finally:
    sys.path.remove(str(TESTS))
    sys.modules.pop("pax_eval_experiments", None)
  # A pmap provider gives a device's rows: a process has rows_factor devices' worth.
  init = specs_input({"x": jax.ShapeDtypeStruct((3, 4), jnp.bfloat16)}, 2, "P.get_input_specs()")
  assert init.peek_specs()["x"].shape == (6, 4) and init.peek_specs()["x"].dtype == jnp.bfloat16
  for bad, expected in (
      ([1, 2], "P.get_input_specs() returned list; it returns a dict"),
      ({"x": {"y": jax.ShapeDtypeStruct((1,), jnp.float32)}}, "gave 'x' as dict; paxlike takes "
       "a flat dict"),
      ({"x": jax.ShapeDtypeStruct((2, 4), jnp.float32),
        "y": jax.ShapeDtypeStruct((3,), jnp.float32)}, "different numbers of rows (x 2, y 3)")):
    with pytest.raises(UserError, match=re.escape(expected)):
      specs_input(bad, 1, "P.get_input_specs()")
