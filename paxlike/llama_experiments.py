"""Unregistered experiment templates for the Llama family (Llama, Mistral, Qwen2).

Hyperparameters keep the LM's names where they mean the same (NUM_LAYERS,
MODEL_DIMS, HIDDEN_DIMS, NUM_HEADS, DIMS_PER_HEAD, VOCAB_SIZE, MAX_SEQ_LEN,
FPROP_DTYPE, ...) and add the family's: NUM_KV_HEADS (grouped-query
attention; None: NUM_HEADS), TIE_EMBEDDINGS, ROPE_THETA, ROPE_SCALING (a
config.json rope_scaling dict, e.g. Llama 3.1's rope_type llama3, or None),
NORM_EPSILON (RMSNorm) and QKV_BIAS (Qwen2's q/k/v biases). Hugging Face
names: hidden_size = MODEL_DIMS, intermediate_size = HIDDEN_DIMS, head_dim =
DIMS_PER_HEAD. Every derived value is computed in model()/datasets() from
`self.X`, so `--set` reaches everything that depends on it.
"""

from __future__ import annotations

from typing import Any

import fiddle as fdl
import jax.numpy as jnp

from paxlike.errors import UserError
from paxlike.file_data import FilesDataset
from paxlike.inputs.text import TextInput
from paxlike.layers.llama import rope_type
from paxlike.lm_experiments import PipelineHParams, synthetic_train_input
from paxlike.models.llama import LlamaModel
from paxlike.training_experiment import AdamTraining, LoraHParams


class LlamaSpmdAdam(LoraHParams, AdamTraining):
  """A Llama-family decoder trained with Adam on a device mesh."""

  NUM_LAYERS = 2
  MODEL_DIMS = 64
  HIDDEN_DIMS = None  # None: 4 x MODEL_DIMS
  NUM_HEADS = 4
  DIMS_PER_HEAD = None  # None: MODEL_DIMS // NUM_HEADS
  NUM_KV_HEADS = None  # None: NUM_HEADS (multi-head attention)
  VOCAB_SIZE = 256
  TIE_EMBEDDINGS = False
  ROPE_THETA = 10000.0
  ROPE_SCALING: dict[str, Any] | None = None
  NORM_EPSILON = 1e-5
  QKV_BIAS = False
  MAX_SEQ_LEN = 64
  PERCORE_BATCH_SIZE = 8
  FPROP_DTYPE = jnp.float32
  USE_REPEATED_LAYER = True
  CHECKPOINT_POLICY = "SAVE_NOTHING"
  # None: the tokenizer's, read from VOCABULARY's files or INIT_FROM's Hugging Face
  # directory (Llama 3's <|end_of_text|> 128001, or an instruct model's <|eot_id|>;
  # a tokenizer without a pad token pads with EOS), else 1 and 0.
  EOS_ID: int | None = None
  PAD_ID: int | None = None

  def num_kv_heads(self) -> int:
    """NUM_KV_HEADS, or NUM_HEADS when it is None."""
    return self.NUM_KV_HEADS if self.NUM_KV_HEADS is not None else self.num_heads()

  def validate(self) -> None:
    super().validate()
    self.check_positive("NUM_LAYERS", "MODEL_DIMS", "VOCAB_SIZE", "MAX_SEQ_LEN",
                        "PERCORE_BATCH_SIZE", "NUM_TRAIN_STEPS", "CHECKPOINT_EVERY_N_STEPS",
                        "SUMMARY_INTERVAL_STEPS", "ROPE_THETA", "NORM_EPSILON")
    self.check_heads()
    kv = self.num_kv_heads()
    if kv <= 0 or self.num_heads() % kv:
      raise UserError(f"NUM_KV_HEADS={kv} must be a positive divisor of NUM_HEADS="
                      f"{self.num_heads()}.")
    if self.dims_per_head() % 2:
      raise UserError(f"DIMS_PER_HEAD={self.dims_per_head()} must be even for rotary "
                      "embeddings.")
    rope_type(self.ROPE_SCALING)  # refuses a rope type paxlike lacks, by name

  def file_input_settings(self) -> dict[str, Any]:
    """TRAIN_FILES / EVAL_FILES: the LM's features; packed rows restart `positions`."""
    return {"seq_len": self.MAX_SEQ_LEN, "position_key": "positions"}

  def model(self) -> fdl.Config[LlamaModel]:
    return fdl.Config(
        LlamaModel, vocab_size=self.VOCAB_SIZE, model_dims=self.MODEL_DIMS,
        num_layers=self.NUM_LAYERS, num_heads=self.num_heads(), num_kv_heads=self.num_kv_heads(),
        head_dim=self.dims_per_head(), hidden_dims=self.hidden_dims(),
        tie_embeddings=self.TIE_EMBEDDINGS, rope_theta=float(self.ROPE_THETA),
        rope_scaling=dict(self.ROPE_SCALING) if self.ROPE_SCALING else None,
        norm_epsilon=self.NORM_EPSILON, qkv_bias=self.QKV_BIAS, max_seq_len=self.MAX_SEQ_LEN,
        use_repeated_layer=self.USE_REPEATED_LAYER, checkpoint_policy=self.CHECKPOINT_POLICY,
        fprop_dtype=self.FPROP_DTYPE, **self.special_ids(), **self.lora_fields())

  def special_ids(self) -> dict[str, int]:
    """eos_id and pad_id: EOS_ID / PAD_ID, or the checkpoint tokenizer's where None."""
    eos, pad = self.EOS_ID, self.PAD_ID
    if eos is None or pad is None:
      vocab = checkpoint_vocabulary(getattr(self, "VOCABULARY", None), self.INIT_FROM)
      if eos is None:
        eos = vocab.eos_id if vocab else 1
      if pad is None:
        pad = vocab.pad_id if vocab else 0
    return {"eos_id": eos, "pad_id": pad}


