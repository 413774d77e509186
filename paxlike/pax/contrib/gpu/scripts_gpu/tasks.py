"""paxml.contrib.gpu.scripts_gpu.tasks: the GPU configs' data mixins (the [seqio] extra).

Pax's GPU scripts read the Pile, LAMBADA and BoolQ as TFDS datasets (the Pile
and LAMBADA as their own builders wrote them: `ThePile` and `MyLambada`,
version 1.0.0, config 'lm'; BoolQ as TFDS's `super_glue/boolq` 1.0.2), in
TFDS_DATA_DIR or --tfds_data_dir, tokenized with the SentencePiece model that
the VOCAB_PATH environment variable names. The mixins here register the same
SeqIO tasks, 'the_pile_lm', 'lambada_eval' and 'boolq', when an experiment's
datasets() is first called (so the configs import without seqio or
VOCAB_PATH) and give Pax's inputs:
- the Pile: rows of MAX_SEQ_LEN tokens cut from concatenated documents, each
  ending in EOS, packed when the template sets PACKED_INPUT, for training and
  its 'validation' split;
- LAMBADA: an eval input of its 'test' split, each passage as the prompt and its
  last word as the target (the loss is on the target only), at most
  MAX_SEQ_LEN - 64 prompt tokens and 64 target tokens;
- BoolQ: 'train' to fine-tune and 'validation' to evaluate, each row the
  passage, "question: ...?" and "answer:" as the prompt (after BOS_ID) and
  'yes' or 'no' as the target. TRUE_TOKEN and FALSE_TOKEN are those words'
  ids (read from VOCAB_PATH), which a LLaMA class gives its model as
  boolq_yn_tokens.
A LAMBADA class sets eval_task='lambada', so its eval reports acc_strict, the
fraction of passages whose whole last word is predicted; a BoolQ class sets
eval_task='boolq', so its eval reports boolq_acc.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import jax

from paxlike.errors import UserError
from paxlike.experiment import BaseExperiment
from paxlike.inputs.seqio_input import _seqio
from paxlike.pax import pax_fiddle, seqio_input
from paxlike.training_experiment import pax_batch_size

PILE = "the_pile_lm"
LAMBADA = "lambada_eval"
BOOLQ = "boolq"
TARGET_ROOM = 64  # LAMBADA's and BoolQ's target length; the prompt has the rest of MAX_SEQ_LEN


def vocabulary() -> Any:
  """The SentencePiece vocabulary at $VOCAB_PATH, as Pax's GPU tasks read it."""
  path = os.environ.get("VOCAB_PATH", "")
  if not path:
    raise UserError("Pax's GPU data mixins tokenize with the SentencePiece model that the "
                    "VOCAB_PATH environment variable names; set VOCAB_PATH=/path/to/spm.model.")
  if "://" not in path and not os.path.isfile(path):
    raise UserError(f"VOCAB_PATH={path} is not a file; point it at a SentencePiece model.")
  return _vocabulary(path)


@functools.cache
def _vocabulary(path: str) -> Any:
  return _seqio("Pax's GPU data mixins read SeqIO data").SentencePieceVocabulary(path)


def register_tasks() -> None:
  """'the_pile_lm', 'lambada_eval' and 'boolq' in SeqIO's registry (once)."""
  seqio = _seqio("Pax's GPU data mixins read SeqIO data")
  if {PILE, LAMBADA, BOOLQ} <= set(seqio.TaskRegistry.names()):
    return
  from paxlike.inputs import seqio_preprocessors as t5_style

  vocab = vocabulary()
  seqio.TaskRegistry.add(
      PILE, source=seqio.TfdsDataSource(tfds_name="ThePile:1.0.0"),
      preprocessors=[
          lambda ds: ds.map(lambda x: {"targets": x["text"]}),
          seqio.preprocessors.tokenize, t5_style.reduce_concat_tokens,
          t5_style.split_tokens_to_targets_length, seqio.preprocessors.append_eos_after_trim],
      output_features={"targets": seqio.Feature(vocab, add_eos=True)},
      shuffle_buffer_size=100000)
  seqio.TaskRegistry.add(
      LAMBADA, source=seqio.TfdsDataSource(tfds_name="MyLambada:1.0.0"),
      preprocessors=[seqio.preprocessors.tokenize],
      output_features={"inputs": seqio.Feature(vocab, add_eos=True, required=False),
                       "targets": seqio.Feature(vocab, add_eos=True)},
      shuffle_buffer_size=None)
  seqio.TaskRegistry.add(
      BOOLQ, source=seqio.TfdsDataSource(tfds_name="super_glue/boolq:1.0.2"),
      preprocessors=[_boolq_prompt, seqio.preprocessors.tokenize],
      output_features={"inputs": seqio.Feature(vocab, add_eos=False),
                       "targets": seqio.Feature(vocab, add_eos=False)},
      shuffle_buffer_size=100000)


