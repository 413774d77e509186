"""Pax's BERT templates (model_params.TransformerBertPmapAdam / TransformerBertSpmdAdafactor),
with Pax's values, on paxlike's BertModel (paxlike.models.bert).

They are the LM templates (paxlike.lm_experiments) with what Pax's BERT
templates change: a bidirectional LM trained on the masked tokens, softmax
logits capped at 30 and its table drawn from N(0, 1/MODEL_DIMS), and Pax's
BERT names for four knobs the LM templates call otherwise, read through
aliases: ENABLE_BFLOAT16 (the activations' dtype, FPROP_DTYPE), DECAY_END
(the learning rate's decay end), and on the SPMD template MESH_SHAPE (the
[replica, data, mdl] mesh, ICI_MESH_SHAPE) and CHECKPOINT_SAVE_MAX_TO_KEEP.
MASK_TOKEN_ID is the id the model's own corruption writes (the inputs'
remasking takes theirs from their mlm_augmenter); FORCE_MASK_GENERATION
makes the model corrupt every batch itself, even one an input has masked.
Pax's bert.py reads its data from MLPerf TFRecords (TFRecordBertInput, the
seqio extra); paxlike's shipped BERT experiments (experiments/lm/bert.py)
train on the synthetic LM stream.
"""

from __future__ import annotations

import math
from typing import Any

import fiddle as fdl
import jax.numpy as jnp

from paxlike.experiment import pax_alias
from paxlike.layers import activations
from paxlike.layers.masking import MlmMasking
from paxlike.lm_experiments import TransformerLmPmapAdam, TransformerLmSpmdAdafactor
from paxlike.models.bert import BertModel


def _dtype(enable_bfloat16: Any) -> Any:
  return jnp.bfloat16 if enable_bfloat16 else jnp.float32


class BertHParams:
  """What both BERT templates add to the LM's: see the module docstring."""

  MODEL_CLASS = BertModel
  NUM_LAYERS = 4
  VOCAB_SIZE = 32000
  NUM_HEADS = 8
  DIMS_PER_HEAD = None  # MODEL_DIMS / NUM_HEADS, as praxis derives it
  MODEL_DIMS = 128
  HIDDEN_DIMS = MODEL_DIMS * 4
  DROPOUT_PROB = 0.0
  LEARNING_RATE = 1e-3
  WEIGHT_DECAY = 1e-3
  USE_REPEATED_LAYER = False
  CHECKPOINT_POLICY = "SAVE_DOT_WITH_NO_BATCH_DIM"
  ACTIVATION_CLS = activations.ReLU
  USE_GATED_ACTIVATION = False
  CHECKPOINT_EVERY_N_STEPS = 5000
  SOFTMAX_CAP_LOGITS = 30.0
  ATTEN_LOGIT_CAP = 50.0
  MASK_TOKEN_ID = 0
  FORCE_MASK_GENERATION = False
  ENABLE_BFLOAT16 = True
  DECAY_END = 300000

  FPROP_DTYPE = pax_alias("FPROP_DTYPE", "ENABLE_BFLOAT16", _dtype)
  LR_LRED_DECAY_END = pax_alias("LR_LRED_DECAY_END", "DECAY_END")

  def validate(self) -> None:
    super().validate()
    MlmMasking(self.VOCAB_SIZE, self.MASK_TOKEN_ID).check(type(self).__name__)

  def model(self) -> fdl.Config[BertModel]:
    self.not_used("USE_MLPERF_DATA", reason="Pax's bert.py sets it and nothing reads it, in "
                  "Pax either: the data is what datasets() returns")
    cfg = super().model()
    cfg.mask_token_id = self.MASK_TOKEN_ID
    cfg.force_mask_generation = self.FORCE_MASK_GENERATION
    cfg.softmax_weight_init = ("gaussian", 1.0 / math.sqrt(self.MODEL_DIMS))
    return cfg


class TransformerBertPmapAdam(BertHParams, TransformerLmPmapAdam):
  """Pax's model_params.TransformerBertPmapAdam: BERT, data parallel (no mesh), Adam."""

  COMBINE_QKV = False


class TransformerBertSpmdAdafactor(BertHParams, TransformerLmSpmdAdafactor):
  """Pax's model_params.TransformerBertSpmdAdafactor: BERT on MESH_SHAPE's
  [replica, data, mdl] mesh, Adafactor."""

  NUM_LAYERS = 32
  NUM_HEADS = 16
  MODEL_DIMS = 1024
  HIDDEN_DIMS = MODEL_DIMS * 4
  ENABLE_BFLOAT16 = False
  DECAY_END = 100000
  COMBINE_QKV = True
  MESH_SHAPE: list[int] | None = None  # a subclass sets the mesh
  TRAINING_OPTIMIZED_SHARDING = True
  CHECKPOINT_EVERY_N_STEPS = 500
  CHECKPOINT_SAVE_MAX_TO_KEEP = 10

  ICI_MESH_SHAPE = pax_alias("ICI_MESH_SHAPE", "MESH_SHAPE")
  CHECKPOINT_MAX_TO_KEEP = pax_alias("CHECKPOINT_MAX_TO_KEEP", "CHECKPOINT_SAVE_MAX_TO_KEEP")
