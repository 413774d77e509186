"""paxml.tasks.vision.input_generator: the names paxml's imagenet_resnets.py reads.

paxml's ImageNet inputs are lingvo input generators over ImageNet TFRecords
with lingvo's ResNet preprocessing; paxlike does not read them. Their
configs here give the batch's shapes (image [B, H, W, 3], label_probs [B,
1000], weight and eval_sample_weights [B]), so a dry run plans the experiment
as written; reading a batch says, in one line, to give datasets() an input of
your own images.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from paxlike.errors import UserError
from paxlike.pax import pax_fiddle
from paxlike.pax.base_input import BaseInput

TRAIN_EXAMPLES = 1281167  # ImageNet-1k's training images
VALIDATION_EXAMPLES = 50000


@dataclasses.dataclass
class ImageNetInput(BaseInput):
  """paxml's lingvo ImageNet input, as shapes only (see the module docstring)."""

  image_size: int = 224
  num_classes: int = 1000

  @classmethod
  def Params(cls) -> pax_fiddle.Config:  # noqa: N802
    return pax_fiddle.Config(cls)

  def peek_specs(self) -> dict[str, Any]:
    rows, size = self.batch_size, self.image_size
    return {"image": np.zeros((rows, size, size, 3), np.float32),
            "label_probs": np.zeros((rows, self.num_classes), np.float32),
            "weight": np.zeros((rows,), np.float32),
            "eval_sample_weights": np.zeros((rows,), np.float32)}

  def get_next(self) -> dict[str, Any]:
    raise UserError(f"{type(self).__name__} is paxml's lingvo ImageNet input, which paxlike "
                    "does not read; give datasets() a BaseInput of your own images (image "
                    "[B, H, W, 3] float32, label_probs [B, classes], weight [B]).")


@dataclasses.dataclass
class ImageNetTrain(ImageNetInput):
  """paxml's ImageNetTrain."""


@dataclasses.dataclass
class ImageNetValidation(ImageNetInput):
  """paxml's ImageNetValidation."""


__all__ = ["TRAIN_EXAMPLES", "VALIDATION_EXAMPLES", "ImageNetInput", "ImageNetTrain",
           "ImageNetValidation"]
