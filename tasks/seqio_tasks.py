"""SeqIO registrations of the tasks in tasks/ (needs the `[seqio]` extra).

`paxlike_arithmetic`: tasks.arithmetic's examples and scorer, with seqio's
ByteVocabulary (the same ids as paxlike's native byte vocabulary); EOS after
the targets only (decoder-only models read inputs and targets as one row).

`paxlike_arithmetic_seq2seq`: the same examples for encoder-decoder models
(the enc_dec feature converter): EOS after the inputs and after the targets,
the T5 convention, so it gives the same features as TextInput(enc_dec).
"""

import functools

import seqio
import tensorflow as tf

from tasks import arithmetic

VOCAB = seqio.ByteVocabulary()
ARITHMETIC = "paxlike_arithmetic"
ARITHMETIC_SEQ2SEQ = "paxlike_arithmetic_seq2seq"


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

if ARITHMETIC_SEQ2SEQ not in seqio.TaskRegistry.names():
  seqio.TaskRegistry.add(
      ARITHMETIC_SEQ2SEQ,
      source=seqio.FunctionDataSource(_arithmetic_dataset, splits=("train", "test")),
      # T5X's: trim, then EOS, as TextInput does: a row cut to its length still ends.
      preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
      output_features={
          "inputs": seqio.Feature(VOCAB, add_eos=True),
          "targets": seqio.Feature(VOCAB, add_eos=True)},
      metric_fns=[functools.partial(_exact_match)])
