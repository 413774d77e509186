"""Unregistered experiment templates for Transformer LMs, with Pax's defaults.

The shipped experiments in experiments/lm/ subclass these (model template x
data mixin x size), as Pax's lm_cloud.py subclasses its model_params. Every
derived value is computed in task()/datasets() from `self.X`, so a `--set`
override of X reaches everything that depends on it.

The templates carry the values of Pax's templates of the same name (paxml's
tasks/lm/model_params.py and c4.py's TransformerLmSpmdAdam): pod-sized,
bfloat16 or float32 as Pax has them. They define no input sizes
(MAX_SEQ_LEN, PERCORE_BATCH_SIZE): those belong to the data mixin, so a class
written in Pax's order, `class X(Template, DataMixin)`, gets the mixin's.
The CPU-sized values live in the CPU experiments.
"""

from __future__ import annotations

import fiddle as fdl
import jax.numpy as jnp

from paxlike.experiment import BaseExperiment
from paxlike.inputs.synthetic import SyntheticLmInput
from paxlike.models.language_model import LanguageModel
from paxlike.training_experiment import AdamTraining


class TransformerLmSpmdAdam(AdamTraining):
  """A decoder-only Transformer LM trained with Adam on a device mesh.

  Pax's c4.TransformerLmSpmdAdam: its own values, and those it inherits
  from model_params.TransformerLmSpmdAdafactor. Like Pax's, it sets both
  NUM_HEADS and DIMS_PER_HEAD; a subclass sets the dims that fit together.
  """

  NUM_LAYERS = 32
  MODEL_DIMS = 1024
  HIDDEN_DIMS = None  # None: 4 x MODEL_DIMS
  NUM_HEADS = 16  # None: MODEL_DIMS // DIMS_PER_HEAD
  DIMS_PER_HEAD = 128  # None: MODEL_DIMS // NUM_HEADS
  VOCAB_SIZE = 32000
  FPROP_DTYPE = jnp.float32
  USE_REPEATED_LAYER = False
  CHECKPOINT_POLICY = "SAVE_NOTHING"
  COMBINE_QKV = True
  ACTIVATION = "relu"

  LEARNING_RATE = 1e-3
  ADAM_BETA1 = 0.9
  ADAM_BETA2 = 0.99
  ADAM_EPSILON = 1e-6
  WEIGHT_DECAY = 1e-3
  CLIP_GRADIENT_NORM_TO_VALUE = 5.0
  LR_SCHEDULE = "linear_rampup_exponential_decay"
  # The exponential schedule reads LR_COS_* today; Pax names it LR_LRED_* (the
  # schedules' own names land with the LR_LRED_* schedule work). Pax sets both.
  LR_COS_WARMUP = 4000
  LR_COS_DECAY_START = 4001
  LR_COS_DECAY_END = 300000
  LR_COS_MIN_RATIO = 0.1
  LR_LRED_WARMUP = 4000
  LR_LRED_DECAY_START = 4001
  LR_LRED_DECAY_END = 300000
  LR_LRED_MIN_RATIO = 0.1

  NUM_TRAIN_STEPS = 10_000_000  # Pax's task default (1e7): a Pax LM trains until stopped
  CHECKPOINT_EVERY_N_STEPS = 5000
  SUMMARY_INTERVAL_STEPS = 100
  EVAL_INTERVAL_STEPS = 100
  ICI_MESH_SHAPE = None  # Pax: a subclass sets the mesh; None runs the pmap loop
  TRAINING_OPTIMIZED_SHARDING = True

  def validate(self) -> None:
    super().validate()
    # MAX_SEQ_LEN and PERCORE_BATCH_SIZE come from the data mixin, when it has them.
    self.check_positive(*(n for n in (
        "NUM_LAYERS", "MODEL_DIMS", "VOCAB_SIZE", "MAX_SEQ_LEN", "PERCORE_BATCH_SIZE",
        "NUM_TRAIN_STEPS", "CHECKPOINT_EVERY_N_STEPS", "SUMMARY_INTERVAL_STEPS")
        if hasattr(self, n)))
    self.check_heads()

  def model(self) -> fdl.Config[LanguageModel]:
    return fdl.Config(
        LanguageModel, vocab_size=self.VOCAB_SIZE, model_dims=self.MODEL_DIMS,
        num_layers=self.NUM_LAYERS, num_heads=self.num_heads(),
        dim_per_head=self.dims_per_head(), hidden_dims=self.hidden_dims(),
        activation=self.ACTIVATION, combine_qkv=self.COMBINE_QKV,
        use_repeated_layer=self.USE_REPEATED_LAYER, checkpoint_policy=self.CHECKPOINT_POLICY,
        fprop_dtype=self.FPROP_DTYPE)


class TransformerLmSpmdAdafactor(TransformerLmSpmdAdam):
  """Pax's model_params.TransformerLmSpmdAdafactor: the base of Pax's SPMD LMs.

  paxlike keeps the model in TransformerLmSpmdAdam; this template differs
  from it in what Pax's Adafactor template has that c4's Adam one changes.
  """

  NUM_LAYERS = 10
  MODEL_DIMS = 2048
  NUM_HEADS = None
  DIMS_PER_HEAD = 128
  FPROP_DTYPE = jnp.bfloat16
  OPTIMIZER = "adafactor"  # Pax's set_default_adafactor: beta1 0.9, decay 0.99
  LEARNING_RATE = 2.5e-4
  LR_COS_DECAY_END = 100000  # Pax's DECAY_END for Adafactor
  LR_LRED_DECAY_END = 100000


class TransformerLmPmapAdam(TransformerLmSpmdAdam):
  """Pax's model_params.TransformerLmPmapAdam: data parallel (no mesh), Adam.

  Pax builds it with set_default_adam (gradient clip 5.0, warmup 4000,
  exponential decay to 0.1 at 300k), no combined QKV, no output logit cap.
  """

  ICI_MESH_SHAPE = None
  NUM_LAYERS = 32
  MODEL_DIMS = 1024
  NUM_HEADS = 16
  DIMS_PER_HEAD = None
  FPROP_DTYPE = jnp.float32
  COMBINE_QKV = False
  SOFTMAX_CAP_LOGITS = 0.0  # Pax's pmap template caps only the attention logits (50)


class SyntheticDataset(BaseExperiment):
  """Data mixin: the learnable synthetic LM stream of paxlike.inputs.synthetic.

  Its sizes are Pax's lm_cloud.SyntheticDataset's.
  """

  PERCORE_BATCH_SIZE = 16
  MAX_SEQ_LEN = 1024
  DATA_SEED = 4321
  SYNTHETIC_NOISE_RATE = 0.05

  def datasets(self) -> list[fdl.Config]:
    return [fdl.Config(
        SyntheticLmInput, name="train", batch_size=self.per_host_batch_size(),
        is_training=True, vocab_size=self.VOCAB_SIZE, seq_len=self.MAX_SEQ_LEN,
        noise_rate=self.SYNTHETIC_NOISE_RATE, seed=self.DATA_SEED)]
