"""Pax's C4 pod-scale experiments (paxml/tasks/lm/params/c4.py), with Pax's numbers.

Pax trains these on C4 through SeqIO/TFDS (gs://mlperf-llm-public2), which
is not available here. They read `C4StandInDataset` instead: the synthetic
LM stream with C4's shapes (the experiment's vocabulary and sequence length,
PERCORE_BATCH_SIZE x local devices per host), so `--mode=dry_run` checks
them exactly as Pax would run them, and a training run on them measures
speed, not language modelling. The classes with Pax's names have Pax's
values field by field (c4.py's TransformerLmSpmdAdam template: Adam 0.9/0.99,
gradient clip 5.0, exponential decay after 4000 warmup steps, combined QKV,
logit caps 50 / 30, training-optimized sharding).

Check one on a CPU, without allocating it:

    python -m paxlike.main --exp=C4Spmd16BAdam32Replicas --job_log_dir=jobs/c4_16b \\
        --mode=dry_run --target=tpu_v4
"""

import jax.numpy as jnp

from paxlike import experiment_registry
from paxlike.layers.activations import GELU
from paxlike.lm_experiments import SyntheticDataset, TransformerLmSpmdAdam


class C4StandInDataset(SyntheticDataset):
  """Data mixin: C4-shaped batches from the synthetic stream (C4 needs SeqIO and GCS).

  Its sizes are Pax's C4UnsupervisedDataset's.
  """

  PERCORE_BATCH_SIZE = 1
  MAX_SEQ_LEN = 1024


@experiment_registry.register
class C4SpmdAdam(TransformerLmSpmdAdam, C4StandInDataset):
  """Pax's base decoder-only LM on C4: Adam, GELU, exponential learning-rate decay."""

  NUM_LAYERS = 24
  NUM_HEADS = 32
  MODEL_DIMS = 2048
  HIDDEN_DIMS = None  # 4 x MODEL_DIMS, derived so that --set MODEL_DIMS reaches it
  DIMS_PER_HEAD = None
  VOCAB_SIZE = 32128
  ACTIVATION = "gelu"
  ACTIVATION_CLS = GELU  # Pax's name; read once ACTIVATION_CLS lands (the same value)
  USE_GATED_ACTIVATION = False
  CHECKPOINT_POLICY = "SAVE_DOT_FOR_MLPERF_200B"
  CHECKPOINT_EVERY_N_STEPS = 1000
  ICI_MESH_SHAPE = [1, 4, 2]


class C4SpmdAdamBf16(C4SpmdAdam):
  """What Pax's 1B to 32B C4 runs each set: bf16, 32k vocabulary, repeated layers."""

  MAX_SEQ_LEN = 1024
  VOCAB_SIZE = 32000
  FPROP_DTYPE = jnp.bfloat16
  USE_REPEATED_LAYER = True
  SUMMARY_INTERVAL_STEPS = 10
  CHECKPOINT_POLICY = "SAVE_NOTHING"


@experiment_registry.register
class C4Spmd1BAdam4Replicas(C4SpmdAdamBf16):
  """1B parameters on 4 chips; global batch 1 x 4 x 1 x 32 = 128."""

  NUM_LAYERS = 13
  MODEL_DIMS = 2560
  NUM_HEADS = 20
  DIMS_PER_HEAD = 128
  PERCORE_BATCH_SIZE = 32
  ICI_MESH_SHAPE = [1, 4, 1]


@experiment_registry.register
class C4Spmd2BAdam4Replicas(C4SpmdAdamBf16):
  """2B parameters on 4 chips; global batch 1 x 4 x 1 x 32 = 128."""

  NUM_LAYERS = 18
  MODEL_DIMS = 3072
  NUM_HEADS = 24
  DIMS_PER_HEAD = 128
  PERCORE_BATCH_SIZE = 32
  ICI_MESH_SHAPE = [1, 4, 1]


@experiment_registry.register
class C4Spmd16BAdam32Replicas(C4SpmdAdamBf16):
  """16B parameters on 32 chips; global batch 1 x 16 x 2 x 16 = 512."""

  NUM_LAYERS = 36
  MODEL_DIMS = 6144
  NUM_HEADS = 48
  DIMS_PER_HEAD = 128
  PERCORE_BATCH_SIZE = 16
  ICI_MESH_SHAPE = [1, 16, 2]


