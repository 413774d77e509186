"""Pax's lm_cloud experiments (paxml/tasks/lm/params/lm_cloud.py) on the synthetic LM stream.

Each class with a Pax name has Pax's values field by field: the SPMD family
is Pax's TransformerLmSpmdAdafactor template with GELU, repeated layers and
set_default_adam (Adam 0.9/0.99, gradient clip 5.0, 4000 warmup steps, then
exponential decay to 0.1 at step 300k); heads are MODEL_DIMS / 128. The
`*Tiny` members are CPU-sized and keep the settings they were tuned with.
"""

import jax.numpy as jnp

from paxlike import experiment_registry
from paxlike.classifier_experiments import ClassificationModelAdam
from paxlike.layers.activations import GELU, ReLU
from paxlike.lm_experiments import (
    SyntheticDataset,
    TransformerLmPmapAdam,
    TransformerLmSpmdAdam,
    TransformerLmSpmdPipelineAdafactor,
)


class LmCloudSpmd(TransformerLmSpmdAdam, SyntheticDataset):
  """Base of the SPMD lm_cloud family (not registered).

  Pax's LmCloudSpmd is TransformerLmSpmdAdafactor whose task() calls
  set_default_adam; here that is the Adam template with the Adafactor
  template's model values.
  """

  NUM_LAYERS = 10
  MODEL_DIMS = 2048
  NUM_HEADS = None  # MODEL_DIMS / DIMS_PER_HEAD
  DIMS_PER_HEAD = 128
  FPROP_DTYPE = jnp.bfloat16
  LEARNING_RATE = 2.5e-4
  ACTIVATION = "gelu"
  ACTIVATION_CLS = GELU  # Pax's name; read once ACTIVATION_CLS lands (the same value)
  USE_GATED_ACTIVATION = False
  USE_REPEATED_LAYER = True
  CHECKPOINT_POLICY = "SAVE_NOTHING"


@experiment_registry.register
class LmCloudSpmd2B(LmCloudSpmd):
  """2B parameters: 18 layers of 3072 dims (24 heads x 128) on ICI [1, 4, 1]."""

  PERCORE_BATCH_SIZE = 8
  NUM_LAYERS = 18
  MODEL_DIMS = 3072
  ICI_MESH_SHAPE = [1, 4, 1]


@experiment_registry.register
class LmCloudSpmd2BLimitSteps(LmCloudSpmd2B):
  NUM_TRAIN_STEPS = 300


@experiment_registry.register
class LmCloudSpmd32B(LmCloudSpmd):
  """32B parameters: 40 layers of 8192 dims (64 heads x 128) on ICI [1, 16, 4]."""

  PERCORE_BATCH_SIZE = 8
  NUM_LAYERS = 40
  MODEL_DIMS = 8192
  CHECKPOINT_POLICY = "SAVE_CONTEXT_AND_OUT_PROJ"
  ICI_MESH_SHAPE = [1, 16, 4]


@experiment_registry.register
class LmCloudSpmd64B(LmCloudSpmd):
  """64B parameters: 51 layers of 10240 dims (80 heads x 128) on ICI [1, 16, 8]."""

  PERCORE_BATCH_SIZE = 4
  NUM_LAYERS = 51
  MODEL_DIMS = 10240
  CHECKPOINT_POLICY = "SAVE_CONTEXT_AND_OUT_PROJ"
  ICI_MESH_SHAPE = [1, 16, 8]


@experiment_registry.register
class LmCloudSpmd128B(LmCloudSpmd):
  """128B parameters: 71 layers of 12288 dims (96 heads x 128) on ICI [1, 64, 4]."""

  PERCORE_BATCH_SIZE = 4
  NUM_LAYERS = 71
  MODEL_DIMS = 12288
  ICI_MESH_SHAPE = [1, 64, 4]


@experiment_registry.register
class LmCloudSpmd256B(LmCloudSpmd):
  """256B parameters: 80 layers of 16384 dims (128 heads x 128) on ICI [1, 64, 8]."""

  PERCORE_BATCH_SIZE = 4
  NUM_LAYERS = 80
  MODEL_DIMS = 16384
  ICI_MESH_SHAPE = [1, 64, 8]


@experiment_registry.register
class LmCloudSpmd512B(LmCloudSpmd):
  """512B parameters: 102 layers of 20480 dims (160 heads x 128) on ICI [1, 64, 16]."""

  PERCORE_BATCH_SIZE = 4
  NUM_LAYERS = 102
  MODEL_DIMS = 20480
  ICI_MESH_SHAPE = [1, 64, 16]


