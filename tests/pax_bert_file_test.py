"""Pax's bert.py, its import lines rewritten, configures with Pax's counts and trains on
MLPerf-format TFRecords (written here, small); as written it names its placeholder path.

Pax's file (paxml's tasks/lm/params/bert.py at b397693) is read from
$PAXLIKE_PAXREF (default /work/paxref), as tests/pax_pipeline_files_test.py
reads the others, and these tests are skipped where it is absent.
"""

from __future__ import annotations

import importlib
import sys
import textwrap

import jax
import numpy as np
import pytest
from conftest import (
  describe,
  expected_param_count,
  parse_trained_line,
  registrations_undone,
  run_cli,
  train_in_process,
)
from pax_pipeline_files_test import PAXREF, rewrite_imports

from paxlike import config, experiment, registry
from paxlike import train_state as ts

pytestmark = pytest.mark.skipif(not (PAXREF / "bert.py").is_file(),
                                reason=f"Pax's bert.py is not in {PAXREF}")

# (class, devices of its mesh, layers, model dims, hidden dims, dims per head, smoothing)
CLASSES = [
    ("BertAdamL4H128", 1, 4, 128, 512, 16, None),
    ("BertSpmdL4H128", 8, 4, 128, 512, 16, None),
    ("BertSpmdL33H12kBiggerBatch", 512, 33, 12288, 98304, 96, 0.1),
    ("BertSpmdL33H12kBiggerBatch8x8x16", 1024, 33, 12288, 98304, 96, 0.1),
    ("BertSpmdL66H12kBiggerBatch8x8x16", 1024, 66, 12288, 98304, 96, 0.1),
    ("BertSpmdL66H12kBiggerBatch8x8x8", 512, 66, 12288, 98304, 96, 0.1),
]

# A user's file: bert.py's classes reading the records under RECORDS.
MINE = textwrap.dedent("""\
    from paxlike.pax import experiment_registry
    from pax_bert import BertAdamL4H128, BertSpmdL4H128

    RECORDS = {records!r}


    class OnMyRecords:
      def datasets(self):
        train, test = super().datasets()
        for p in (train, test):
          p.input_file = RECORDS
          p.max_sequence_length, p.max_predictions_per_seq = 64, 20
        return [train, test]


    @experiment_registry.register
    class Mine(OnMyRecords, BertAdamL4H128):
      pass


    @experiment_registry.register
    class MineSpmd(OnMyRecords, BertSpmdL4H128):
      pass
    """)


