"""Small MLPerf-BERT-format TFRecord files for tests (TensorFlow needed to write them).

Each example is [CLS] A [SEP] B [SEP] padded with 0, with about 15% of the
tokens of A and B replaced by [MASK] and listed in masked_lm_*, as
create_pretraining_data.py writes them. The text is learnable: each example
repeats a short pattern of ids (period 2 to 4) through A and B, so a masked
token can be told from its neighbours.
"""

from __future__ import annotations

import os

import numpy as np

PAD, CLS, SEP, MASK = 0, 101, 102, 103
FIRST_WORD = 104  # ids below are BERT's special tokens
MASK_RATE = 0.15


def mlperf_example(rng: np.random.Generator, seq_len: int, max_predictions: int,
                   vocab_size: int) -> dict[str, list]:
  """One example's features (the lists a tf.train.Example of the MLPerf format holds)."""
  period = int(rng.integers(2, 5))
  pattern = rng.integers(FIRST_WORD, vocab_size, period)
  total = int(rng.integers(min(8, seq_len), seq_len + 1))  # tokens, specials included
  a_len = int(rng.integers(1, total - 3))
  b_len = total - 3 - a_len
  words = pattern[np.arange(a_len + b_len) % period].tolist()
  ids = [CLS, *words[:a_len], SEP, *words[a_len:], SEP]
  segments = [0] * (a_len + 2) + [1] * (b_len + 1)
  candidates = [i for i, t in enumerate(ids) if t not in (CLS, SEP)]
  count = min(max_predictions, max(1, round(MASK_RATE * len(candidates))))
  positions = sorted(rng.choice(candidates, count, replace=False).tolist())
  originals = [ids[p] for p in positions]
  for p in positions:
    ids[p] = MASK
  pad, pred_pad = seq_len - total, max_predictions - count
  return {"input_ids": ids + [PAD] * pad, "input_mask": [1] * total + [0] * pad,
          "segment_ids": segments + [0] * pad,
          "masked_lm_positions": positions + [0] * pred_pad,
          "masked_lm_ids": originals + [0] * pred_pad,
          "masked_lm_weights": [1.0] * count + [0.0] * pred_pad,
          "next_sentence_labels": [int(rng.integers(0, 2))]}


def write_mlperf_records(directory: str, num_files: int, examples_per_file: int, *,
                         seq_len: int = 128, max_predictions: int = 20, vocab_size: int = 1000,
                         seed: int = 0) -> list[str]:
  """Writes num_files files part-0000i-of-0000N (Pax's pattern 'part@N') in directory.

  Returns:
    The files' paths, in order.
  """
  import tensorflow as tf

  rng = np.random.default_rng(seed)
  os.makedirs(directory, exist_ok=True)
  paths = []
  for i in range(num_files):
    path = os.path.join(directory, f"part-{i:05d}-of-{num_files:05d}")
    with tf.io.TFRecordWriter(path) as writer:
      for _ in range(examples_per_file):
        ex = mlperf_example(rng, seq_len, max_predictions, vocab_size)
        feature = {k: tf.train.Feature(float_list=tf.train.FloatList(value=v))
                   if k == "masked_lm_weights"
                   else tf.train.Feature(int64_list=tf.train.Int64List(value=v))
                   for k, v in ex.items()}
        writer.write(tf.train.Example(
            features=tf.train.Features(feature=feature)).SerializeToString())
    paths.append(path)
  return paths