@experiment_registry.register
class LmCloudSpmd1024B(LmCloudSpmd):
  """1T parameters: 142 layers of 24576 dims (192 heads x 128) on ICI [1, 256, 8]."""

  PERCORE_BATCH_SIZE = 2
  NUM_LAYERS = 142
  MODEL_DIMS = 24576
  ICI_MESH_SHAPE = [1, 256, 8]


@experiment_registry.register
class LmCloudSpmdTest(LmCloudSpmd):
  """Pax's CPU test member: 2 layers of 64 dims (8 heads x 8), 32k vocabulary."""

  PERCORE_BATCH_SIZE = 4
  NUM_LAYERS = 2
  MODEL_DIMS = 64
  DIMS_PER_HEAD = 8
  ICI_MESH_SHAPE = [1, 1, 1]


class CpuSized:
  """Mixin (not registered): the dims and schedule of the family's CPU-sized members,
  which train in about a minute on 2 cores."""

  MODEL_DIMS = 64
  NUM_HEADS = 4
  DIMS_PER_HEAD = None
  VOCAB_SIZE = 256
  MAX_SEQ_LEN = 64
  FPROP_DTYPE = jnp.float32
  COMBINE_QKV = False
  ATTEN_LOGIT_CAP = 0.0  # no caps on the CPU members
  SOFTMAX_CAP_LOGITS = 0.0
  CLIP_GRADIENT_NORM_TO_VALUE = 1.0
  LEARNING_RATE = 3e-3
  LR_SCHEDULE = "linear_rampup_cosine_decay"
  LR_COS_WARMUP = 20
  LR_COS_DECAY_START = 20
  LR_COS_DECAY_END = 300
  NUM_TRAIN_STEPS = 300
  CHECKPOINT_EVERY_N_STEPS = 100
  SUMMARY_INTERVAL_STEPS = 25
  EVAL_INTERVAL_STEPS = 0
  TRAINING_OPTIMIZED_SHARDING = False


@experiment_registry.register
class LmCloudSpmdTiny(CpuSized, LmCloudSpmd):
  """A CPU-sized member of the family: trains in about a minute on 2 cores."""

  NUM_LAYERS = 2
  PERCORE_BATCH_SIZE = 16
  ACTIVATION = "relu"
  ACTIVATION_CLS = ReLU
  ICI_MESH_SHAPE = [1, 1, 1]


class LmCloudSpmdPipeline(TransformerLmSpmdPipelineAdafactor, SyntheticDataset):
  """Base of the pipelined lm_cloud family (not registered): Pax's
  LmCloudSpmdPipeline, whose task() calls set_default_adam. That replaces the
  Adafactor template's optimizer and schedule with set_default_adam's: Adam 0.9/0.99,
  gradient clip 5.0, 4000 warmup steps, then exponential decay to 0.1 at step 300k (the
  template's Adafactor decays by 100k)."""

  NUM_LAYERS = 10
  MODEL_DIMS = 2048
  HIDDEN_DIMS = None  # 4 x MODEL_DIMS
  ACTIVATION = "gelu"
  ACTIVATION_CLS = GELU
  USE_GATED_ACTIVATION = False
  CHECKPOINT_POLICY = "SAVE_NOTHING"
  OPTIMIZER = "adam"  # set_default_adam's optimizer,
  LR_LRED_DECAY_END = 300000  # and its decay_end (the Adafactor template's is 100k)
  MICROBATCH_SIZE = None
  NUM_STAGES = None


@experiment_registry.register
class LmCloudSpmdPipeline9B(LmCloudSpmdPipeline):
  """9B parameters in 16 stages of 3 layers, 4-way data parallel; global batch 512."""

  MICROBATCH_SIZE = 4
  PERCORE_BATCH_SIZE = 8
  NUM_STAGES = 16
  NUM_LAYERS = 48
  MODEL_DIMS = 4096
  FPROP_DTYPE = jnp.float32
  ICI_MESH_SHAPE = [16, 4, 1, 1]


@experiment_registry.register
class LmCloudSpmdPipeline175B(LmCloudSpmdPipeline):
  """175B parameters: 8 stages over DCN (8 hosts), 16-way model parallel; global batch 96."""

  MICROBATCH_SIZE = 2
  PERCORE_BATCH_SIZE = 0.75
  NUM_STAGES = 8
  NUM_LAYERS = 96
  MODEL_DIMS = 12288
  NUM_HEADS = 96
  DIMS_PER_HEAD = 128
  MAX_SEQ_LEN = 2048
  FPROP_DTYPE = jnp.bfloat16
  ICI_MESH_SHAPE = [1, 1, 1, 16]
  DCN_MESH_SHAPE = [8, 1, 1, 1]


