"""paxml.tasks.lm.model_params: Pax's LM templates and its optimizer helpers.

The templates are paxlike's (paxlike.lm_experiments), with Pax's defaults.
`set_default_adam` / `set_default_adafactor` set the learner on a task config
as Pax's do (`task_p.train.learner`). The pipelined templates and
ClassificationModelAdam exist so Pax's files import and register; running
one is refused.
"""

from __future__ import annotations

from typing import Any

from paxlike.errors import UserError
from paxlike.experiment import BaseExperiment
from paxlike.lm_experiments import (
    TransformerLmPmapAdam,
    TransformerLmSpmdAdafactor,
    TransformerLmSpmdAdam,
)


def _set_learner(task_p: Any, **fields: Any) -> None:
  lp = task_p.train.learner
  for name, value in fields.items():
    setattr(lp, name, value)


def set_default_adam(task_p: Any, learning_rate: float, weight_decay: float, *,
                     warmup_steps: int = 4000, decay_start: int = 4001,
                     decay_end: int = 300000) -> None:
  """Pax's default Adam on task_p.train.learner.

  Adam (beta1 0.9, beta2 0.99, epsilon 1e-6), gradient norm clipped to 5.0,
  linear warmup then exponential decay to 0.1 x the rate at decay_end.
  """
  _set_learner(
      task_p, loss_name="total_loss", optimizer="adam", beta1=0.9, beta2=0.99, epsilon=1e-6,
      weight_decay=weight_decay, clip_gradient_norm_to_value=5.0,
      learning_rate=learning_rate, schedule="linear_rampup_exponential_decay",
      warmup_steps=warmup_steps, decay_start=decay_start, decay_end=decay_end, min_ratio=0.1)


def set_default_adafactor(task_p: Any, learning_rate: float, weight_decay: float, *,
                          warmup_steps: int = 4000, decay_start: int = 4001,
                          decay_end: int = 100000,
                          clip_gradient_norm_to_value: float = 5.0) -> None:
  """Pax's default Adafactor on task_p.train.learner, with Pax's schedule and clipping."""
  _set_learner(
      task_p, loss_name="total_loss", optimizer="adafactor", beta1=0.9, beta2=0.99,
      weight_decay=weight_decay, clip_gradient_norm_to_value=clip_gradient_norm_to_value,
      learning_rate=learning_rate, schedule="linear_rampup_exponential_decay",
      warmup_steps=warmup_steps, decay_start=decay_start, decay_end=decay_end, min_ratio=0.1)


class _NotRunnable:
  """Refuses the run in validate(), before anything is built or written."""

  WHY = ""

  def validate(self) -> None:
    raise UserError(f"{type(self).__name__} is {self.WHY}, which paxlike does not run yet; "
                    "use a TransformerLmSpmdAdafactor / TransformerLmSpmdAdam experiment.")


class TransformerLmSpmdPipelineAdafactor(_NotRunnable, TransformerLmSpmdAdafactor):
  """Pax's pipelined SPMD LM template (importable; running it is refused)."""

  WHY = ("a pipelined Transformer (NUM_STAGES, MICROBATCH_SIZE, CIRCULAR_REPEAT and a "
         "4-axis [stage, replica, data, mdl] mesh)")
  NUM_STAGES = None
  CIRCULAR_REPEAT = 1
  PIPELINE_BROADCAST_INPUTS = False
  NUM_MICROBATCHES = None
  MICROBATCH_SIZE = None
  DCN_MESH_SHAPE = [1, 1, 1, 1]
  EMB_W_DATA_DIMS = "data"
  STREAM_IO = False


class TransformerLmSpmdPipelineAdam(TransformerLmSpmdPipelineAdafactor):
  """Pax's pipelined SPMD LM template with Adam (importable; running it is refused)."""

  OPTIMIZER = "adam"
  NUM_LAYERS = 32
  NUM_HEADS = 16
  MODEL_DIMS = 1024
  FPROP_DTYPE = TransformerLmSpmdAdam.FPROP_DTYPE
  LEARNING_RATE = 1e-3


class ClassificationModelAdam(_NotRunnable, BaseExperiment):
  """Pax's MLP classifier template (importable; running it is refused)."""

  WHY = "an MLP classification model (praxis' ClassificationMLPModel)"
  NUM_LAYER = 8
  INPUT_DIM = 4096
  HIDDEN_DIM = 7168
  OUTPUT_DIM = 4096
  LEARNING_RATE = 1e-3
  WEIGHT_DECAY = 1e-3
  CHECKPOINT_EVERY_N_STEPS = 5
  SUMMARY_INTERVAL_STEPS = 5
  NUM_TRAIN_STEPS = 10
  MLP_WEIGHT_SHARDING = None
  SOFTMAX_WEIGHT_SHARDING = None
  MESH_SHAPE = None
  TRAINING_OPTIMIZED_SHARDING = True


__all__ = [
    "ClassificationModelAdam", "TransformerLmPmapAdam", "TransformerLmSpmdAdafactor",
    "TransformerLmSpmdAdam", "TransformerLmSpmdPipelineAdafactor",
    "TransformerLmSpmdPipelineAdam", "set_default_adafactor", "set_default_adam",
]
