"""SeqIOInput on the arithmetic task registered in tasks/seqio_tasks.py (the [seqio] extra)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("seqio")

from paxlike.inputs.seqio_input import SeqIOInput  # noqa: E402
from paxlike.inputs.text import TextInput  # noqa: E402


def seqio_input(**kw):
  kw.setdefault("num_infeed_hosts", 1)
  kw.setdefault("infeed_host_index", 0)
  return SeqIOInput(name="t", mixture_name="paxlike_arithmetic", task_module="tasks.seqio_tasks",
                    task_feature_lengths={"inputs": 6, "targets": 6}, **kw)


def test_seqio_eval_epoch_matches_the_native_input_and_pads():
  inp = seqio_input(split_name="test", batch_size=64, is_training=False, repeat=False,
                    reset_for_eval=True)
  batches = []
  while True:
    try:
      batches.append(inp.get_next())
    except StopIteration:
      break
  assert len(batches) == 8  # 500 held-out examples in batches of 64, the last padded
  weights = np.concatenate([b["weights"] for b in batches])
  assert int((weights.sum(axis=1) > 0).sum()) == 500
  native = TextInput(generator="tasks.arithmetic:examples", split="test", seq_len=12,
                     batch_size=64, num_infeed_hosts=1, infeed_host_index=0, is_training=False,
                     repeat=False, reset_for_eval=True, shuffle=False)
  nb = native.get_next()
  first = batches[0]
  assert inp.ids_to_strings(first["ids"], first["prompt_lens"]) == native.ids_to_strings(
      nb["ids"], nb["prompt_lens"])
  # The same byte ids: seqio's row is the native row shifted right by one (BOS = 0).
  np.testing.assert_array_equal(first["labels"][:, :11], nb["ids"][:, :11])
  assert inp.score(["12", "3"], ["12", "4"]) == {"exact_match": 0.5}


def test_seqio_shards_hosts_disjointly_and_resumes():
  rows = []
  for host in (0, 1):
    inp = seqio_input(split_name="test", batch_size=50, is_training=False, repeat=False,
                      reset_for_eval=True, num_infeed_hosts=2, infeed_host_index=host)
    rows.append({tuple(r) for _ in range(5) for r in inp.get_next()["ids"]})
  assert len(rows[0]) == len(rows[1]) == 250 and not rows[0] & rows[1]
  train = seqio_input(split_name="train", batch_size=8, seed=5)
  train.get_next()
  state = train.get_state()
  expected = train.get_next()
  again = seqio_input(split_name="train", batch_size=8, seed=5)
  again.set_state(state)
  np.testing.assert_array_equal(again.get_next()["ids"], expected["ids"])


TFDS_EXPERIMENT = '''
import seqio

from experiments.lm.arithmetic import ArithmeticAdditionSeqIO
from paxlike import experiment_registry
from tasks import seqio_tasks

if "paxlike_tfds_sums" not in seqio.TaskRegistry.names():
  seqio.TaskRegistry.add(
      "paxlike_tfds_sums",
      # A data dir this machine does not have, as Pax's c4.py names its bucket.
      source=seqio.TfdsDataSource("paxlike_sums:1.0.0", tfds_data_dir="/nonexistent/tfds"),
      preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
      output_features={"inputs": seqio.Feature(seqio_tasks.VOCAB, add_eos=False),
                       "targets": seqio.Feature(seqio_tasks.VOCAB, add_eos=True)},
      metric_fns=[seqio_tasks._exact_match])


@experiment_registry.register
class SumsFromTfds(ArithmeticAdditionSeqIO):
  def _input(self, split, training, name):
    cfg = super()._input(split, training, name)
    cfg.mixture_name, cfg.task_module = "paxlike_tfds_sums", "tfds_exps"
    return cfg
'''


def _write_tfds_sums(data_dir) -> None:
  """A TFDS dataset `paxlike_sums:1.0.0` of the arithmetic task's rows, under data_dir."""
  import tensorflow_datasets as tfds

  from tasks import arithmetic

  class PaxlikeSums(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
          {"inputs": tfds.features.Text(), "targets": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples("train", 256),
              "test": self._generate_examples("test", 16)}

    def _generate_examples(self, split, n):
      for i, row in enumerate(arithmetic.examples(split)[:n]):
        yield i, {"inputs": row["inputs"], "targets": row["targets"]}

  PaxlikeSums(data_dir=str(data_dir)).download_and_prepare()


def test_tfds_data_dir_points_a_tasks_tfds_source_at_local_data(tmp_path):
  import json

  from conftest import describe, run_cli

  _write_tfds_sums(tmp_path / "tfds")
  (tmp_path / "tfds_exps.py").write_text(TFDS_EXPERIMENT)
  args = ["--exp=tfds_exps.SumsFromTfds", "--set", "NUM_TRAIN_STEPS=3", "--set",
          "EVAL_INTERVAL_STEPS=0"]
  proc = run_cli([*args, "--job_log_dir=job", f"--tfds_data_dir={tmp_path / 'tfds'}"],
                 tmp_path, pythonpath=[tmp_path])
  assert proc.returncode == 0, describe(proc)
  assert "trained steps 0..3" in proc.stdout
  assert "decode_test at step 3: exact_match" in proc.stdout
  run_env = json.loads((tmp_path / "job" / "run_env.json").read_text())
  assert run_env["tfds_data_dir"] == str(tmp_path / "tfds")
  # Without the override the task's own data dir is read, which is not there: one sentence.
  import seqio

  from paxlike.errors import UserError

  exec(compile(TFDS_EXPERIMENT.split("@experiment_registry")[0], "tfds_exps", "exec"), {})
  seqio.set_tfds_data_dir_override(None)
  with pytest.raises(UserError, match=r"paxlike_sums:1.0.0 from /nonexistent/tfds.*"
                                      r"--tfds_data_dir=DIR"):
    SeqIOInput(name="t", mixture_name="paxlike_tfds_sums", split_name="test",
               task_feature_lengths={"inputs": 6, "targets": 6}, num_infeed_hosts=1,
               infeed_host_index=0, batch_size=4, is_training=False).get_next()


@pytest.mark.parametrize("converter,pack,training", [
    ("lm", False, True), ("prefix_lm", False, False), ("prefix_lm", True, True),
    ("decoder", True, True), ("enc_dec", False, False), ("enc_dec", True, True)])
def test_peek_specs_without_reading_data_are_the_batches_shapes(converter, pack, training):
  """A dry run plans from peek_specs, which reads no data: they must be get_next's."""
  task = "paxlike_arithmetic_seq2seq" if converter == "enc_dec" else "paxlike_arithmetic"
  inp = SeqIOInput(name="t", mixture_name=task, task_module="tasks.seqio_tasks",
                   task_feature_lengths={"targets": 8} if converter == "lm" else
                   {"inputs": 6, "targets": 8}, feature_converter=converter,
                   pack=pack, split_name="test", batch_size=4, is_training=training,
                   repeat=False, reset_for_eval=not training, num_infeed_hosts=1,
                   infeed_host_index=0)
  batch = inp.get_next()
  assert {k: (v.shape, v.dtype) for k, v in inp.peek_specs().items()} == {
      k: (v.shape, v.dtype) for k, v in batch.items()}
  assert ("segment_ids" in batch or "decoder_segment_ids" in batch) == (pack and training)