@experiment_registry.register
class LmCloudSpmdPipelineMultislice2B(LmCloudSpmdPipeline):
  """2B parameters: 2 stages over DCN (2 slices), 4-way replicas; global batch 128."""

  MICROBATCH_SIZE = 4
  PERCORE_BATCH_SIZE = 16
  NUM_STAGES = 2
  NUM_LAYERS = 18
  MODEL_DIMS = 3072
  ICI_MESH_SHAPE = [1, 4, 1, 1]
  DCN_MESH_SHAPE = [2, 1, 1, 1]
  EMB_W_DATA_DIMS = ("replica", "data")
  STREAM_IO = True


@experiment_registry.register
class LmCloudSpmdPipelineMultislice2BCircular(LmCloudSpmdPipelineMultislice2B):
  """The 2B pipeline with each microbatch passing 3 times over the 2 stages."""

  MICROBATCH_SIZE = 8
  CIRCULAR_REPEAT = 3


@experiment_registry.register
class LmCloudSpmdPipelineTiny(CpuSized, LmCloudSpmdPipeline):
  """A CPU-sized pipeline: 2 stages of 2 layers on 2 devices (set
  XLA_FLAGS=--xla_force_host_platform_device_count=2 on a CPU), 4 microbatches."""

  NUM_STAGES = 2
  NUM_MICROBATCHES = 4
  NUM_LAYERS = 4
  PERCORE_BATCH_SIZE = 8
  ICI_MESH_SHAPE = [2, 1, 1, 1]


class LmCloudTransformer(TransformerLmPmapAdam, SyntheticDataset):
  """Base of Pax's pmap lm_cloud family: no mesh, so the pmap loop runs."""

  NUM_LAYERS = 32
  VOCAB_SIZE = 32000
  NUM_HEADS = 16
  MODEL_DIMS = 1024
  LEARNING_RATE = 1e-3


@experiment_registry.register
class LmCloudTransformerAdam(LmCloudTransformer):
  """Pax's pmap example: 32 layers of 1024 dims, 16 heads, Adam."""


@experiment_registry.register
class LmCloudTransformerAdamTest(LmCloudTransformerAdam):
  NUM_LAYERS = 2


@experiment_registry.register
class LmCloudTransformerAdamLimitSteps(LmCloudTransformerAdam):
  NUM_LAYERS = 10
  NUM_TRAIN_STEPS = 2000


@experiment_registry.register
class LmCloudTransformerAdamTiny(LmCloudTransformer):
  """CPU-sized pmap member: the same numbers as LmCloudSpmdTiny, no mesh."""

  NUM_LAYERS = 2
  MODEL_DIMS = 64
  NUM_HEADS = 4
  VOCAB_SIZE = 256
  MAX_SEQ_LEN = 64
  PERCORE_BATCH_SIZE = 16
  ACTIVATION = "relu"
  ATTEN_LOGIT_CAP = 0.0  # no caps on this CPU member (read once the caps land)
  CLIP_GRADIENT_NORM_TO_VALUE = 1.0
  LEARNING_RATE = 3e-3
  LR_SCHEDULE = "linear_rampup_cosine_decay"
  LR_COS_WARMUP = 20
  LR_COS_DECAY_START = 20
  LR_COS_DECAY_END = 300
  NUM_TRAIN_STEPS = 300
  CHECKPOINT_EVERY_N_STEPS = 100
  SUMMARY_INTERVAL_STEPS = 25
  EVAL_INTERVAL_STEPS = 0


# Pax's MLP benchmarks: praxis's ClassificationMLPModel, whose loss (the accuracy) has no
# gradient, so a step is the forward pass and Adam's weight decay (paxlike.models.classifier).


@experiment_registry.register
class LargeMlp(ClassificationModelAdam, SyntheticDataset):
  """An 8-layer MLP with large hidden dims, data parallel over 8 devices."""

  NUM_LAYER = 8
  INPUT_DIM = 4096
  OUTPUT_DIM = 4096
  HIDDEN_DIM = 7168
  MESH_SHAPE = [8, 1, 1]
  MLP_WEIGHT_SHARDING = [-1, -1]
  SOFTMAX_WEIGHT_SHARDING = [-1, -1]


@experiment_registry.register
class SmallMlp(ClassificationModelAdam, SyntheticDataset):
  """An 8-layer MLP with small hidden dims, data parallel over 8 devices."""

  NUM_LAYER = 8
  INPUT_DIM = 1024
  OUTPUT_DIM = 1024
  HIDDEN_DIM = 1024
  MESH_SHAPE = [8, 1, 1]
  MLP_WEIGHT_SHARDING = [-1, -1]
  SOFTMAX_WEIGHT_SHARDING = [-1, -1]
