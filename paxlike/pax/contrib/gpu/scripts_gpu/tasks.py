"""paxml.contrib.gpu.scripts_gpu.tasks: the GPU configs' data mixins, refused when read.

Pax reads the Pile, Lambada and BoolQ through its own TFDS builders and
tokenizers (SeqIO mixtures 'the_pile_lm', 'lambada_eval', 'boolq'), which
paxlike does not provide. The mixins keep Pax's batch and length knobs, so a
class that combines one with a template configures as in Pax; its datasets()
is refused in one line, before anything is written.
"""

from __future__ import annotations

from typing import Any

from paxlike.errors import UserError
from paxlike.experiment import BaseExperiment


class _PaxGpuData(BaseExperiment):
  MIXTURE = ""

  def datasets(self) -> list[Any]:
    raise UserError(f"{type(self).__name__} reads SeqIO mixture {self.MIXTURE!r} through Pax's "
                    "GPU scripts' own TFDS builder and tokenizer, which paxlike does not "
                    "provide; train on your own files with TRAIN_FILES (docs/fine_tuning.md) "
                    "or on lm_cloud.SyntheticDataset.")


class PileUnsupervisedDataset(_PaxGpuData):
  MIXTURE = "the_pile_lm"
  PERCORE_BATCH_SIZE = 1
  MAX_SEQ_LEN = 2048
  TRAIN_INPUT_RANDOM_SEED = None


class LambadaDataset(_PaxGpuData):
  MIXTURE = "lambada_eval"
  PERCORE_BATCH_SIZE = 1
  MAX_SEQ_LEN = 2048


class BoolQDataset(_PaxGpuData):
  MIXTURE = "boolq"
  PERCORE_BATCH_SIZE = 8
  MAX_SEQ_LEN = 4096
  BOS_ID = 1
  EOS_ID = 2
  TRAIN_INPUT_RANDOM_SEED = None


__all__ = ["BoolQDataset", "LambadaDataset", "PileUnsupervisedDataset"]
