"""SeqIO registrations of the tasks in tasks/ (needs the `[seqio]` extra).

`paxlike_arithmetic`: tasks.arithmetic's examples and scorer, with seqio's
ByteVocabulary (the same ids as paxlike's native byte vocabulary).
"""

import functools

import seqio
import tensorflow as tf

from tasks import arithmetic

VOCAB = seqio.ByteVocabulary()
ARITHMETIC = "paxlike_arithmetic"


def _arithmetic_dataset(split: str, shuffle_files: bool = False, seed: int | None = None):
  del shuffle_files, seed
  rows = arithmetic.examples(split)
  return tf.data.Dataset.from_tensor_slices({
      "inputs": [r["inputs"] for r in rows], "targets": [r["targets"] for r in rows]})


def _exact_match(targets, predictions):
  return arithmetic.score(list(targets), list(predictions))


if ARITHMETIC not in seqio.TaskRegistry.names():
  seqio.TaskRegistry.add(
      ARITHMETIC,
      source=seqio.FunctionDataSource(_arithmetic_dataset, splits=("train", "test")),
      preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
      output_features={
          "inputs": seqio.Feature(VOCAB, add_eos=False),
          "targets": seqio.Feature(VOCAB, add_eos=True)},
      metric_fns=[functools.partial(_exact_match)])
