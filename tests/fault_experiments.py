"""Test-only experiments for the fault tests (import path: tests/ on PYTHONPATH).

- FaultTiny: LmCloudSpmdTiny, 16 steps, checkpoints every 4, and an eval set
  evaluated every 4 steps, so a run has steps, saves and evals to be killed in.
- NanTiny: the loss of training step NAN_AT_STEP is NaN (its batch carries
  NaN weights); every other step is the tiny model's.
- TextTiny: the tiny model on local text files (DATA_FILES), for bad-file errors.
"""

from __future__ import annotations

import dataclasses

import fiddle as fdl
import numpy as np

from experiments.lm.lm_cloud import LmCloudSpmdTiny
from paxlike import experiment_registry
from paxlike.inputs.synthetic import SyntheticLmInput


@dataclasses.dataclass
class NanAtStepInput(SyntheticLmInput):
  """SyntheticLmInput whose batch for training step nan_at_step (1-based) has NaN weights."""

  nan_at_step: int = 0

  def batch_at(self, step: int) -> dict[str, np.ndarray]:
    batch = super().batch_at(step)
    if self.is_training and step + 1 == self.nan_at_step:
      batch["weights"] = np.full_like(batch["weights"], np.nan)
    return batch


@experiment_registry.register
class FaultTiny(LmCloudSpmdTiny):
  NUM_TRAIN_STEPS = 16
  CHECKPOINT_EVERY_N_STEPS = 4
  SUMMARY_INTERVAL_STEPS = 4
  EVAL_INTERVAL_STEPS = 4
  PERCORE_BATCH_SIZE = 8
  CHECKPOINT_MAX_TO_KEEP = 3

  def datasets(self) -> list[fdl.Config]:
    train = super().datasets()[0]
    evals = fdl.Config(SyntheticLmInput, name="test", batch_size=8, is_training=False,
                       repeat=False, reset_for_eval=True, eval_loop_num_batches=2,
                       vocab_size=self.VOCAB_SIZE,
                       seq_len=self.MAX_SEQ_LEN, seed=self.DATA_SEED)
    return [train, evals]


@experiment_registry.register
class NanTiny(LmCloudSpmdTiny):
  NUM_TRAIN_STEPS = 12
  CHECKPOINT_EVERY_N_STEPS = 4
  SUMMARY_INTERVAL_STEPS = 4
  PERCORE_BATCH_SIZE = 8
  NAN_AT_STEP = 6

  def datasets(self) -> list[fdl.Config]:
    train = super().datasets()[0]
    return [fdl.Config(NanAtStepInput, **{**fdl.ordered_arguments(train),
                                          "nan_at_step": self.NAN_AT_STEP})]


@experiment_registry.register
class TextTiny(LmCloudSpmdTiny):
  """The tiny model on local text files (paxlike.inputs.text), DATA_FILES a glob."""

  DATA_FILES = "data/*.txt"
  VOCAB_SIZE = 264  # byte vocabulary, padded

  def datasets(self) -> list[fdl.Config]:
    from paxlike.inputs.text import TextInput

    return [fdl.Config(TextInput, name="train", file_pattern=self.DATA_FILES,
                       vocabulary="byte", seq_len=self.MAX_SEQ_LEN,
                       batch_size=self.per_host_batch_size(), is_training=True,
                       seed=self.DATA_SEED)]
