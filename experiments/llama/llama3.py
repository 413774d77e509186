"""The Llama family at its published sizes, and CPU-sized members.

The published sizes keep the released configs' numbers (config.json of each
Hugging Face checkpoint), so `--init_from=hf:DIR` imports the released
weights without a `--set`:

| experiment | layers | MODEL_DIMS | heads / KV x dims | HIDDEN_DIMS | vocab | rope | ICI mesh |
|---|---|---|---|---|---|---|---|
| Llama32_1B | 16 | 2048 | 32 / 8 x 64 | 8192 | 128256 tied | 500k, llama3 x32 | [1, 8, 1] |
| Llama32_3B | 28 | 3072 | 24 / 8 x 128 | 8192 | 128256 tied | 500k, llama3 x32 | [1, 8, 2] |
| Llama31_8B | 32 | 4096 | 32 / 8 x 128 | 14336 | 128256 | 500k, llama3 x8 | [1, 16, 4] |
| Llama31_70B | 80 | 8192 | 64 / 8 x 128 | 28672 | 128256 | 500k, llama3 x8 | [1, 32, 8] |
| Llama31_405B | 126 | 16384 | 128 / 8 x 128 | 53248 | 128256 | 500k, llama3 x8 | [1, 128, 8] |
| Mistral7Bv03 | 32 | 4096 | 32 / 8 x 128 | 14336 | 32768 | 1M | [1, 16, 4] |
| Qwen25_7B | 28 | 3584 | 28 / 4 x 128, q/k/v bias | 18944 | 152064 | 1M | [1, 16, 4] |

The model axis ('mdl') shards heads, so it divides the KV heads (8; Qwen2.5
7B's 4); the data axis also shards the embedding dim (fully sharded
parameters and optimizer state). They read the synthetic LM stream by
default; point INIT_FROM (or --init_from) at a Hugging Face directory to
start from released weights, and subclass with a data mixin to fine-tune.
The big ones are checked on a CPU with --mode=dry_run.
"""

import jax.numpy as jnp

from paxlike import experiment_registry
from paxlike.llama_experiments import (
    LlamaSpmdAdam,
    LlamaSpmdPipelineAdam,
    SyntheticLlamaDataset,
    TextLlamaDataset,
)

LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA32_ROPE = {**LLAMA31_ROPE, "factor": 32.0}


class LlamaPublished(SyntheticLlamaDataset, LlamaSpmdAdam):
  """Base of the published sizes (not registered): Llama 3.x's shared numbers."""

  VOCAB_SIZE = 128256
  DIMS_PER_HEAD = 128
  NUM_KV_HEADS = 8
  ROPE_THETA = 500000.0
  ROPE_SCALING = LLAMA31_ROPE
  NORM_EPSILON = 1e-5
  MAX_SEQ_LEN = 8192
  PERCORE_BATCH_SIZE = 1
  FPROP_DTYPE = jnp.bfloat16
  USE_REPEATED_LAYER = True
  LEARNING_RATE = 3e-4
  ADAM_BETA2 = 0.95
  ADAM_EPSILON = 1e-8
  WEIGHT_DECAY = 0.1
  SUMMARY_INTERVAL_STEPS = 10
  CHECKPOINT_EVERY_N_STEPS = 1000


@experiment_registry.register
class Llama32_1B(LlamaPublished):  # noqa: N801 (the published name)
  """Llama 3.2 1B: ~1.24B parameters, tied embeddings."""

  NUM_LAYERS = 16
  MODEL_DIMS = 2048
  NUM_HEADS = 32
  DIMS_PER_HEAD = 64
  HIDDEN_DIMS = 8192
  TIE_EMBEDDINGS = True
  ROPE_SCALING = LLAMA32_ROPE
  MAX_SEQ_LEN = 2048
  PERCORE_BATCH_SIZE = 4
  ICI_MESH_SHAPE = [1, 8, 1]


@experiment_registry.register
class Llama32_3B(LlamaPublished):  # noqa: N801
  """Llama 3.2 3B: ~3.21B parameters, tied embeddings."""

  NUM_LAYERS = 28
  MODEL_DIMS = 3072
  NUM_HEADS = 24
  HIDDEN_DIMS = 8192
  TIE_EMBEDDINGS = True
  ROPE_SCALING = LLAMA32_ROPE
  MAX_SEQ_LEN = 2048
  PERCORE_BATCH_SIZE = 2
  ICI_MESH_SHAPE = [1, 8, 2]


@experiment_registry.register
class Llama31_8B(LlamaPublished):  # noqa: N801
  """Llama 3.1 8B: ~8.03B parameters over 64 devices."""

  NUM_LAYERS = 32
  MODEL_DIMS = 4096
  NUM_HEADS = 32
  HIDDEN_DIMS = 14336
  ICI_MESH_SHAPE = [1, 16, 4]


