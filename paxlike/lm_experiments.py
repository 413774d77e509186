"""Unregistered experiment templates for Transformer LMs.

The shipped experiments in experiments/lm/ subclass these (model template x
data mixin x size), as Pax's lm_cloud.py subclasses its model_params. Every
derived value is computed in task()/datasets() from `self.X`, so a `--set`
override of X reaches everything that depends on it.
"""

from __future__ import annotations

import fiddle as fdl
import jax.numpy as jnp

from paxlike.experiment import BaseExperiment
from paxlike.inputs.synthetic import SyntheticLmInput
from paxlike.models.language_model import LanguageModel
from paxlike.training_experiment import AdamTraining


class TransformerLmSpmdAdam(AdamTraining):
  """A decoder-only Transformer LM trained with Adam on a device mesh."""

  NUM_LAYERS = 2
  MODEL_DIMS = 64
  HIDDEN_DIMS = None  # None: 4 x MODEL_DIMS
  NUM_HEADS = 4
  DIMS_PER_HEAD = None  # None: MODEL_DIMS // NUM_HEADS
  VOCAB_SIZE = 256
  MAX_SEQ_LEN = 64
  PERCORE_BATCH_SIZE = 8
  FPROP_DTYPE = jnp.float32
  USE_REPEATED_LAYER = True
  CHECKPOINT_POLICY = "SAVE_NOTHING"
  COMBINE_QKV = False
  ACTIVATION = "relu"

  def validate(self) -> None:
    super().validate()
    self.check_positive("NUM_LAYERS", "MODEL_DIMS", "VOCAB_SIZE", "MAX_SEQ_LEN",
                        "PERCORE_BATCH_SIZE", "NUM_TRAIN_STEPS", "CHECKPOINT_EVERY_N_STEPS",
                        "SUMMARY_INTERVAL_STEPS")
    self.check_heads()

  def model(self) -> fdl.Config[LanguageModel]:
    return fdl.Config(
        LanguageModel, vocab_size=self.VOCAB_SIZE, model_dims=self.MODEL_DIMS,
        num_layers=self.NUM_LAYERS, num_heads=self.num_heads(),
        dim_per_head=self.dims_per_head(), hidden_dims=self.hidden_dims(),
        activation=self.ACTIVATION, combine_qkv=self.COMBINE_QKV,
        use_repeated_layer=self.USE_REPEATED_LAYER, checkpoint_policy=self.CHECKPOINT_POLICY,
        fprop_dtype=self.FPROP_DTYPE)


class SyntheticDataset(BaseExperiment):
  """Data mixin: the learnable synthetic LM stream of paxlike.inputs.synthetic."""

  DATA_SEED = 4321
  SYNTHETIC_NOISE_RATE = 0.05

  def datasets(self) -> list[fdl.Config]:
    return [fdl.Config(
        SyntheticLmInput, name="train", batch_size=self.per_host_batch_size(),
        is_training=True, vocab_size=self.VOCAB_SIZE, seq_len=self.MAX_SEQ_LEN,
        noise_rate=self.SYNTHETIC_NOISE_RATE, seed=self.DATA_SEED)]
