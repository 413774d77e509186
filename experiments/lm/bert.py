"""BERT masked language models on the synthetic LM stream, from Pax's BERT templates.

Pax's own bert.py (paxml/tasks/lm/params/bert.py) runs as written with its
imports rewritten; it reads MLPerf TFRecords (TFRecordBertInput, the seqio
extra) from paths its user sets. These classes train the same templates on
data that needs no download: the model corrupts each row itself (15% of its
tokens) and learns to restore them.
"""

from paxlike import experiment_registry
from paxlike.bert_experiments import TransformerBertPmapAdam, TransformerBertSpmdAdafactor
from paxlike.lm_experiments import SyntheticDataset


@experiment_registry.register
class BertAdamL4H128(TransformerBertPmapAdam, SyntheticDataset):
  """Pax's BertAdamL4H128 (4 layers, 128 dims, Adam, pmap) on the synthetic stream."""

  PERCORE_BATCH_SIZE = 8
  MAX_SEQ_LEN = 512
  VOCAB_SIZE = 32000
  CHECKPOINT_EVERY_N_STEPS = 5000


@experiment_registry.register
class BertSpmdL4H128(TransformerBertSpmdAdafactor, SyntheticDataset):
  """Pax's BertSpmdL4H128 (4 layers, 128 dims, Adafactor) on a [1, 4, 2] mesh."""

  PERCORE_BATCH_SIZE = 4
  MAX_SEQ_LEN = 512
  NUM_LAYERS = 4
  MODEL_DIMS = 128
  NUM_HEADS = 8
  HIDDEN_DIMS = MODEL_DIMS * 4
  LEARNING_RATE = 2.5e-4
  ENABLE_BFLOAT16 = True
  MESH_SHAPE = [1, 4, 2]
  CHECKPOINT_EVERY_N_STEPS = 5000


@experiment_registry.register
class BertTiny(TransformerBertPmapAdam, SyntheticDataset):
  """A CPU-sized BERT: 2 layers of 64 dims on 64-token rows; learns in a minute."""

  NUM_LAYERS = 2
  MODEL_DIMS = 64
  NUM_HEADS = 4
  HIDDEN_DIMS = 256
  VOCAB_SIZE = 256
  PERCORE_BATCH_SIZE = 16
  MAX_SEQ_LEN = 64
  ENABLE_BFLOAT16 = False
  LEARNING_RATE = 3e-3
  LR_SCHEDULE = "constant"
  NUM_TRAIN_STEPS = 300
  CHECKPOINT_EVERY_N_STEPS = 100
  SUMMARY_INTERVAL_STEPS = 50
