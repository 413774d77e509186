"""Pax's LanguageModelFeatures on SeqIO data, and Pax's c4.py training on a local copy of C4.

The converter tests need the [seqio] extra. The C4 run reads Pax's c4.py from
$PAXLIKE_PAXREF, as pax_pipeline_files_test does, and writes a few hundred rows
shaped as the two TFDS datasets it names: c4/en:3.0.4 (text, split 'train2')
and c4/en:3.0.5 (MLPerf's tokenized ids, split 'validation_tokenized_5662seqs').
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("seqio")

import seqio  # noqa: E402
import tensorflow as tf  # noqa: E402
from conftest import describe, parse_trained_line, run_cli, write_tfds  # noqa: E402
from pax_pipeline_files_test import PAXREF, rewrite_imports, write_t5_stand_in  # noqa: E402

from paxlike import config  # noqa: E402
from paxlike.pax import seqio_input  # noqa: E402

VOCAB = seqio.PassThroughVocabulary(size=16)


def _task(name: str, rows: dict[str, list[list[int]]]) -> str:
  """A SeqIO task of these token rows, under a name used once."""
  if name not in seqio.TaskRegistry.names():
    def source(split, shuffle_files=False, seed=None):
      del split, shuffle_files, seed
      return tf.data.Dataset.from_tensor_slices(
          {k: tf.ragged.constant(v, dtype=tf.int32) for k, v in rows.items()})

    seqio.TaskRegistry.add(
        name, source=seqio.FunctionDataSource(source, splits=("train",)), preprocessors=[],
        output_features={k: seqio.Feature(VOCAB, add_eos=False) for k in rows})
  return name


def _first_batch(task: str, lengths: dict[str, int], converter, is_training=True, rows=1):
  cfg = seqio_input.SeqIOInput.HParams(
      name="t", mixture_name=task, split_name="train", task_feature_lengths=lengths,
      feature_converter=converter, is_training=is_training, repeat=False, shuffle=False,
      reset_for_eval=not is_training,
      batch_size=rows, num_infeed_hosts=1, infeed_host_index=0)
  inp = config.build(cfg)
  batch = inp.get_next()
  specs = inp.peek_specs()  # what a dry run plans with, without reading data
  assert {k: (v.shape, v.dtype) for k, v in specs.items()} == {
      k: (v.shape, v.dtype) for k, v in batch.items()}
  return {k: v.tolist() for k, v in batch.items()}


def test_a_packed_prefix_lm_row_is_paxs_documented_example():
  """The packed example in Pax's LanguageModelFeatures docstring (from seqio's), value for
  value: both examples in one row, inputs weighted too (weights_on_targets_only=None)."""
  task = _task("pax_doc_prefix_lm", {"inputs": [[7, 8, 5, 1], [8, 4, 9, 3, 1]],
                                     "targets": [[3, 9, 1], [4, 1]]})
  b = _first_batch(task, {"inputs": 7, "targets": 8},
                   seqio_input.LanguageModelFeatures(pack=True))
  assert b["labels"] == [[7, 8, 5, 1, 3, 9, 1, 8, 4, 9, 3, 1, 4, 1, 0]]
  assert b["ids"] == [[0, 7, 8, 5, 1, 3, 9, 0, 8, 4, 9, 3, 1, 4, 0]]
  assert b["weights"] == [[1] * 14 + [0]]
  assert b["segment_pos"] == [[0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0]]
  assert b["segment_ids"] == [[1] * 7 + [2] * 7 + [0]]
  # weights_on_targets_only=True: the loss is on each example's targets alone.
  b = _first_batch(task, {"inputs": 7, "targets": 8},
                   seqio_input.LanguageModelFeatures(pack=True, weights_on_targets_only=True))
  assert b["weights"] == [[0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0]]
  # An eval input (is_training=False) is not packed: one example a row, no segments.
  b = _first_batch(task, {"inputs": 7, "targets": 8},
                   seqio_input.LanguageModelFeatures(pack=True), is_training=False, rows=2)
  assert "segment_ids" not in b and b["ids"][1][:7] == [0, 8, 4, 9, 3, 1, 4]


def test_reverse_bos_padding_is_c4s_rows_without_bos_and_eos_at_the_end():
  """Pax's C4 converter (bos_id=0, reverse_bos_padding=True, eos_id=1): ids are the tokens
  themselves, each label is the next token, and the last label is EOS with weight 0."""
  task = _task("pax_doc_lm", {"targets": [[5, 6, 7], [9, 10, 11, 12]]})
  c4 = seqio_input.LanguageModelFeatures(pack=True, bos_id=0, reverse_bos_padding=True,
                                         eos_id=1)
  b = _first_batch(task, {"targets": 8}, c4)
  assert b["ids"] == [[5, 6, 7, 9, 10, 11, 12, 0]]
  assert b["labels"] == [[6, 7, 9, 10, 11, 12, 0, 1]]
  assert b["weights"] == [[1, 1, 1, 1, 1, 1, 0, 0]]
  assert b["segment_ids"] == [[1, 1, 1, 2, 2, 2, 2, 0]]
  plain = _first_batch(task, {"targets": 8}, seqio_input.LanguageModelFeatures(), rows=2)
  assert plain["ids"][0] == [0, 5, 6, 7, 0, 0, 0, 0]  # BOS 0 in front, as seqio makes it
  assert plain["labels"][0] == [5, 6, 7, 0, 0, 0, 0, 0]


def test_packed_language_model_features_reads_rows_the_task_packed():
  rows = {"decoder_input_tokens": [[0, 3, 4, 0, 5]], "decoder_target_tokens": [[3, 4, 2, 5, 2]],
          "decoder_loss_weights": [[1, 1, 1, 1, 1]], "decoder_segment_ids": [[1, 1, 1, 2, 2]],
          "decoder_positions": [[0, 1, 2, 0, 1]]}
  task = _task("pax_prepacked", rows)
  b = _first_batch(task, {"targets": 5}, seqio_input.PackedLanguageModelFeatures())
  assert (b["ids"], b["labels"]) == (rows["decoder_input_tokens"], rows["decoder_target_tokens"])
  assert (b["segment_ids"], b["segment_pos"]) == (rows["decoder_segment_ids"],
                                                  rows["decoder_positions"])


# ------------------------------------------------------------- Pax's c4.py on a copy of C4

WORDS = "the a cat dog sat ran on under mat log big small red blue and then".split()


def _write_c4(data_dir, train_rows=512, eval_rows=24, eval_len=40, vocab=300) -> None:
  """TFDS datasets named and shaped as the two c4.py reads (text to train, MLPerf's
  tokenized ids to evaluate), under data_dir."""
  import tensorflow_datasets as tfds

  rng = np.random.default_rng(0)
  text = [{"text": " ".join(rng.choice(WORDS, size=int(rng.integers(5, 30))))}
          for _ in range(train_rows)]
  write_tfds(data_dir, "c4", "3.0.4", {"text": tfds.features.Text()}, {"train2": text},
             config="en")
  ids = [{"ids": rng.integers(2, vocab, size=eval_len).astype(np.int32)}
         for _ in range(eval_rows)]
  write_tfds(data_dir, "c4", "3.0.5", {"ids": tfds.features.Sequence(np.int32)},
             {"validation_tokenized_5662seqs": ids}, config="en")


# Pax's 1B C4 class cut to a CPU's size; its data, converter and schedule are its own.
SMALL = ["NUM_LAYERS=2", "MODEL_DIMS=64", "HIDDEN_DIMS=256", "NUM_HEADS=4", "DIMS_PER_HEAD=16",
         "PERCORE_BATCH_SIZE=8", "MAX_SEQ_LEN=64", "VOCAB_SIZE=320", "ICI_MESH_SHAPE=[1,1,1]",
         "NUM_TRAIN_STEPS=30", "LR_LRED_WARMUP=2", "LR_LRED_DECAY_START=3",
         "EVAL_INTERVAL_STEPS=30"]


@pytest.mark.one_python("3.12")
@pytest.mark.skipif(not (PAXREF / "c4.py").is_file(),
                    reason=f"Pax's c4.py is not in {PAXREF} (set PAXLIKE_PAXREF)")
def test_paxs_c4_file_trains_on_a_local_c4_copy_and_evaluates(tmp_path):
  (tmp_path / "pax_c4.py").write_text(rewrite_imports((PAXREF / "c4.py").read_text()))
  write_t5_stand_in(tmp_path)
  _write_c4(tmp_path / "tfds")
  args = ["--exp=pax_c4.C4Spmd1BAdam4Replicas", "--job_log_dir=job",
          *[a for knob in SMALL for a in ("--set", knob)]]
  # Without --tfds_data_dir the tasks read Pax's bucket, which this machine cannot reach;
  # the dry run plans from the settings alone and reads no data.
  proc = run_cli([*args, "--mode=dry_run"], tmp_path, pythonpath=[tmp_path])
  assert proc.returncode == 0, describe(proc)
  assert not (tmp_path / "job" / "checkpoints").exists()

  proc = run_cli([*args, f"--tfds_data_dir={tmp_path / 'tfds'}"], tmp_path,
                 pythonpath=[tmp_path])
  assert proc.returncode == 0, describe(proc)
  trained = parse_trained_line(proc.stdout)
  assert trained["final_step"] == 30
  assert trained["last_loss"] < 0.5 * trained["first_loss"], describe(proc)
  # The eval reads all 24 tokenized rows; the last position of each has no label (EOS, 0).
  assert "eval_test_C4Validation at step 30:" in proc.stdout
  assert "num_examples 24.0000 num_tokens 936.0000" in proc.stdout, describe(proc)
