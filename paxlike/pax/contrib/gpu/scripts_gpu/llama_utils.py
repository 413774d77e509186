"""paxml.contrib.gpu.scripts_gpu.llama_utils: BaseLLaMA, Pax's GPU LLaMA template.

Pax builds LLaMA from its LM's layers: RMSNorm before attention and the
feed-forward, rotary positions and no position table, SiLU-gated
feed-forward, no biases, separate input and output tables, and multi-query
(grouped) attention with NUM_KV_HEADS when USE_MQA. That is paxlike's Llama
family model, so BaseLLaMA is a Llama family template with Pax's knobs and
defaults (CustomMetricsLlama as its model: the eval_task metrics of Pax's
CustomMetricsLM). Its weights come from CHECKPOINT_RESTORE_PATH (a Pax
LLaMA checkpoint, as saxml's converter writes it; checkpoint_utils,
paxlike.interop.pax) or INIT_FROM (a Hugging Face Llama directory,
`hf:DIR`, a paxlike job, or `pax:DIR`).

MAX_STEPS is the number of training steps (0, Pax's default: the class only
evaluates) and RMS_NORM_EPSILON the norms' epsilon; setting the Llama
template's own NUM_TRAIN_STEPS or NORM_EPSILON is refused, naming them.
MODEL_DTYPE, which Pax's template leaves unread (its weights stay float32),
and TRAINING_OPTIMIZED_SHARDING (paxlike shards by its mesh rules) are
declared unused: setting them with --set is refused.
"""

from __future__ import annotations

from typing import Any

import fiddle as fdl
import jax.numpy as jnp

from paxlike import lm_experiments
from paxlike.errors import UserError
from paxlike.llama_experiments import LlamaSpmdAdam
from paxlike.pax.contrib.gpu.scripts_gpu.models import CustomMetricsLlama, CustomMetricsLM
from paxlike.pax.layers import activations

_PAX_LM = lm_experiments.TransformerLmSpmdAdam  # c4.py's template, whose knobs BaseLLaMA keeps


class BaseLLaMA(LlamaSpmdAdam):
  """Pax's GPU LLaMA template on paxlike's Llama family (see the module docstring)."""

  MODEL_CLASS = CustomMetricsLM
  BOS_ID = 1
  EOS_ID = 2
  MAX_STEPS = 0

  NUM_LAYERS = 32
  VOCAB_SIZE = 32000
  DIMS_PER_HEAD = 128
  NUM_HEADS = 32
  MODEL_DIMS = 4096
  HIDDEN_DIMS = 4 * 4096
  FPROP_DTYPE = jnp.bfloat16
  MODEL_DTYPE = jnp.bfloat16
  USE_MQA = False
  ACTIVATION_CLS = activations.SiLU
  USE_GATED_ACTIVATION = True
  RMS_NORM_EPSILON = 1.0e-05
  ICI_MESH_SHAPE = [1, 1, 1]
  DCN_MESH_SHAPE = None
  TRAINING_OPTIMIZED_SHARDING = True
  USE_REPEATED_LAYER = _PAX_LM.USE_REPEATED_LAYER
  MAX_SEQ_LEN = 2048

  # The optimizer and schedule of c4.py's TransformerLmSpmdAdam, which Pax's template extends.
  LEARNING_RATE = _PAX_LM.LEARNING_RATE
  ADAM_BETA2 = _PAX_LM.ADAM_BETA2
  WEIGHT_DECAY = _PAX_LM.WEIGHT_DECAY
  CLIP_GRADIENT_NORM_TO_VALUE = _PAX_LM.CLIP_GRADIENT_NORM_TO_VALUE
  LR_SCHEDULE = _PAX_LM.LR_SCHEDULE
  CHECKPOINT_EVERY_N_STEPS = _PAX_LM.CHECKPOINT_EVERY_N_STEPS
  EVAL_INTERVAL_STEPS = _PAX_LM.EVAL_INTERVAL_STEPS

  def num_kv_heads(self) -> int:
    """NUM_KV_HEADS with USE_MQA, else NUM_HEADS (Pax's combined q/k/v attention)."""
    if not self.USE_MQA:
      self.not_used("NUM_KV_HEADS", reason="USE_MQA=False: every head has its own keys")
      return self.num_heads()
    if self.NUM_KV_HEADS is None:
      raise UserError("USE_MQA=True needs NUM_KV_HEADS, the number of key/value heads.")
    return self.NUM_KV_HEADS

  def validate(self) -> None:
    super().validate()
    if self.MODEL_CLASS is not CustomMetricsLM:
      raise UserError(f"MODEL_CLASS={getattr(self.MODEL_CLASS, '__name__', self.MODEL_CLASS)!r}"
                      ": BaseLLaMA builds paxlike's Llama family model with CustomMetricsLM's "
                      "fields; leave MODEL_CLASS as it is.")
    activation = getattr(self.ACTIVATION_CLS, "__name__", self.ACTIVATION_CLS)
    if activation != "SiLU" or not self.USE_GATED_ACTIVATION:
      raise UserError(f"ACTIVATION_CLS={activation}, USE_GATED_ACTIVATION="
                      f"{self.USE_GATED_ACTIVATION}: LLaMA's feed-forward is SiLU-gated; "
                      "leave both as BaseLLaMA sets them.")
    for theirs, ours in (("NUM_TRAIN_STEPS", "MAX_STEPS"), ("NORM_EPSILON", "RMS_NORM_EPSILON")):
      if getattr(self, theirs) != getattr(LlamaSpmdAdam, theirs):  # set by --set or a class
        raise UserError(f"{theirs}={getattr(self, theirs)!r}: BaseLLaMA reads {ours}, as "
                        f"Pax's template does; set {ours} instead.")
    if self.MAX_STEPS < 0:
      raise UserError(f"MAX_STEPS={self.MAX_STEPS} must be 0 (evaluate only) or more.")

  def model(self) -> fdl.Config[Any]:
    self.not_used("MODEL_DTYPE", reason="Pax's BaseLLaMA keeps float32 weights; FPROP_DTYPE "
                  "is the compute dtype")
    self.not_used("TRAINING_OPTIMIZED_SHARDING", reason="paxlike shards by its mesh rules")
    fields = fdl.ordered_arguments(super().model())
    fields["norm_epsilon"] = float(self.RMS_NORM_EPSILON)
    return fdl.Config(CustomMetricsLlama, **fields)

  def task(self) -> fdl.Config[Any]:
    cfg = super().task()
    cfg.train.num_train_steps = self.MAX_STEPS
    return cfg


__all__ = ["BaseLLaMA"]