@experiment_registry.register
class Llama31_70B(LlamaPublished):  # noqa: N801
  """Llama 3.1 70B: ~70.6B parameters over 256 devices."""

  NUM_LAYERS = 80
  MODEL_DIMS = 8192
  NUM_HEADS = 64
  HIDDEN_DIMS = 28672
  ICI_MESH_SHAPE = [1, 32, 8]
  # One 8192-token row per data shard (Pax's fractional per-core batch: the 8 mdl
  # devices of a shard share its rows): 32 x 8192 tokens a step, 23.8 GiB a device
  # in the dry run. At 1 per core (8 rows a shard) the activations took 141 GiB.
  PERCORE_BATCH_SIZE = 0.125


@experiment_registry.register
class Llama31_405B(LlamaPublished):  # noqa: N801
  """Llama 3.1 405B: ~406B parameters over 1024 devices."""

  NUM_LAYERS = 126
  MODEL_DIMS = 16384
  NUM_HEADS = 128
  HIDDEN_DIMS = 53248
  ICI_MESH_SHAPE = [1, 128, 8]
  # One 8192-token row per data shard, as the 70B: 128 x 8192 tokens a step, 57.1 GiB
  # a device in the dry run (372 GiB at 1 per core).
  PERCORE_BATCH_SIZE = 0.125


@experiment_registry.register
class Mistral7Bv03(LlamaPublished):
  """Mistral 7B v0.3: ~7.25B parameters, no sliding window, vocab 32768."""

  NUM_LAYERS = 32
  MODEL_DIMS = 4096
  NUM_HEADS = 32
  HIDDEN_DIMS = 14336
  VOCAB_SIZE = 32768
  ROPE_THETA = 1000000.0
  ROPE_SCALING = None
  ICI_MESH_SHAPE = [1, 16, 4]


@experiment_registry.register
class Qwen25_7B(LlamaPublished):  # noqa: N801
  """Qwen2.5 7B: ~7.62B parameters, q/k/v biases, 4 KV heads."""

  NUM_LAYERS = 28
  MODEL_DIMS = 3584
  NUM_HEADS = 28
  NUM_KV_HEADS = 4
  HIDDEN_DIMS = 18944
  VOCAB_SIZE = 152064
  QKV_BIAS = True
  ROPE_THETA = 1000000.0
  ROPE_SCALING = None
  NORM_EPSILON = 1e-6
  ICI_MESH_SHAPE = [1, 16, 4]


@experiment_registry.register
class LlamaTiny(SyntheticLlamaDataset, LlamaSpmdAdam):
  """A CPU-sized Llama: GQA (4 over 2 KV heads), Llama 3.1 rope scaling, synthetic data."""

  NUM_LAYERS = 2
  MODEL_DIMS = 64
  NUM_HEADS = 4
  NUM_KV_HEADS = 2
  DIMS_PER_HEAD = 16
  HIDDEN_DIMS = 128
  VOCAB_SIZE = 256
  ROPE_THETA = 500000.0
  ROPE_SCALING = {**LLAMA31_ROPE, "original_max_position_embeddings": 32}
  MAX_SEQ_LEN = 64
  PERCORE_BATCH_SIZE = 4
  LEARNING_RATE = 1e-3
  NUM_TRAIN_STEPS = 100
  SUMMARY_INTERVAL_STEPS = 10
  CHECKPOINT_EVERY_N_STEPS = 100


@experiment_registry.register
class LlamaPipelineTiny(LlamaSpmdPipelineAdam, LlamaTiny):
  """LlamaTiny with 4 layers pipelined: 2 stages of 2 layers on 2 devices (set
  XLA_FLAGS=--xla_force_host_platform_device_count=2 on a CPU), 4 microbatches."""

  NUM_LAYERS = 4
  NUM_STAGES = 2
  NUM_MICROBATCHES = 4
  ICI_MESH_SHAPE = [2, 1, 1, 1]


@experiment_registry.register
class LlamaArithmeticTiny(TextLlamaDataset, LlamaSpmdAdam):
  """Two-digit addition on a CPU (tasks/arithmetic.py): >= 95% exact match on held-out
  prompts, decoded greedily with the KV cache."""

  NUM_LAYERS = 4
  MODEL_DIMS = 128
  NUM_HEADS = 4
  NUM_KV_HEADS = 2
  HIDDEN_DIMS = 256
  VOCAB_SIZE = 264  # 259 byte ids, padded to a multiple of 8
  MAX_SEQ_LEN = 12  # "99+99=198" + end of sequence
  PERCORE_BATCH_SIZE = 64
  FPROP_DTYPE = jnp.float32
  LEARNING_RATE = 3e-3
  LR_SCHEDULE = "linear_rampup_cosine_decay"
  LR_COS_WARMUP = 100
  LR_COS_DECAY_START = 100
  # 1500 steps (3000 before) reach exact match 0.998 / 0.992 (JAX 0.10 / 0.12) on the 500
  # held-out prompts, in 2m18s on 2 CPU cores.
  LR_COS_DECAY_END = 1500
  NUM_TRAIN_STEPS = 1500
  CHECKPOINT_EVERY_N_STEPS = 500
  SUMMARY_INTERVAL_STEPS = 100
  EVAL_INTERVAL_STEPS = 500
  ICI_MESH_SHAPE = [1, 1, 1]
