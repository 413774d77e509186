"""paxml.seqio_input: Pax's SeqIOInput and feature converters, on paxlike's SeqIO input.

    pax_fiddle.Config(seqio_input.SeqIOInput, mixture_name=..., split_name=...,
                      task_feature_lengths={'targets': 1024},
                      feature_converter=seqio_input.LanguageModelFeatures(pack=True),
                      is_training=True, input_random_seed=..., batch_size=...)

builds paxlike.inputs.seqio_input.SeqIOInput with Pax's fields translated:
LanguageModelFeatures -> the 'decoder' converter with its pack, bos_id, eos_id,
reverse_bos_padding and weights_on_targets_only (Pax's C4 rows: packed, no BOS,
labels ending in EOS); PackedLanguageModelFeatures -> rows the task packed
already; SequenceModelFeatures -> 'enc_dec'; input_random_seed -> seed;
repeat=None -> repeat training data only; num_batches_to_skip -> the stream
starts that many batches in. Nothing here imports seqio or TensorFlow: building
the input does, and without the seqio extra that is one line naming
`pip install -e '.[seqio]'`. A Pax setting paxlike does not honour is refused
in one line: when the input is built, or, for a converter's, when data is read
(a dry run reads none).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from paxlike.errors import UserError
from paxlike.inputs.seqio_input import SeqIOInput as _SeqIOInput
from paxlike.pax._hparams import HParams


@dataclasses.dataclass(frozen=True)
class LanguageModelFeatures:
  """Pax's decoder-only feature converter (its arguments; paxlike converts with seqio's)."""

  pack: bool = False
  use_custom_packing_ops: bool = False
  weights_on_targets_only: bool | None = None
  apply_length_check: bool = True
  bos_id: int = 0
  reverse_bos_padding: bool = False
  eos_id: int = 1
  target_has_suffix: bool = False
  passthrough_features: Mapping[str, Any] | None = None

  def paxlike_settings(self) -> dict[str, Any]:
    """paxlike's SeqIOInput fields for this converter, or a UserError for what it cannot do."""
    for field, value, why in (
        ("target_has_suffix", self.target_has_suffix, "a suffix after the targets"),
        ("passthrough_features", self.passthrough_features, "extra features passed through")):
      if value:
        raise UserError(f"LanguageModelFeatures({field}={value!r}) asks for {why}, which "
                        f"paxlike's seqio converters do not produce; drop {field}.")
    return {"feature_converter": "decoder", "pack": self.pack, "bos_id": self.bos_id,
            "eos_id": self.eos_id, "reverse_bos_padding": self.reverse_bos_padding,
            "weights_on_targets_only": self.weights_on_targets_only}


@dataclasses.dataclass(frozen=True)
class PackedLanguageModelFeatures(LanguageModelFeatures):
  """Rows the task has packed already (its decoder_* features), read as they are."""

  def paxlike_settings(self) -> dict[str, Any]:
    return {**super().paxlike_settings(), "pack": False, "prepacked": True}


@dataclasses.dataclass(frozen=True)
class SequenceModelFeatures:
  """Pax's encoder-decoder feature converter: paxlike's 'enc_dec'."""

  pack: bool = False
  use_custom_packing_ops: bool = False
  bos_id: int = 0

  def paxlike_settings(self) -> dict[str, Any]:
    if self.bos_id != 0:
      raise UserError(f"SequenceModelFeatures(bos_id={self.bos_id}): paxlike's enc_dec "
                      "converter starts decoder inputs with 0; drop bos_id.")
    return {"feature_converter": "enc_dec", "pack": self.pack}


@dataclasses.dataclass(frozen=True)
class PackedSequenceModelFeatures(SequenceModelFeatures):
  """SequenceModelFeatures with pack=True."""

  pack: bool = True


@dataclasses.dataclass
class SeqIOInput(_SeqIOInput):
  """Pax's SeqIOInput fields on paxlike's SeqIO input (see the module docstring)."""

  HParams = HParams()

  feature_converter: Any = "lm"  # a converter above, or paxlike's name ('lm', ...)
  repeat: bool | None = None  # None: repeat training data only, as Pax
  input_random_seed: int | None = None
  mixture_or_task: Any = None  # a seqio task or mixture object: its name is read
  deterministic_input: bool = False
  drop_remainder: bool = True  # moot: training repeats, eval pads its last batch
  num_batches_to_skip: int | None = None
  eval_auto_pad: bool = True
  annotate_padding_fields: bool = False  # padded rows carry weight 0 anyway
  trim_output_features: bool = True
  try_in_mem_cache: bool = True

  def __post_init__(self) -> None:
    where = f"SeqIOInput {self.name!r}"
    for field, value, ok, what in (
        ("deterministic_input", self.deterministic_input, False, "Pax's deterministic input"),
        ("eval_auto_pad", self.eval_auto_pad, True,
         "an eval without padding (paxlike pads the last batch with weight-0 rows)"),
        ("trim_output_features", self.trim_output_features, True, "untrimmed features")):
      if value != ok:
        raise UserError(f"{where}: {field}={value!r} asks for {what}, which paxlike does not "
                        f"do; drop {field}.")
    if self.repeat is None:
      self.repeat = self.is_training
    if self.input_random_seed is not None:
      self.seed = self.input_random_seed
    if self.mixture_or_task is not None:
      self.mixture_name = getattr(self.mixture_or_task, "name", self.mixture_or_task)
    converter = self.feature_converter
    self._refused = None
    if hasattr(converter, "paxlike_settings"):
      try:
        settings = converter.paxlike_settings()
      except UserError as e:
        # Refused when data is read, not now: a dry run reads no data (C4's TFDS cannot
        # be read offline) and needs only the shapes, which the settings give.
        self._refused = str(e)
        settings = {"feature_converter": "decoder", "pack": bool(getattr(converter, "pack",
                                                                          False))}
      for field, value in settings.items():
        setattr(self, field, value)
    elif not isinstance(converter, str):
      raise UserError(f"{where}: feature_converter is a {type(converter).__name__}; paxlike "
                      "takes seqio_input.LanguageModelFeatures, SequenceModelFeatures or a "
                      "converter name ('lm', 'prefix_lm', 'decoder', 'enc_dec').")
    super().__post_init__()
    if self.num_batches_to_skip and self.is_training:
      self._read = int(self.num_batches_to_skip)

  def get_next(self) -> dict[str, np.ndarray]:
    if self._refused:
      raise UserError(self._refused)
    return super().get_next()


__all__ = ["LanguageModelFeatures", "PackedLanguageModelFeatures",
           "PackedSequenceModelFeatures", "SeqIOInput", "SequenceModelFeatures"]
