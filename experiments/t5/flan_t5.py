"""Flan-T5 (T5 v1.1) at its published sizes, and CPU-sized members of the family.

The published sizes keep the names a T5X user knows and the numbers of the
released checkpoints (vocab 32128, gated-GELU, untied output projection):

| experiment | enc/dec layers | MODEL_DIMS | heads x dims | HIDDEN_DIMS | ICI mesh |
|---|---|---|---|---|---|
| FlanT5Small | 8 / 8 | 512 | 6 x 64 | 1024 | [1, 1, 1] |
| FlanT5Base | 12 / 12 | 768 | 12 x 64 | 2048 | [1, 4, 1] |
| FlanT5Large | 24 / 24 | 1024 | 16 x 64 | 2816 | [1, 8, 1] |
| FlanT5XL | 24 / 24 | 2048 | 32 x 64 | 5120 | [1, 16, 2] |
| FlanT5XXL | 24 / 24 | 4096 | 64 x 64 | 10240 | [1, 16, 4] |

They read the synthetic seq2seq stream by default; point INIT_FROM (or
--init_from) at a Hugging Face directory to start from the released weights,
and subclass with your own data mixin to fine-tune. The big ones are checked
on a CPU with --mode=dry_run.
"""

import jax.numpy as jnp

from paxlike import experiment_registry
from paxlike.t5_experiments import SyntheticSeq2SeqDataset, T5SpmdAdam, TextSeq2SeqDataset


class FlanT5(SyntheticSeq2SeqDataset, T5SpmdAdam):
  """Base of the published sizes (not registered)."""

  VOCAB_SIZE = 32128
  DIMS_PER_HEAD = 64
  ACTIVATION = "gated-gelu"
  TIE_EMBEDDINGS = False
  DROPOUT_PROB = 0.1  # the released config's; --set DROPOUT_PROB=0.0 turns it off
  MAX_INPUT_LEN = 512
  MAX_TARGET_LEN = 128
  FPROP_DTYPE = jnp.bfloat16
  USE_REPEATED_LAYER = True
  OPTIMIZER = "adafactor"  # T5X's
  LEARNING_RATE = 1e-3
  WEIGHT_DECAY = 0.0
  SUMMARY_INTERVAL_STEPS = 10
  CHECKPOINT_EVERY_N_STEPS = 1000


@experiment_registry.register
class FlanT5Small(FlanT5):
  """~77M parameters; inner attention dim 6 x 64 = 384 differs from MODEL_DIMS."""

  NUM_ENCODER_LAYERS = 8
  NUM_DECODER_LAYERS = 8
  MODEL_DIMS = 512
  NUM_HEADS = 6
  HIDDEN_DIMS = 1024
  ICI_MESH_SHAPE = [1, 1, 1]


@experiment_registry.register
class FlanT5Base(FlanT5):
  """~248M parameters, data parallel over 4 devices."""

  NUM_ENCODER_LAYERS = 12
  NUM_DECODER_LAYERS = 12
  MODEL_DIMS = 768
  NUM_HEADS = 12
  HIDDEN_DIMS = 2048
  ICI_MESH_SHAPE = [1, 4, 1]


@experiment_registry.register
class FlanT5Large(FlanT5):
  """~783M parameters over 8 devices."""

  NUM_ENCODER_LAYERS = 24
  NUM_DECODER_LAYERS = 24
  MODEL_DIMS = 1024
  NUM_HEADS = 16
  HIDDEN_DIMS = 2816
  ICI_MESH_SHAPE = [1, 8, 1]


@experiment_registry.register
class FlanT5XL(FlanT5):
  """~2.85B parameters: data 16 x model 2."""

  NUM_ENCODER_LAYERS = 24
  NUM_DECODER_LAYERS = 24
  MODEL_DIMS = 2048
  NUM_HEADS = 32
  HIDDEN_DIMS = 5120
  PERCORE_BATCH_SIZE = 4
  ICI_MESH_SHAPE = [1, 16, 2]


@experiment_registry.register
class FlanT5XXL(FlanT5):
  """~11.1B parameters: data 16 x model 4 (64 chips), activations split over 'mdl'."""

  NUM_ENCODER_LAYERS = 24
  NUM_DECODER_LAYERS = 24
  MODEL_DIMS = 4096
  NUM_HEADS = 64
  HIDDEN_DIMS = 10240
  PERCORE_BATCH_SIZE = 4
  ICI_MESH_SHAPE = [1, 16, 4]
  TRAINING_OPTIMIZED_SHARDING = True


