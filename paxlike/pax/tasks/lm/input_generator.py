"""paxml.tasks.lm.input_generator: the synthetic LM input lm_cloud.py trains on."""

import dataclasses

from paxlike.inputs.synthetic import SyntheticLmInput
from paxlike.pax._hparams import HParams


@dataclasses.dataclass
class SyntheticLmData(SyntheticLmInput):
  """paxlike's learnable synthetic stream; `SyntheticLmData.HParams()` as in Pax.

  Pax's fields batch_size and seq_len mean the same here; the token ids stay
  below vocab_size (default 256), inside any LM's vocabulary.
  """

  HParams = HParams()


__all__ = ["SyntheticLmData"]
