"""--mode=dry_run: a pod experiment checked on fake CPU devices, nothing allocated."""

from __future__ import annotations

import json
import resource

import pytest
from conftest import TINY, describe, expected_param_count, run_cli

from paxlike import dry_run, experiment, registry
from paxlike.errors import UserError

C4_1B = "C4Spmd1BAdam4Replicas"


@pytest.fixture(scope="module")
def c4_1b(tmp_path_factory):
  cwd = tmp_path_factory.mktemp("dry_run")
  # conftest gives the process 8 fake devices; the 1B mesh needs 4: the command re-executes.
  proc = run_cli([f"--exp={C4_1B}", "--job_log_dir=job", "--mode=dry_run", "--target=tpu_v4"],
                 cwd=cwd, devices=8, timeout=300)
  peak_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
  return proc, cwd / "job", peak_rss


def test_dry_run_of_c4_1b_reports_about_1b_parameters(c4_1b):
  proc, job, _ = c4_1b
  assert proc.returncode == 0, describe(proc)
  report = json.loads((job / "dry_run.json").read_text())
  assert report["experiment"] == "experiments.lm.c4.C4Spmd1BAdam4Replicas"
  assert report["params"] == expected_param_count(num_layers=13, model_dims=2560,
                                                  hidden_dims=10240, vocab_size=32000,
                                                  dims_per_head=128)
  assert 1.0e9 < report["params"] < 1.2e9
  assert report["num_devices"] == 4 and report["mesh"] == {"replica": 1, "data": 4, "mdl": 1}
  assert report["global_batch"] == 128 and report["features"]["ids"] == [1024]  # 32 per core x 4


def test_per_device_bytes_follow_the_mesh(c4_1b):
  """Float32 parameters split 4 ways over 'data' (only the tiny FFN biases are
  replicated); Adam keeps two slots per parameter; the compiled step takes the state
  as its arguments."""
  _, job, _ = c4_1b
  report = json.loads((job / "dry_run.json").read_text())
  by = report["bytes_per_device"]
  assert by["params"] == pytest.approx(report["params"] * 4 / 4, rel=0.002)
  assert by["opt_state"] == pytest.approx(2 * by["params"], rel=0.001)
  mem = report["compiled_memory_per_device"]
  assert mem["argument"] >= by["state"]
  assert mem["peak"] >= mem["argument"] + mem["temp"] - mem["alias"]
  fl = report["flops_per_step"]
  assert 1.0 < fl["hardware_over_model"] < 4 / 3 + 0.05  # remat re-runs the forward pass
  assert report["fits"]["tpu_v4"]["fits"] == (mem["peak"] <= 32 * 2**30)
  assert report["fits"]["tpu_v5e"]["usable_bytes"] == 16 * 2**30


def test_dry_run_allocates_no_model(c4_1b):
  """The 1B model's float32 parameters alone are 4.4 GB: the dry run's process never
  comes near that (nor the 13 GB parameters + Adam would take)."""
  proc, job, peak_rss = c4_1b
  report = json.loads((job / "dry_run.json").read_text())
  assert peak_rss < report["params"] * 4, f"peak RSS {peak_rss / 1e9:.1f} GB"


def test_dry_run_prints_the_table(c4_1b):
  proc, _, _ = c4_1b
  assert "restarting with 4 fake CPU devices" in proc.stderr
  lines = proc.stdout.splitlines()
  assert any(ln.startswith("parameters") and "1.10 B" in ln for ln in lines), proc.stdout
  assert any(ln.startswith("fits tpu_v4") for ln in lines), proc.stdout


def test_unknown_target_and_pmap_experiments_are_user_errors(tmp_path):
  proc = run_cli([f"--exp={C4_1B}", "--job_log_dir=job", "--mode=dry_run", "--target=tpu_v9"],
                 cwd=tmp_path)
  assert proc.returncode == 2, describe(proc)
  assert proc.stderr.strip().splitlines()[-1].startswith("error: --target=tpu_v9 is not one of")
  exp = experiment.instantiate(registry.get("LmCloudTransformerAdamTiny"))
  with pytest.raises(UserError, match="ICI_MESH_SHAPE=None"):
    dry_run.mesh_size(exp)


def test_in_process_analysis_splits_state_over_the_mesh():
  """The tiny model on 4 x 2 devices: its float32 weights split 8 ways, except norms'
  [embed] vectors (4 ways, over 'data') and FFN biases (2 ways, over 'mdl')."""
  exp = experiment.instantiate(registry.get(TINY), ["NUM_LAYERS=1", "MAX_SEQ_LEN=8",
                                                    "PERCORE_BATCH_SIZE=1",
                                                    "ICI_MESH_SHAPE=[1,4,2]"])
  report = dry_run.analyse(exp)
  assert report["params"] == expected_param_count(1, 64, 256, 256, 16)
  ratio = report["bytes_per_device"]["params"] / (report["params"] * 4)
  assert 1 / 8 <= ratio < 1 / 7


def test_a_dimension_the_mesh_does_not_divide_is_a_user_error():
  exp = experiment.instantiate(registry.get(TINY), ["HIDDEN_DIMS=255", "ICI_MESH_SHAPE=[1,1,2]"])
  with pytest.raises(UserError, match=r"does not shard over the mesh \[1, 1, 2\].*255.*pad"):
    dry_run.analyse(exp)


def test_a_vocabulary_the_mesh_does_not_divide_is_padded_and_counted_at_its_size():
  """As Pax shards GPT-3's vocabulary over 24 ways: the table pads, the count does not."""
  exp = experiment.instantiate(registry.get(TINY), ["VOCAB_SIZE=255", "ICI_MESH_SHAPE=[1,1,2]",
                                                    "NUM_LAYERS=1", "MAX_SEQ_LEN=8",
                                                    "PERCORE_BATCH_SIZE=1"])
  report = dry_run.analyse(exp)
  assert report["params"] == expected_param_count(1, 64, 256, 255, 16)


def test_dry_run_of_a_t5_with_adafactor_on_a_data_and_model_mesh(tmp_path):
  """The encoder-decoder family dry-runs through the same contract; Adafactor's
  factored moments (not shaped like their parameter) are replicated, the rest sharded."""
  proc = run_cli(["--exp=FlanT5Tiny", "--job_log_dir=job", "--mode=dry_run",
                  "--set", "OPTIMIZER=adafactor", "--set", "ICI_MESH_SHAPE=[1, 2, 2]",
                  "--set", "USE_REPEATED_LAYER=True", "--set", "MODEL_DIMS=128",
                  "--set", "DIMS_PER_HEAD=32", "--set", "HIDDEN_DIMS=256"],
                 cwd=tmp_path, devices=8, timeout=300)
  assert proc.returncode == 0, describe(proc)
  report = json.loads((tmp_path / "job" / "dry_run.json").read_text())
  assert report["features"]["encoder_input_tokens"] == [32]
  assert report["features"]["decoder_target_tokens"] == [16]
  assert report["global_batch"] == 16 * 4
  # Parameters split over data x mdl, so a device holds well under all of them.
  assert report["bytes_per_device"]["params"] < 0.6 * 4 * report["params"]
  # Adafactor factors every matrix with both dims >= 128: far less than a copy of them.
  assert report["bytes_per_device"]["opt_state"] < 0.5 * report["bytes_per_device"]["params"]
  model = report["flops_per_step"]["model_analytic"]
  assert 1.0 < report["flops_per_step"]["hardware_over_model"] < 1.6, model
