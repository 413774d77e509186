"""Pax's lm_cloud experiments on the synthetic LM stream, with Pax's numbers."""

import jax.numpy as jnp

from paxlike import experiment_registry
from paxlike.lm_experiments import SyntheticDataset, TransformerLmSpmdAdam


class LmCloudSpmd(SyntheticDataset, TransformerLmSpmdAdam):
  """Base of the SPMD lm_cloud family (not registered)."""

  FPROP_DTYPE = jnp.bfloat16
  USE_REPEATED_LAYER = True
  CHECKPOINT_POLICY = "SAVE_NOTHING"
  LEARNING_RATE = 2.5e-4
  VOCAB_SIZE = 32000
  MAX_SEQ_LEN = 1024
  SUMMARY_INTERVAL_STEPS = 10
  CHECKPOINT_EVERY_N_STEPS = 5000


@experiment_registry.register
class LmCloudSpmd2B(LmCloudSpmd):
  """2B parameters: 18 layers of 3072 dims on ICI [1, 4, 1]."""

  NUM_LAYERS = 18
  MODEL_DIMS = 3072
  NUM_HEADS = 24  # x 128 dims per head; hidden 4 x 3072 = 12288
  PERCORE_BATCH_SIZE = 8
  ICI_MESH_SHAPE = [1, 4, 1]


@experiment_registry.register
class LmCloudSpmd2BLimitSteps(LmCloudSpmd2B):
  NUM_TRAIN_STEPS = 300


class LmCloudSpmdPod(LmCloudSpmd):
  """Pax's pod-scale members: too big for a CPU to train, checked with --mode=dry_run."""

  TRAINING_OPTIMIZED_SHARDING = True  # Pax's default: saved activations split over 'mdl'


@experiment_registry.register
class LmCloudSpmd32B(LmCloudSpmdPod):
  """32B parameters: 40 layers of 8192 dims (64 heads x 128) on ICI [1, 16, 4]."""

  NUM_LAYERS = 40
  MODEL_DIMS = 8192
  NUM_HEADS = 64
  PERCORE_BATCH_SIZE = 8
  ICI_MESH_SHAPE = [1, 16, 4]


@experiment_registry.register
class LmCloudSpmd128B(LmCloudSpmdPod):
  """128B parameters: 71 layers of 12288 dims (96 heads x 128) on ICI [1, 64, 4]."""

  NUM_LAYERS = 71
  MODEL_DIMS = 12288
  NUM_HEADS = 96
  PERCORE_BATCH_SIZE = 4
  ICI_MESH_SHAPE = [1, 64, 4]


@experiment_registry.register
class LmCloudSpmd1024B(LmCloudSpmdPod):
  """1T parameters: 142 layers of 24576 dims (192 heads x 128) on ICI [1, 256, 8]."""

  NUM_LAYERS = 142
  MODEL_DIMS = 24576
  NUM_HEADS = 192
  PERCORE_BATCH_SIZE = 2
  ICI_MESH_SHAPE = [1, 256, 8]


@experiment_registry.register
class LmCloudSpmdTiny(LmCloudSpmd):
  """A CPU-sized member of the family: trains in about a minute on 2 cores."""

  NUM_LAYERS = 2
  MODEL_DIMS = 64
  NUM_HEADS = 4
  VOCAB_SIZE = 256
  MAX_SEQ_LEN = 64
  PERCORE_BATCH_SIZE = 16
  FPROP_DTYPE = jnp.float32
  LEARNING_RATE = 3e-3
  LR_SCHEDULE = "linear_rampup_cosine_decay"
  LR_COS_WARMUP = 20
  LR_COS_DECAY_START = 20
  LR_COS_DECAY_END = 300
  NUM_TRAIN_STEPS = 300
  CHECKPOINT_EVERY_N_STEPS = 100
  SUMMARY_INTERVAL_STEPS = 25
  ICI_MESH_SHAPE = [1, 1, 1]


class LmCloudTransformer(SyntheticDataset, TransformerLmSpmdAdam):
  """Base of Pax's pmap lm_cloud family: no mesh, so the pmap loop runs."""

  ICI_MESH_SHAPE = None
  USE_REPEATED_LAYER = False
  LEARNING_RATE = 1e-3
  VOCAB_SIZE = 32000
  MAX_SEQ_LEN = 1024
  PERCORE_BATCH_SIZE = 16
  SUMMARY_INTERVAL_STEPS = 10


@experiment_registry.register
class LmCloudTransformerAdam(LmCloudTransformer):
  """Pax's pmap example: 32 layers of 1024 dims, 16 heads, Adam."""

  NUM_LAYERS = 32
  MODEL_DIMS = 1024
  NUM_HEADS = 16


@experiment_registry.register
class LmCloudTransformerAdamLimitSteps(LmCloudTransformerAdam):
  NUM_TRAIN_STEPS = 300


@experiment_registry.register
class LmCloudTransformerAdamTiny(LmCloudTransformer):
  """CPU-sized pmap member: the same numbers as LmCloudSpmdTiny, no mesh."""

  NUM_LAYERS = 2
  MODEL_DIMS = 64
  NUM_HEADS = 4
  VOCAB_SIZE = 256
  MAX_SEQ_LEN = 64
  PERCORE_BATCH_SIZE = 16
  LEARNING_RATE = 3e-3
  LR_SCHEDULE = "linear_rampup_cosine_decay"
  LR_COS_WARMUP = 20
  LR_COS_DECAY_START = 20
  LR_COS_DECAY_END = 300
  NUM_TRAIN_STEPS = 300
  CHECKPOINT_EVERY_N_STEPS = 100
  SUMMARY_INTERVAL_STEPS = 25
