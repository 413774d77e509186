"""Multi-host runs: two processes on 127.0.0.1 behave like one with all the devices."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
from conftest import REPO_ROOT, describe, read_scalars, run_cli, subprocess_env

from paxlike import distributed
from paxlike.errors import UserError

COMMON = ["--exp=LmCloudSpmdTiny", "--set", "PERCORE_BATCH_SIZE=4", "--set",
          "SUMMARY_INTERVAL_STEPS=1", "--set", "CHECKPOINT_EVERY_N_STEPS=4"]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch(process_id: int, port: int, job_log_dir, extra: list[str],
           common: list[str] = COMMON) -> subprocess.Popen:
  env = subprocess_env(2)
  return subprocess.Popen(
      [sys.executable, "-m", "paxlike.main", *common, f"--job_log_dir={job_log_dir}",
       f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
       f"--process_id={process_id}", "--distributed_timeout_s=120", *extra],
      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def losses(job_log_dir) -> list[float]:
  return [v for _, v in read_scalars(job_log_dir / "summaries" / "train")["loss"]]


def test_two_processes_match_one_process_and_share_checkpoints(tmp_path):
  multi, single = tmp_path / "multi", tmp_path / "single"
  mesh = ["--set", "ICI_MESH_SHAPE=[1,2,1]", "--set", "DCN_MESH_SHAPE=[2,1,1]",
          "--set", "NUM_TRAIN_STEPS=4"]
  port = free_port()
  procs = [launch(i, port, multi, mesh) for i in (0, 1)]
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (out, err) in zip(procs, outs, strict=True):
    assert p.returncode == 0, f"exit {p.returncode}\n{out}\n{err[-3000:]}"
  assert "[process 1/2]" in outs[1][1]  # logs say which process speaks
  # Only process 0 writes summaries and dumps: one set of event files.
  assert len(list((multi / "summaries" / "train").glob("events.out.tfevents.*"))) == 1

  proc = run_cli([*COMMON, f"--job_log_dir={single}", "--set", "ICI_MESH_SHAPE=[1,4,1]",
                  "--set", "NUM_TRAIN_STEPS=6"], tmp_path, devices=4)
  assert proc.returncode == 0, describe(proc)
  single_losses = losses(single)
  np.testing.assert_allclose(losses(multi), single_losses[:4], rtol=1e-5)

  # The checkpoint the two processes wrote restores in a single-process run, which then
  # continues exactly as the uninterrupted single-process run did.
  proc = run_cli([*COMMON, f"--job_log_dir={multi}", "--set", "ICI_MESH_SHAPE=[1,4,1]",
                  "--set", "NUM_TRAIN_STEPS=6"], tmp_path, devices=4)
  assert proc.returncode == 0, describe(proc)
  assert "restored step 4" in proc.stderr
  np.testing.assert_allclose(losses(multi)[-2:], single_losses[4:6], rtol=1e-6)


def test_two_pmap_processes_train_as_one_does_and_share_checkpoints(tmp_path):
  """A pmap experiment (no mesh) on two processes: the steps average over every process's
  devices, so the losses are the one-process run's; the checkpoint they write through
  tensorstore restores in one process, which goes on as the uninterrupted run."""
  multi, single = tmp_path / "multi", tmp_path / "single"
  common = ["--exp=LmCloudTransformerAdamTiny", *COMMON[1:]]
  port = free_port()
  procs = [launch(i, port, multi, ["--set", "NUM_TRAIN_STEPS=4", "--pmap_use_tensorstore"],
                  common) for i in (0, 1)]
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (out, err) in zip(procs, outs, strict=True):
    assert p.returncode == 0, f"exit {p.returncode}\n{out}\n{err[-3000:]}"
  assert outs[0][0].splitlines()[-1] == outs[1][0].splitlines()[-1]  # one model, not two
  # Pax's input_specs.json under pmap: a device's rows (PERCORE_BATCH_SIZE=4).
  specs = json.loads((multi / "input_specs.json").read_text())
  assert specs["ids"] == {"_array": {"shape": [4, 64], "dtype": "int32"}}

  proc = run_cli([*common, f"--job_log_dir={single}", "--set", "NUM_TRAIN_STEPS=6"], tmp_path,
                 devices=4)
  assert proc.returncode == 0, describe(proc)
  single_losses = losses(single)
  np.testing.assert_allclose(losses(multi), single_losses[:4], rtol=1e-5)
  proc = run_cli([*common, f"--job_log_dir={multi}", "--set", "NUM_TRAIN_STEPS=6"], tmp_path,
                 devices=4)
  assert proc.returncode == 0, describe(proc)
  assert "restored step 4" in proc.stderr
  np.testing.assert_allclose(losses(multi)[-2:], single_losses[4:6], rtol=1e-5)


def test_unreachable_coordinator_fails_clearly_and_quickly(tmp_path):
  port = free_port()
  start = time.monotonic()
  proc = run_cli(["--exp=LmCloudSpmdTiny", f"--job_log_dir={tmp_path / 'job'}",
                  f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                  "--process_id=1", "--distributed_timeout_s=1"], tmp_path, devices=2)
  elapsed = time.monotonic() - start
  assert proc.returncode == 2, describe(proc)
  assert f"cannot reach the coordinator at 127.0.0.1:{port}" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert elapsed < 60


def test_wait_for_coordinator_returns_once_the_port_answers():
  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen()
    distributed.wait_for_coordinator(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=5)
  try:
    distributed.wait_for_coordinator("not-an-address", timeout_s=1)
    raise AssertionError("expected a UserError")
  except UserError as e:
    assert "HOST:PORT" in str(e)


# A DCN_MESH_SHAPE that differs from the process count: bad_input_test's
# dcn_process_mismatch case (the same refusal, and job_log_dir left untouched).


def test_two_processes_evaluate_and_decode_a_finite_set_exactly(tmp_path):
  # 500 held-out prompts, 120 rows per host: a global batch of 240 does not divide 500.
  job = tmp_path / "eval"
  args = ["--exp=ArithmeticAdditionTiny", "--set", "NUM_TRAIN_STEPS=2", "--set",
          "EVAL_BATCH_SIZE=120", "--set", "DCN_MESH_SHAPE=[2,1,1]", "--set",
          "PERCORE_BATCH_SIZE=8", f"--job_log_dir={job}"]

  env = subprocess_env(1)  # tests/ on the path: pax_eval_experiments
  env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "tests"), str(REPO_ROOT),
                                       env.get("PYTHONPATH", "")])

  def two_processes(extra: list[str]) -> list[str]:
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "paxlike.main", *args, f"--coordinator_address=127.0.0.1:{port}",
         "--num_processes=2", f"--process_id={i}", "--distributed_timeout_s=120", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
      assert p.returncode == 0, f"exit {p.returncode}\n{out}\n{err[-3000:]}"
    return [out for out, _ in outs]

  for out in two_processes([]):
    assert "eval_test_test at step 2" in out and "num_examples 500.0000" in out
  rows = (job / "decoder_out" / "test" / "decode_00000002.jsonl").read_text().splitlines()
  assert len(rows) == 500
  # --mode=eval: both processes follow what process 0 sees (here: the last checkpoint).
  for out in two_processes(["--mode=eval"]):
    assert "eval test at step 2:" in out and "num_examples 500.0000" in out
  # A decode set that one host holds a batch fewer of: it decodes a filler while the other
  # finishes, and the outputs are the same 500 rows.
  two_processes(["--mode=decode_once", "--exp=pax_eval_experiments.ArithmeticUnevenHosts"])
  again = (job / "decoder_out" / "test" / "decode_00000002-2.jsonl").read_text().splitlines()
  assert again == rows


def test_a_refusal_on_one_process_is_named_by_the_others(monkeypatch, capsys):
  """A refusal only process 1 meets (here: a mesh its own --set asks for) reaches process 0
  as a failed collective; process 0 then says which process refused and why, exit 2, not
  a traceback. (Checked by hand with two processes: both print one line and exit 2, 32 s
  in, when Gloo's collective times out.) Here the coordination service is a dict."""
  import pytest
  from jax._src import distributed as jax_distributed

  from paxlike import main

  store: dict[str, str] = {}

  class Client:
    def key_value_set(self, key, value):
      store[key] = value

    def key_value_dir_get(self, prefix):
      return [(k, v) for k, v in store.items() if k.startswith(prefix)]

  monkeypatch.setattr(jax_distributed.global_state, "client", Client())
  monkeypatch.setattr(jax_distributed.global_state, "num_processes", 2)
  monkeypatch.setattr("jax.process_index", lambda: 1)

  def refuse(_):
    raise UserError("the mesh needs 6 devices but 2 are available.")

  monkeypatch.setattr(main, "run", refuse)
  with pytest.raises(SystemExit) as exit_1:  # process 1: its own line, and leaves it
    main.main(["main"])
  assert exit_1.value.code == 2

  def collective_times_out(_):
    raise RuntimeError("Gloo context initialization failed: DEADLINE_EXCEEDED")

  monkeypatch.setattr(main, "run", collective_times_out)
  with pytest.raises(SystemExit) as exit_0:  # process 0: names process 1's refusal
    main.main(["main"])
  assert exit_0.value.code == 2
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
      "error: process 1 refused the run: the mesh needs 6 devices but 2 are available.")
  store.clear()  # no refusal left by another process: the failure is raised as it is
  with pytest.raises(RuntimeError, match="DEADLINE_EXCEEDED"):
    main.main(["main"])
