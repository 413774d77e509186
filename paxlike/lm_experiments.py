"""Unregistered experiment templates for Transformer LMs.

The shipped experiments in experiments/lm/ subclass these (model template x
data mixin x size), as Pax's lm_cloud.py subclasses its model_params. Every
derived value is computed in task()/datasets() from `self.X`, so a `--set`
override of X reaches everything that depends on it.
"""

from __future__ import annotations

import fiddle as fdl
import jax
import jax.numpy as jnp

from paxlike.errors import UserError
from paxlike.experiment import BaseExperiment
from paxlike.inputs.synthetic import SyntheticLmInput
from paxlike.learners import Learner
from paxlike.models.language_model import LanguageModel
from paxlike.task import Task, TrainSettings


class TransformerLmSpmdAdam(BaseExperiment):
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

  OPTIMIZER = "adam"
  LEARNING_RATE = 2.5e-4
  LR_SCHEDULE = "constant"
  LR_COS_WARMUP = 0
  LR_COS_DECAY_START = 0
  LR_COS_DECAY_END = 0
  LR_COS_MIN_RATIO = 0.1
  ADAM_BETA1 = 0.9
  ADAM_BETA2 = 0.99
  ADAM_EPSILON = 1e-6
  WEIGHT_DECAY = 1e-3
  CLIP_GRADIENT_NORM_TO_VALUE = 1.0

  NUM_TRAIN_STEPS = 1000
  CHECKPOINT_EVERY_N_STEPS = 1000
  MAX_CKPT_TO_KEEP = 10
  SUMMARY_INTERVAL_STEPS = 100
  EVAL_INTERVAL_STEPS = 0
  TRAIN_SEED = 1234

  ICI_MESH_SHAPE = [1, 1, 1]
  DCN_MESH_SHAPE = None

  def hidden_dims(self) -> int:
    return self.HIDDEN_DIMS if self.HIDDEN_DIMS is not None else 4 * self.MODEL_DIMS

  def dims_per_head(self) -> int:
    return self.DIMS_PER_HEAD if self.DIMS_PER_HEAD is not None else (
        self.MODEL_DIMS // self.NUM_HEADS)

  def validate(self) -> None:
    super().validate()
    for name in ("NUM_LAYERS", "MODEL_DIMS", "NUM_HEADS", "VOCAB_SIZE", "MAX_SEQ_LEN",
                 "PERCORE_BATCH_SIZE", "NUM_TRAIN_STEPS", "CHECKPOINT_EVERY_N_STEPS",
                 "SUMMARY_INTERVAL_STEPS"):
      if getattr(self, name) <= 0:
        raise UserError(f"{name} must be positive, got {getattr(self, name)}.")
    if self.DIMS_PER_HEAD is None and self.MODEL_DIMS % self.NUM_HEADS:
      raise UserError(f"MODEL_DIMS={self.MODEL_DIMS} does not divide into NUM_HEADS="
                      f"{self.NUM_HEADS} heads; set DIMS_PER_HEAD or change one of them.")

  def model(self) -> fdl.Config[LanguageModel]:
    return fdl.Config(
        LanguageModel, vocab_size=self.VOCAB_SIZE, model_dims=self.MODEL_DIMS,
        num_layers=self.NUM_LAYERS, num_heads=self.NUM_HEADS,
        dim_per_head=self.dims_per_head(), hidden_dims=self.hidden_dims(),
        activation=self.ACTIVATION, combine_qkv=self.COMBINE_QKV,
        use_repeated_layer=self.USE_REPEATED_LAYER, checkpoint_policy=self.CHECKPOINT_POLICY,
        fprop_dtype=self.FPROP_DTYPE)

  def learner(self) -> fdl.Config[Learner]:
    return fdl.Config(
        Learner, optimizer=self.OPTIMIZER, learning_rate=self.LEARNING_RATE,
        schedule=self.LR_SCHEDULE, warmup_steps=self.LR_COS_WARMUP,
        decay_start=self.LR_COS_DECAY_START, decay_end=self.LR_COS_DECAY_END,
        min_ratio=self.LR_COS_MIN_RATIO, beta1=self.ADAM_BETA1, beta2=self.ADAM_BETA2,
        epsilon=self.ADAM_EPSILON, weight_decay=self.WEIGHT_DECAY,
        clip_gradient_norm_to_value=self.CLIP_GRADIENT_NORM_TO_VALUE)

  def task(self) -> fdl.Config[Task]:
    return fdl.Config(
        Task, model=self.model(), learner=self.learner(),
        train=fdl.Config(
            TrainSettings, num_train_steps=self.NUM_TRAIN_STEPS,
            checkpoint_every_n_steps=self.CHECKPOINT_EVERY_N_STEPS,
            max_checkpoints_to_keep=self.MAX_CKPT_TO_KEEP,
            summary_interval_steps=self.SUMMARY_INTERVAL_STEPS,
            eval_interval_steps=self.EVAL_INTERVAL_STEPS, seed=self.TRAIN_SEED))

  def per_host_batch_size(self) -> int:
    """PERCORE_BATCH_SIZE x this host's device count (Pax's convention)."""
    return self.PERCORE_BATCH_SIZE * jax.local_device_count()


class SyntheticDataset(BaseExperiment):
  """Data mixin: the learnable synthetic LM stream of paxlike.inputs.synthetic."""

  DATA_SEED = 4321
  SYNTHETIC_NOISE_RATE = 0.05

  def datasets(self) -> list[fdl.Config]:
    return [fdl.Config(
        SyntheticLmInput, name="train", batch_size=self.per_host_batch_size(),
        is_training=True, vocab_size=self.VOCAB_SIZE, seq_len=self.MAX_SEQ_LEN,
        noise_rate=self.SYNTHETIC_NOISE_RATE, seed=self.DATA_SEED)]
