"""paxml.tasks.lm.model_params: Pax's LM templates and its optimizer helpers.

The templates are paxlike's (paxlike.lm_experiments), with Pax's defaults.
`set_default_adam` / `set_default_adafactor` set `task_p.train.learner.optimizer`
to the praxis optimizer configs Pax's set (paxlike.pax.optimizers, run by
paxlike's learner), so later edits of `lp.optimizer.*` work as in Pax. The
pipelined templates (TransformerLmSpmdPipelineAdafactor / Adam) run paxlike's
pipeline (paxlike.layers.pipeline); ClassificationModelAdam, lm_cloud.py's
MLP classifier, paxlike.classifier_experiments's; the BERT templates
(TransformerBertPmapAdam / TransformerBertSpmdAdafactor), paxlike.bert_experiments's.
"""

from __future__ import annotations

import copy
from typing import Any

import fiddle as fdl

from paxlike.bert_experiments import TransformerBertPmapAdam, TransformerBertSpmdAdafactor
from paxlike.classifier_experiments import ClassificationModelAdam
from paxlike.lm_experiments import (
  TransformerLmPmapAdam,
  TransformerLmSpmdAdafactor,
  TransformerLmSpmdAdam,
  TransformerLmSpmdPipelineAdafactor,
  TransformerLmSpmdPipelineAdam,
)
from paxlike.pax import optimizers, pax_fiddle, praxis_layers, schedules


def set_default_adam(task_p: Any, learning_rate: float, weight_decay: float, *,
                     warmup_steps: int = 4000, decay_start: int = 4001,
                     decay_end: int = 300000) -> None:
  """Pax's default Adam on task_p.train.learner, as a praxis optimizer config.

  optimizers.Adam (beta1 0.9, beta2 0.99, praxis's epsilon 1e-6 and update
  clip_threshold 1.0), gradient norm clipped to 5.0, linear warmup then
  exponential decay to 0.1 x the rate at decay_end.
  """
  lp = task_p.train.learner
  lp.loss_name = "total_loss"
  lp.optimizer = pax_fiddle.Config(optimizers.Adam, beta1=0.9, beta2=0.99,
                                   weight_decay=weight_decay, clip_gradient_norm_to_value=5.0)
  lp.optimizer.learning_rate = learning_rate
  lp.optimizer.lr_schedule = _exponential_decay(warmup_steps, decay_start, decay_end)


def set_default_adafactor(task_p: Any, learning_rate: float, weight_decay: float, *,
                          warmup_steps: int = 4000, decay_start: int = 4001,
                          decay_end: int = 100000,
                          clip_gradient_norm_to_value: float = 5.0) -> None:
  """Pax's default Adafactor on task_p.train.learner, as a praxis optimizer config.

  optimizers.ShardedAdafactor with Adam-like decay (beta1 0.9, decay_adam
  0.99), the given gradient clipping, Pax's warmup and exponential decay.
  """
  lp = task_p.train.learner
  lp.loss_name = "total_loss"
  lp.optimizer = pax_fiddle.Config(
      optimizers.ShardedAdafactor, decay_method="adam", beta1=0.9, decay_adam=0.99,
      weight_decay=weight_decay, clip_gradient_norm_to_value=clip_gradient_norm_to_value)
  lp.optimizer.learning_rate = learning_rate
  lp.optimizer.lr_schedule = _exponential_decay(warmup_steps, decay_start, decay_end)


def _exponential_decay(warmup_steps: int, decay_start: int, decay_end: int) -> Any:
  return pax_fiddle.Config(schedules.LinearRampupExponentialDecay, warmup_steps=warmup_steps,
                           decay_start=decay_start, decay_end=decay_end, min_ratio=0.1, max=1.0)


def maybe_setup_moe_params(model_p: Any) -> None:
  """Pax's switch of a stack's feed-forward template to a mixture-of-experts one.

  A stack (or a repeated stack's block) with num_experts gets its
  moe_layer_tpl from its layers' feed-forward: the hidden dims (unless the
  MoE template sets its own), norm, activation, dropouts and norm policy, as
  Pax copies them (not use_gated_activation: Pax's MoE layers never gate).
  The layers in the stack's moe_layers then use it; one without experts is
  left as it is.
  """
  if isinstance(model_p, fdl.Buildable) and issubclass(
      fdl.get_callable(model_p), praxis_layers.StackedTransformerRepeated):
    model_p = model_p.block
  if not getattr(model_p, "num_experts", 0):
    return
  ff_p = model_p.transformer_layer_params_tpl.tr_fflayer_tpl
  moe_p = model_p.moe_layer_tpl
  moe_p.input_dims = ff_p.input_dims
  if not moe_p.hidden_dims:
    moe_p.hidden_dims = ff_p.hidden_dims
  moe_p.ln_tpl = copy.deepcopy(ff_p.ln_tpl)
  moe_p.activation_tpl = copy.deepcopy(ff_p.activation_tpl)
  moe_p.relu_dropout_prob = ff_p.relu_dropout_prob
  moe_p.residual_dropout_prob = ff_p.residual_dropout_prob
  moe_p.add_skip_connection = ff_p.add_skip_connection
  moe_p.norm_policy = ff_p.norm_policy


__all__ = [
    "ClassificationModelAdam", "TransformerBertPmapAdam", "TransformerBertSpmdAdafactor",
    "TransformerLmPmapAdam", "TransformerLmSpmdAdafactor", "TransformerLmSpmdAdam",
    "TransformerLmSpmdPipelineAdafactor", "TransformerLmSpmdPipelineAdam",
    "maybe_setup_moe_params", "set_default_adafactor", "set_default_adam",
]
