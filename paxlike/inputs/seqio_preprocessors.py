"""t5's two language-model preprocessors, for SeqIO tasks (the [seqio] extra).

Pax's C4 and Pile tasks name t5.data.preprocessors' reduce_concat_tokens and
split_tokens_to_targets_length. The t5 package brings far more than these two
(Mesh TensorFlow, PyTorch, transformers), so paxlike writes them: documents
are joined into long token rows, which are cut into rows of the targets'
length. Importing this module imports TensorFlow.
"""

from __future__ import annotations

import tensorflow as tf


def reduce_concat_tokens(dataset: tf.data.Dataset, feature_key: str = "targets",
                         batch_size: int = 128) -> tf.data.Dataset:
  """Each batch_size examples' tokens (their padding 0s dropped) as one row."""
  dataset = dataset.map(lambda x: {feature_key: x[feature_key]})
  dataset = dataset.padded_batch(batch_size, padded_shapes={feature_key: [-1]})

  def concat(x):
    flat = tf.reshape(x[feature_key], [-1])
    return {feature_key: tf.boolean_mask(flat, flat != 0)}

  return dataset.map(concat)


def split_tokens_to_targets_length(dataset: tf.data.Dataset, sequence_length: dict[str, int],
                                   output_features: dict) -> tf.data.Dataset:
  """Rows cut into pieces of the targets' length, less one where an EOS is appended later."""
  n = sequence_length["targets"] - int(output_features["targets"].add_eos)

  def pieces(x):
    tokens = x["targets"]
    rows = tf.reshape(tf.pad(tokens, [[0, (-tf.size(tokens)) % n]]), [-1, n])
    return tf.data.Dataset.from_tensor_slices({"targets": rows}).map(
        lambda r: {"targets": tf.boolean_mask(r["targets"], r["targets"] != 0)})

  return dataset.flat_map(pieces)