@experiment_registry.register
class C4Spmd32BAdam64Replicas(C4SpmdAdamBf16):
  """32B parameters on 64 chips; global batch 1 x 16 x 4 x 8 = 512."""

  NUM_LAYERS = 40
  MODEL_DIMS = 8192
  NUM_HEADS = 64
  DIMS_PER_HEAD = 128
  PERCORE_BATCH_SIZE = 8
  ICI_MESH_SHAPE = [1, 16, 4]


@experiment_registry.register
class C4SpmdGpt3AdamOrgHP(C4SpmdAdam):
  """GPT-3 175B with the paper's hyperparameters; 768 chips, global batch 1536.

  Pax's GPT-3: a trainable position table (16384 rows), attention biases,
  no logit caps, LayerNorm epsilon 1e-5, and the vocabulary of 50257 (51200
  where the 1536-chip child pads it). The knobs marked below are read once
  the model's Pax knobs land; until the vocabulary is padded for the
  sharding, the dry run refuses a vocabulary the 'mdl' axis does not divide.
  """

  MAX_SEQ_LEN = 2048
  NUM_LAYERS = 96
  NUM_HEADS = 96
  MODEL_DIMS = 12288
  DIMS_PER_HEAD = None  # 128
  VOCAB_SIZE = 50257
  USE_REPEATED_LAYER = True
  ACTIVATION = "gelu"
  CHECKPOINT_POLICY = "SAVE_NOTHING"
  # Pax's model knobs for GPT-3:
  SEPARATE_EMBEDDING = False
  TRAINABLE_POSITION_EMB = True
  TRAINABLE_PE_MAX_SEQ_LEN = 16384
  ATTEN_LOGIT_CAP = -1.0  # no cap on the attention logits
  SOFTMAX_CAP_LOGITS = 0.0  # Pax's GPT-3 drops the output logit cap too
  USE_BIAS = True  # GPT-3's attention projections have biases
  LAYERNORM_EPSILON = 1e-5
  # Pax's task() turns off the softmax bias and the per-dim query scale.
  SOFTMAX_HAS_BIAS = False
  PER_DIM_SCALE = False

  LEARNING_RATE = 6e-5
  WEIGHT_DECAY = 0.1
  ADAM_BETA1 = 0.9
  ADAM_BETA2 = 0.95
  ADAM_EPSILON = 1e-8
  ADAM_CLIP_THRESHOLD = -1.0  # Pax's Adam update clipping off (read once it lands)
  CLIP_GRADIENT_NORM_TO_VALUE = 1.0
  LR_SCHEDULE = "linear_rampup_cosine_decay"
  LR_COS_WARMUP = 265
  LR_COS_DECAY_START = 266
  LR_COS_DECAY_END = 108600
  LR_COS_MIN_RATIO = 0.1

  EVAL_INTERVAL_STEPS = 100
  SUMMARY_INTERVAL_STEPS = 10
  CHECKPOINT_EVERY_N_STEPS = 100
  CHECKPOINT_MAX_TO_KEEP = 10

  # Pax's C4SpmdGpt3Adam: 768 replicas with a 1.5k global batch.
  PERCORE_BATCH_SIZE = 2
  ICI_MESH_SHAPE = [1, 64, 12]


@experiment_registry.register
class C4SpmdGpt3AdamOrgHP1536Replicas(C4SpmdGpt3AdamOrgHP):
  """GPT-3 175B in float32 on 1536 chips, global batch 1536; vocabulary padded to 51200."""

  VOCAB_SIZE = 51200
  PERCORE_BATCH_SIZE = 1
  ICI_MESH_SHAPE = [1, 64, 24]
  FPROP_DTYPE = jnp.float32
  CHECKPOINT_MAX_TO_KEEP = 100
  EVAL_INTERVAL_STEPS = 25


class C4Spmd22BAdamMaxText(C4SpmdAdamBf16):
  """22B parameters, MaxText's comparison model (Pax's base of the v4-128 runs)."""

  NUM_LAYERS = 48
  MODEL_DIMS = 6144
  NUM_HEADS = 24
  DIMS_PER_HEAD = 256
  PERCORE_BATCH_SIZE = 16
  VOCAB_SIZE = 32768


@experiment_registry.register
class C4Spmd22BAdam1xv4_128(C4Spmd22BAdamMaxText):
  """22B on one v4-128 slice (64 chips); global batch 1 x 64 x 1 x 16 = 1024."""

  ICI_MESH_SHAPE = [1, 64, 1]


@experiment_registry.register
class C4Spmd22BAdam2xv4_128(C4Spmd22BAdam1xv4_128):
  """22B on two v4-128 slices over DCN (multislice); global batch 2 x 64 x 16 = 2048."""

  DCN_MESH_SHAPE = [2, 1, 1]
