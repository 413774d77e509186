"""paxml.tasks.lm.input_generator: the synthetic LM input lm_cloud.py trains on, and the
MLPerf BERT TFRecords input bert.py reads (TensorFlow only when it reads)."""

import dataclasses

from paxlike.inputs.bert_records import TFRecordBertInput as _TFRecordBertInput
from paxlike.inputs.synthetic import SyntheticLmInput
from paxlike.layers.masking import MlmMasking
from paxlike.pax._hparams import HParams


@dataclasses.dataclass
class SyntheticLmData(SyntheticLmInput):
  """paxlike's learnable synthetic stream; `SyntheticLmData.HParams()` as in Pax.

  Pax's fields batch_size and seq_len mean the same here. The token ids stay
  below vocab_size, by default the model's VOCAB_SIZE (Pax's stream is all ones,
  inside any vocabulary).
  """

  vocab_size: int | None = None
  HParams = HParams()


class TFRecordBertInput(_TFRecordBertInput):
  """paxlike.inputs.bert_records.TFRecordBertInput; `TFRecordBertInput.HParams()` as in Pax.

  A pax_fiddle.Config of it starts with `mlm_augmenter` as a config of
  MlmMasking (praxis's instance_field), so bert.py's
  `p.mlm_augmenter.Set(mask_token_id=103, vocab_size=30522)` edits it.
  """

  HParams = HParams()

  @classmethod
  def sub_templates(cls) -> dict[str, type]:
    """Fields a pax_fiddle.Config fills with a config of a class (see pax_fiddle)."""
    return {"mlm_augmenter": MlmMasking}


__all__ = ["SyntheticLmData", "TFRecordBertInput"]