@experiment_registry.register
class FlanT5Tiny(FlanT5):
  """The family at CPU size (same architecture, tiny dims) on the synthetic stream."""

  NUM_ENCODER_LAYERS = 2
  NUM_DECODER_LAYERS = 2
  MODEL_DIMS = 64
  NUM_HEADS = 4
  DIMS_PER_HEAD = 16
  HIDDEN_DIMS = 128
  VOCAB_SIZE = 256
  MAX_INPUT_LEN = 32
  MAX_TARGET_LEN = 16
  DROPOUT_PROB = 0.0
  FPROP_DTYPE = jnp.float32
  USE_REPEATED_LAYER = False
  OPTIMIZER = "adam"
  LEARNING_RATE = 3e-3
  PERCORE_BATCH_SIZE = 16
  NUM_TRAIN_STEPS = 300
  SUMMARY_INTERVAL_STEPS = 50
  CHECKPOINT_EVERY_N_STEPS = 300
  ICI_MESH_SHAPE = [1, 1, 1]


@experiment_registry.register
class FlanT5ArithmeticTiny(TextSeq2SeqDataset, FlanT5Tiny):
  """CPU-sized Flan-T5 learning two-digit addition as inputs -> targets ("37+45=" -> "82").

  Trains on packed rows: 1200 steps reach exact match 0.996-1.0 on the 500
  held-out prompts (>= 0.95 from about step 600), in 70-80 s on two busy CPU
  cores (~27 steps/s).
  """

  VOCAB_SIZE = 264  # 259 byte ids, padded to a multiple of 8
  # An example is at most 7 encoder ids ("99+99=" + EOS) and 4 decoder ids ("198" + EOS),
  # 6.8 / 3.4 on average: rows of 24 / 12 hold ~3 examples each at ~86% real tokens,
  # where the same rows unpacked would be ~29% real.
  PACK = True
  MAX_INPUT_LEN = 24
  MAX_TARGET_LEN = 12
  # 32 rows (~96 examples) a step: on a CPU a 64-row step cost ~2.5x a 32-row one
  # while learning no faster per example.
  PERCORE_BATCH_SIZE = 32
  # 3e-3 learns as fast; 5e-3 stalls (exact match 0.58 after 1200 steps): 2e-3 keeps a margin.
  LEARNING_RATE = 2e-3
  LR_SCHEDULE = "linear_rampup_cosine_decay"
  LR_COS_WARMUP = 100
  LR_COS_DECAY_START = 100
  LR_COS_DECAY_END = 1200
  NUM_TRAIN_STEPS = 1200
  CHECKPOINT_EVERY_N_STEPS = 400
  SUMMARY_INTERVAL_STEPS = 100
  EVAL_INTERVAL_STEPS = 400


@experiment_registry.register
class FlanT5SubtractionFromAddition(FlanT5ArithmeticTiny):
  """Fine-tunes a FlanT5ArithmeticTiny run on subtraction ("37-45=" -> "-8").

  Run FlanT5ArithmeticTiny with --job_log_dir=jobs/flan_add first, from the
  same working directory. From its weights, 800 steps reach exact match
  0.95-0.99 on the held-out subtraction prompts (the same pairs as
  addition's); from scratch the same 800 steps reach 0.69-0.88, and it takes
  about 1000 (0.99 after 1200).
  """

  GENERATOR = "tasks.arithmetic:subtraction_examples"
  SCORER = "tasks.arithmetic:score"
  INIT_FROM = "paxlike:jobs/flan_add"
  INIT_FROM_RULES = [(r"(.*)", r"\1")]  # every parameter under its own name
  INIT_FROM_STRICT = True
  INIT_FROM_OPTIMIZER = False  # a new schedule on a new task starts a fresh Adam state
  # Fresh Adam moments still want a warmup, a shorter one: the weights are trained.
  LR_COS_WARMUP = 50
  LR_COS_DECAY_START = 50
  LR_COS_DECAY_END = 800
  NUM_TRAIN_STEPS = 800