def _boolq_prompt(dataset: Any) -> Any:
  """BoolQ's rows as Pax's GPU task words them: the passage, the question, 'answer:'."""
  import tensorflow as tf

  def row(x):
    prompt = tf.strings.join([x["passage"], "\nquestion: ", x["question"], "?\nanswer:"])
    return {"inputs": prompt, "targets": tf.where(x["label"] > 0, "yes", "no")}

  return dataset.map(row, num_parallel_calls=tf.data.AUTOTUNE)


class _Token:
  """A word's ids in the VOCAB_PATH vocabulary, read when asked for (Pax reads it at
  import, which needs VOCAB_PATH before any config is listed)."""

  def __init__(self, word: str) -> None:
    self.word = word

  def __get__(self, obj: Any, owner: type) -> list[int]:
    return list(vocabulary().encode(self.word))


def _input(exp: BaseExperiment, name: str, mixture: str, split: str, is_training: bool,
           lengths: dict[str, int], converter: seqio_input.LanguageModelFeatures,
           seed: int | None, shuffle: bool) -> Any:
  register_tasks()
  # Each host reads its own rows: PERCORE_BATCH_SIZE by Pax's rule (training_experiment's).
  rows = pax_batch_size("PERCORE_BATCH_SIZE", exp.PERCORE_BATCH_SIZE, jax.local_device_count(),
                        jax.process_count())
  return pax_fiddle.Config(
      seqio_input.SeqIOInput, name=name, mixture_name=mixture, split_name=split,
      task_feature_lengths=lengths, feature_converter=converter, is_training=is_training,
      repeat=is_training, reset_for_eval=not is_training, input_random_seed=seed,
      batch_size=rows, num_infeed_hosts=jax.process_count(), shuffle=shuffle)


class PileUnsupervisedDataset(BaseExperiment):
  """The Pile: a training input and a validation input."""

  PERCORE_BATCH_SIZE = 1
  MAX_SEQ_LEN = 2048
  TRAIN_INPUT_RANDOM_SEED = None

  def _pile(self, is_training: bool) -> Any:
    pack = bool(getattr(self, "PACKED_INPUT", False)) and is_training
    return _input(self, "PileTrain" if is_training else "PileValidation", PILE,
                  "train" if is_training else "validation", is_training,
                  {"targets": self.MAX_SEQ_LEN}, seqio_input.LanguageModelFeatures(pack=pack),
                  self.TRAIN_INPUT_RANDOM_SEED if is_training else 4321, shuffle=True)

  def datasets(self) -> list[Any]:
    return [self._pile(True), self._pile(False)]


class LambadaDataset(BaseExperiment):
  """LAMBADA's test split, for zero-shot eval (--mode=eval on a trained job)."""

  PERCORE_BATCH_SIZE = 1
  MAX_SEQ_LEN = 2048

  def datasets(self) -> list[Any]:
    lengths = {"inputs": self.MAX_SEQ_LEN - TARGET_ROOM, "targets": TARGET_ROOM}
    return [_input(self, "LambadaValidation", LAMBADA, "test", False, lengths,
                   seqio_input.LanguageModelFeatures(weights_on_targets_only=True), 4321,
                   shuffle=False)]


class BoolQDataset(BaseExperiment):
  """BoolQ: a fine-tuning input ('train') and an eval input ('validation')."""

  PERCORE_BATCH_SIZE = 8
  MAX_SEQ_LEN = 4096
  BOS_ID = 1
  EOS_ID = 2
  TRAIN_INPUT_RANDOM_SEED = None
  TRUE_TOKEN = _Token("yes")
  FALSE_TOKEN = _Token("no")

  def _boolq(self, is_training: bool) -> Any:
    lengths = {"inputs": self.MAX_SEQ_LEN - TARGET_ROOM, "targets": TARGET_ROOM}
    converter = seqio_input.LanguageModelFeatures(weights_on_targets_only=True,
                                                  bos_id=self.BOS_ID, eos_id=self.EOS_ID)
    return _input(self, "BoolQ", BOOLQ, "train" if is_training else "validation",
                  is_training, lengths, converter,
                  self.TRAIN_INPUT_RANDOM_SEED if is_training else 4321, shuffle=True)

  def datasets(self) -> list[Any]:
    return [self._boolq(True), self._boolq(False)]


__all__ = ["BoolQDataset", "LambadaDataset", "PileUnsupervisedDataset"]