class LlamaSpmdPipelineAdam(PipelineHParams, LlamaSpmdAdam):
  """A Llama-family decoder pipelined over a 4-axis [stage, replica, data, mdl] mesh, with
  Pax's pipeline hyperparameters (NUM_STAGES, NUM_MICROBATCHES or MICROBATCH_SIZE,
  CIRCULAR_REPEAT, STREAM_IO; PipelineHParams): MaxText's pipeline parallelism for Llama.

  The decoder layers run in the pipeline (paxlike.layers.pipeline); the embedding,
  final norm and head run data-parallel over every core, stages included. Decoding and
  `--export_format=hf` use the same weights unpipelined, and `--init_from=hf:DIR`
  places a Hugging Face checkpoint's layers straight into the stages.
  """

  USE_REPEATED_LAYER = False  # Pax: the pipeline already loops over stages

  def model(self) -> fdl.Config[LlamaModel]:
    cfg = super().model()
    for name, value in self.pipeline_fields().items():
      setattr(cfg, name, value)
    return cfg


def checkpoint_vocabulary(vocabulary: str | None, init_from: str | None) -> Any:
  """The tokenizer of VOCABULARY's files, else of INIT_FROM's source (as main resolves
  it: vocabulary.resolve over InitFrom.vocabulary_dir); None if neither has one."""
  from paxlike.initial import InitFrom
  from paxlike.inputs import vocabulary as vocab_lib

  source = InitFrom(init_from).vocabulary_dir() if init_from else None
  spec = vocab_lib.resolve(vocabulary, source, None)
  return None if spec in ("byte", vocab_lib.HF) else vocab_lib.get(spec)


class SyntheticLlamaDataset(FilesDataset):
  """Data mixin: the learnable synthetic LM stream (paxlike.inputs.synthetic)."""

  DATA_SEED = 4321
  SYNTHETIC_NOISE_RATE = 0.05
  _replaced_by_files = ("DATA_SEED", "SYNTHETIC_NOISE_RATE")

  def own_datasets(self) -> list[fdl.Config]:
    return [synthetic_train_input(self)]


class TextLlamaDataset(FilesDataset):
  """Data mixin: text examples from a generator (GENERATOR, SCORER), the LM's features.

  The "train" split trains, "test" is evaluated and decoded, scored with SCORER.
  """

  GENERATOR = "tasks.arithmetic:examples"
  SCORER = "tasks.arithmetic:score"
  EVAL_BATCH_SIZE = 100
  _replaced_by_files = ("GENERATOR", "SCORER", "EVAL_BATCH_SIZE")

  def _input(self, split: str, training: bool, name: str) -> fdl.Config[TextInput]:
    return fdl.Config(
        TextInput, name=name, generator=self.GENERATOR, split=split, seq_len=self.MAX_SEQ_LEN,
        vocabulary=self.VOCABULARY,
        batch_size=self.per_host_batch_size() if training else self.EVAL_BATCH_SIZE,
        is_training=training, repeat=training, shuffle=training, reset_for_eval=not training,
        scorer=self.SCORER, seed=self.TRAINING_SEED)

  def own_datasets(self) -> list[fdl.Config[TextInput]]:
    return [self._input("train", True, "train"), self._input("test", False, "test")]

  def own_decode_datasets(self) -> list[fdl.Config[TextInput]]:
    return [self._input("test", False, "test")]
