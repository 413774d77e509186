"""Unregistered experiment templates for encoder-decoder (T5 / Flan-T5) models.

Hyperparameters keep the LM's names where they mean the same (MODEL_DIMS,
HIDDEN_DIMS, NUM_HEADS, DIMS_PER_HEAD, VOCAB_SIZE, DROPOUT_PROB,
FPROP_DTYPE, ...) and add the encoder-decoder ones: NUM_ENCODER_LAYERS,
NUM_DECODER_LAYERS, MAX_INPUT_LEN (encoder positions) and MAX_TARGET_LEN
(decoder positions). Derived values are computed in model()/datasets() from
`self.X`, so `--set` reaches everything that depends on it.
"""

from __future__ import annotations

from typing import Any

import fiddle as fdl
import jax.numpy as jnp

from paxlike.errors import UserError
from paxlike.file_data import FilesDataset
from paxlike.inputs.synthetic import SyntheticSeq2SeqInput
from paxlike.inputs.text import TextInput
from paxlike.layers.t5 import FFN_ACTIVATIONS
from paxlike.models.t5 import T5Model
from paxlike.training_experiment import AdamTraining, LoraHParams

ACTIVATIONS = FFN_ACTIVATIONS  # what the T5 layers take


class T5SpmdAdam(LoraHParams, AdamTraining):
  """A T5 v1.1-style encoder-decoder trained with Adam on a device mesh."""

  NUM_ENCODER_LAYERS = 2
  NUM_DECODER_LAYERS = 2
  MODEL_DIMS = 64
  HIDDEN_DIMS = None  # None: 4 x MODEL_DIMS
  NUM_HEADS = 4
  DIMS_PER_HEAD = None  # None: MODEL_DIMS // NUM_HEADS
  VOCAB_SIZE = 32128
  MAX_INPUT_LEN = 512
  MAX_TARGET_LEN = 128
  ACTIVATION = "gated-gelu"  # T5 v1.1 / Flan-T5; "relu" is original T5's
  TIE_EMBEDDINGS = False  # True: original T5's shared softmax, scaled by MODEL_DIMS**-0.5
  RELATIVE_ATTENTION_NUM_BUCKETS = 32
  RELATIVE_ATTENTION_MAX_DISTANCE = 128
  LAYERNORM_EPSILON = 1e-6
  DROPOUT_PROB = 0.0
  PERCORE_BATCH_SIZE = 8
  FPROP_DTYPE = jnp.float32
  USE_REPEATED_LAYER = False
  CHECKPOINT_POLICY = "SAVE_NOTHING"

  def validate(self) -> None:
    super().validate()
    self.check_positive("NUM_ENCODER_LAYERS", "NUM_DECODER_LAYERS", "MODEL_DIMS",
                        "VOCAB_SIZE", "MAX_INPUT_LEN", "MAX_TARGET_LEN", "PERCORE_BATCH_SIZE",
                        "NUM_TRAIN_STEPS", "CHECKPOINT_EVERY_N_STEPS", "SUMMARY_INTERVAL_STEPS")
    self.check_heads()
    if self.ACTIVATION not in ACTIVATIONS:
      raise UserError(f"ACTIVATION={self.ACTIVATION!r} is not one of {ACTIVATIONS}.")
    if not 0.0 <= self.DROPOUT_PROB < 1.0:
      raise UserError(f"DROPOUT_PROB must be in [0, 1), got {self.DROPOUT_PROB}.")

  def file_input_settings(self) -> dict[str, Any]:
    """TRAIN_FILES / EVAL_FILES: (inputs, targets) rows as T5X's encoder-decoder features."""
    return {"feature_converter": "enc_dec", "seq_len": self.MAX_INPUT_LEN,
            "target_len": self.MAX_TARGET_LEN}

  def model(self) -> fdl.Config[T5Model]:
    return fdl.Config(
        T5Model, vocab_size=self.VOCAB_SIZE, model_dims=self.MODEL_DIMS,
        num_encoder_layers=self.NUM_ENCODER_LAYERS, num_decoder_layers=self.NUM_DECODER_LAYERS,
        num_heads=self.num_heads(), dim_per_head=self.dims_per_head(),
        hidden_dims=self.hidden_dims(), activation=self.ACTIVATION,
        tie_embeddings=self.TIE_EMBEDDINGS,
        relative_attention_num_buckets=self.RELATIVE_ATTENTION_NUM_BUCKETS,
        relative_attention_max_distance=self.RELATIVE_ATTENTION_MAX_DISTANCE,
        layer_norm_epsilon=self.LAYERNORM_EPSILON, dropout_rate=self.DROPOUT_PROB,
        use_repeated_layer=self.USE_REPEATED_LAYER, checkpoint_policy=self.CHECKPOINT_POLICY,
        fprop_dtype=self.FPROP_DTYPE, max_target_len=self.MAX_TARGET_LEN,
        **self.lora_fields())


class SyntheticSeq2SeqDataset(FilesDataset):
  """Data mixin: the learnable synthetic (inputs -> continuation) stream."""

  DATA_SEED = 4321
  SYNTHETIC_NOISE_RATE = 0.05
  _replaced_by_files = ("DATA_SEED", "SYNTHETIC_NOISE_RATE")

  def own_datasets(self) -> list[fdl.Config]:
    return [fdl.Config(
        SyntheticSeq2SeqInput, name="train", batch_size=self.per_host_batch_size(),
        is_training=True, vocab_size=self.VOCAB_SIZE, seq_len=self.MAX_INPUT_LEN,
        target_len=self.MAX_TARGET_LEN, noise_rate=self.SYNTHETIC_NOISE_RATE,
        seed=self.DATA_SEED)]


class TextSeq2SeqDataset(FilesDataset):
  """Data mixin: (inputs, targets) text pairs from a generator, encoder-decoder features.

  GENERATOR ("module:function") yields {"inputs", "targets"} dicts per split;
  the "train" split trains, "test" is evaluated and decoded (scored with SCORER).
  PACK packs several examples into each training row (MAX_INPUT_LEN encoder
  and MAX_TARGET_LEN decoder positions per row); eval and decode always read
  one example per row.
  """

  GENERATOR = "tasks.arithmetic:examples"
  SCORER = "tasks.arithmetic:score"
  EVAL_BATCH_SIZE = 100
  PACK = False
  _replaced_by_files = ("GENERATOR", "SCORER", "EVAL_BATCH_SIZE")

  def _input(self, split: str, training: bool, name: str) -> fdl.Config[TextInput]:
    return fdl.Config(
        TextInput, name=name, generator=self.GENERATOR, split=split,
        vocabulary=self.VOCABULARY, feature_converter="enc_dec", seq_len=self.MAX_INPUT_LEN,
        target_len=self.MAX_TARGET_LEN, pack=self.PACK and training,
        batch_size=self.per_host_batch_size() if training else self.EVAL_BATCH_SIZE,
        is_training=training, repeat=training, shuffle=training, reset_for_eval=not training,
        scorer=self.SCORER, seed=self.TRAINING_SEED)

  def own_datasets(self) -> list[fdl.Config[TextInput]]:
    return [self._input("train", True, "train"), self._input("test", False, "test")]

  def own_decode_datasets(self) -> list[fdl.Config[TextInput]]:
    return [self._input("test", False, "test")]