@pytest.fixture(scope="module")
def pax_bert(tmp_path_factory):
  """bert.py rewritten (pax_bert) and a user's file on 4 files of records (pax_bert_mine)."""
  tf = pytest.importorskip("tensorflow")
  del tf
  from mlperf_records import write_mlperf_records

  root = tmp_path_factory.mktemp("pax_bert")
  (root / "pax_bert.py").write_text(rewrite_imports((PAXREF / "bert.py").read_text()))
  files = write_mlperf_records(root / "records", 4, 32, seq_len=64, max_predictions=20)
  (root / "pax_bert_mine.py").write_text(MINE.format(records=files))
  with registrations_undone():
    sys.path.insert(0, str(root))
    try:
      yield root, importlib.import_module("pax_bert"), importlib.import_module("pax_bert_mine")
    finally:
      sys.path.remove(str(root))
      for name in ("pax_bert", "pax_bert_mine"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize(("name", "devices", "layers", "dims", "hidden", "per_head", "smooth"),
                         CLASSES)
def test_bert_py_classes_configure_with_paxs_counts(pax_bert, monkeypatch, name, devices,
                                                   layers, dims, hidden, per_head, smooth):
  monkeypatch.setattr(jax, "local_device_count", lambda *a, **k: devices)
  monkeypatch.setattr(jax, "device_count", lambda *a, **k: devices)
  exp = experiment.instantiate(registry.get(f"pax_bert.{name}"))
  configs = experiment.build_checked(exp)
  model = config.build(configs.task).model
  assert (model.num_layers, model.model_dims, model.hidden_dims, model.dim_per_head,
          model.label_smoothing_prob) == (layers, dims, hidden, per_head, smooth)
  batch = {"labels": jax.ShapeDtypeStruct((1, 8), jax.numpy.int32)}
  params = jax.eval_shape(lambda: ts.init_params(model, jax.random.key(0),
                                                 model.init_batch(batch)))
  count = ts.count_params(params) - model.padding_params()
  assert count == expected_param_count(layers, dims, hidden, 32000, per_head)
  train = configs.datasets[0]
  assert (train.input_file, train.batch_size, train.enable_packing, train.remask) == (
      "/PATH/TO/BERT/TRAIN/TF_RECORDS", exp.PERCORE_BATCH_SIZE * devices, True, True)
  assert (train.mlm_augmenter.mask_token_id, train.mlm_augmenter.vocab_size) == (103, 30522)


@pytest.mark.one_python("3.11")
def test_bert_py_as_written_names_its_placeholder_path(pax_bert):
  root, _, _ = pax_bert
  job = root / "job_as_written"
  proc = run_cli(["--exp=pax_bert.BertAdamL4H128", f"--job_log_dir={job}"], cwd=root,
                 pythonpath=[root])
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, describe(proc)
  assert proc.stderr.strip().splitlines()[-1] == (
      "error: input 'train': no TFRecord file matches /PATH/TO/BERT/TRAIN/TF_RECORDS; set "
      "input_file to the MLPerf BERT records."), describe(proc)


def test_a_vocabulary_smaller_than_remask_draws_is_refused_by_name(pax_bert):
  root, _, _ = pax_bert
  job = root / "job_small_vocab"
  proc = run_cli(["--exp=pax_bert.BertAdamL4H128", f"--job_log_dir={job}", "--set",
                  "VOCAB_SIZE=30000"], cwd=root, pythonpath=[root])
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, describe(proc)
  assert proc.stderr.strip().splitlines()[-1] == (
      "error: input 'train': remask draws ids below 30522 and masks with id 103 "
      "(mlm_augmenter), but the model's VOCAB_SIZE is 30000; raise VOCAB_SIZE or set "
      "mlm_augmenter.vocab_size."), describe(proc)
  assert not job.exists()


@pytest.mark.one_python("3.11")
def test_bert_py_trains_and_evaluates_on_mlperf_records(pax_bert):
  """BertAdamL4H128 on the pmap loop: packed, remasked training rows and the eval split."""
  root, _, _ = pax_bert
  proc = run_cli(["--exp=pax_bert_mine.Mine", f"--job_log_dir={root / 'job'}",
                  "--set", "NUM_TRAIN_STEPS=25", "--set", "PERCORE_BATCH_SIZE=8",
                  "--set", "LR_SCHEDULE=constant", "--set", "LEARNING_RATE=3e-3",
                  "--set", "EVAL_INTERVAL_STEPS=25"], cwd=root, pythonpath=[root],
                 optimized=True)  # its 32000-row softmax: 58 s -> 37 s on 2 cores
  assert proc.returncode == 0, describe(proc)
  trained = parse_trained_line(proc.stdout)
  assert trained["last_loss"] < trained["first_loss"] - 1.0, trained
  assert "eval_test_test at step 25: loss" in proc.stdout, describe(proc)


@pytest.mark.one_python("3.11")
def test_bert_py_spmd_class_trains_on_its_mesh(pax_bert, tmp_path):
  result, _, _ = train_in_process(
      "pax_bert_mine.MineSpmd", ["NUM_TRAIN_STEPS=4", "PERCORE_BATCH_SIZE=1",
                                 "EVAL_INTERVAL_STEPS=100"],
      tmp_path / "job", num_devices=8, main_rules=True)
  assert result.history[-1]["step"] == 4, result.history
  assert np.all(np.isfinite([h["loss"] for h in result.history])), result.history
