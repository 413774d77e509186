"""The training half every shipped experiment template shares.

Optimizer (optax through paxlike.learners), learning-rate schedule, train
cadence and mesh, as UPPERCASE hyperparameters; `task()` puts them together
with the template's `model()`. The model families' templates
(paxlike.lm_experiments, paxlike.t5_experiments) subclass it and add their
dims and model().
"""

from __future__ import annotations

import math
from typing import Any

import fiddle as fdl
import jax

from paxlike import config
from paxlike.errors import UserError, counted
from paxlike.experiment import BaseExperiment
from paxlike.layers.linear import LORA_NAMES, lora_targets
from paxlike.learners import Learner
from paxlike.task import Task, TrainSettings


class AdamTraining(BaseExperiment):
  """Optimizer, schedule, cadence and mesh; subclasses define model() and PERCORE_BATCH_SIZE."""

  OPTIMIZER = "adam"
  LEARNING_RATE = 2.5e-4
  # 'constant', or Pax's ramp-up schedules with their own knobs (praxis's formulas,
  # see paxlike.learners.Learner): LR_LRED_* for 'linear_rampup_exponential_decay',
  # LR_COS_* for 'linear_rampup_cosine_decay'. The rate is LEARNING_RATE x the
  # schedule's multiplier, which peaks at *_MAX.
  LR_SCHEDULE = "constant"
  LR_LRED_WARMUP = 4000
  LR_LRED_DECAY_START = 4001
  LR_LRED_DECAY_END = 300000
  LR_LRED_MIN_RATIO = 0.1
  LR_LRED_MAX = 1.0
  LR_COS_WARMUP = 4000
  LR_COS_DECAY_START = 4001
  LR_COS_DECAY_END = 300000
  LR_COS_MIN_RATIO = 0.1
  LR_COS_MAX = 1.0
  ADAM_BETA1 = 0.9
  ADAM_BETA2 = 0.99
  ADAM_EPSILON = 1e-6
  ADAM_EPSILON_ROOT = 0.0
  ADAM_CLIP_THRESHOLD = 1.0  # each parameter's Adam update clipped to this RMS; 0: off
  WEIGHT_DECAY = 1e-3
  CLIP_GRADIENT_NORM_TO_VALUE = 1.0

  NUM_TRAIN_STEPS = 1000
  CHECKPOINT_EVERY_N_STEPS = 1000
  CHECKPOINT_MAX_TO_KEEP = 10
  SUMMARY_INTERVAL_STEPS = 100
  EVAL_INTERVAL_STEPS = 0
  TRAINING_SEED = 1234
  # Stop training once an eval's log-perplexity is at or below this (None: never).
  TARGET_LOG_PPLX: float | None = None
  # Eval inputs' batch per device (None: PERCORE_BATCH_SIZE); Pax's fractional rule.
  PERCORE_EVAL_BATCH_SIZE: float | None = None
  # Gradient accumulation (T5X's num_microbatches): the global batch is split into
  # this many slices whose float32-accumulated gradient makes one update.
  NUM_MICROBATCHES = 1

  ICI_MESH_SHAPE = [1, 1, 1]
  DCN_MESH_SHAPE = None

  def model(self) -> fdl.Config[Any]:
    raise NotImplementedError(f"{type(self).__name__} must define model().")

  # Both families' Transformer dims: HIDDEN_DIMS and DIMS_PER_HEAD may be None, and
  # are then derived here, so a --set MODEL_DIMS reaches them.

  def hidden_dims(self) -> int:
    """HIDDEN_DIMS, or 4 x MODEL_DIMS when it is None."""
    return self.HIDDEN_DIMS if self.HIDDEN_DIMS is not None else 4 * self.MODEL_DIMS

  def num_heads(self) -> int:
    """NUM_HEADS, or MODEL_DIMS // DIMS_PER_HEAD when it is None (Pax's rule)."""
    if self.NUM_HEADS is not None:
      return self.NUM_HEADS
    if self.DIMS_PER_HEAD is None:
      raise UserError("NUM_HEADS and DIMS_PER_HEAD are both None; set at least one of them.")
    return self.MODEL_DIMS // self.DIMS_PER_HEAD

  def dims_per_head(self) -> int:
    """DIMS_PER_HEAD, or MODEL_DIMS // NUM_HEADS when it is None."""
    return self.DIMS_PER_HEAD if self.DIMS_PER_HEAD is not None else (
        self.MODEL_DIMS // self.num_heads())

  def check_positive(self, *names: str) -> None:
    """Raises UserError naming the first of these hyperparameters that is not positive."""
    for name in names:
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise UserError(f"{name} must be a positive number, got {value!r}.")

  def check_heads(self) -> None:
    """Raises UserError when MODEL_DIMS, NUM_HEADS and DIMS_PER_HEAD do not fit together.

    One of NUM_HEADS and DIMS_PER_HEAD may be None and is derived from the
    other (Pax derives NUM_HEADS = MODEL_DIMS / DIMS_PER_HEAD); the one given
    must divide MODEL_DIMS. When both are set they may differ from MODEL_DIMS
    (T5 and Llama-style heads).
    """
    if self.NUM_HEADS is None and self.DIMS_PER_HEAD is None:
      raise UserError("NUM_HEADS and DIMS_PER_HEAD are both None; set at least one of them.")
    if self.NUM_HEADS is None:
      if self.DIMS_PER_HEAD <= 0 or self.MODEL_DIMS % self.DIMS_PER_HEAD:
        raise UserError(f"NUM_HEADS=None derives the heads as MODEL_DIMS / DIMS_PER_HEAD, but "
                        f"MODEL_DIMS={self.MODEL_DIMS} is not a multiple of DIMS_PER_HEAD="
                        f"{self.DIMS_PER_HEAD}; set NUM_HEADS or change one of them.")
    elif self.DIMS_PER_HEAD is None and (self.NUM_HEADS <= 0 or self.MODEL_DIMS % self.NUM_HEADS):
      raise UserError(f"MODEL_DIMS={self.MODEL_DIMS} does not divide into NUM_HEADS="
                      f"{self.NUM_HEADS} heads; set DIMS_PER_HEAD or change one of them.")

  def learner(self) -> fdl.Config[Learner]:
    """The optimizer and schedule; knobs of the schedules and optimizers not in use are
    declared unused (a --set of one is refused, a class attribute is logged)."""
    lred = ("LR_LRED_WARMUP", "LR_LRED_DECAY_START", "LR_LRED_DECAY_END", "LR_LRED_MIN_RATIO",
            "LR_LRED_MAX")
    cos = ("LR_COS_WARMUP", "LR_COS_DECAY_START", "LR_COS_DECAY_END", "LR_COS_MIN_RATIO",
           "LR_COS_MAX")
    schedule = self.LR_SCHEDULE
    knobs = {"linear_rampup_exponential_decay": lred, "linear_rampup_cosine_decay": cos}
    chosen = knobs.get(schedule, ())
    for names in knobs.values():
      if names is not chosen:
        self.not_used(*names, reason=f"LR_SCHEDULE={schedule!r} does not read it",
                      config="train.learner.optimizer.lr_schedule")
    optimizer = self.OPTIMIZER
    adam = ("ADAM_BETA1", "ADAM_BETA2", "ADAM_EPSILON", "ADAM_EPSILON_ROOT",
            "ADAM_CLIP_THRESHOLD")
    if optimizer != "adam":
      self.not_used(*adam, reason=f"OPTIMIZER={optimizer!r} is not Adam",
                    config="train.learner.optimizer")
    sched = dict(zip(("warmup_steps", "decay_start", "decay_end", "min_ratio", "max"),
                     (getattr(self, n) for n in chosen), strict=False))
    learning_rate = self.LEARNING_RATE
    if learning_rate is None or None in sched.values():
      learning_rate, sched = self._by_global_batch(learning_rate, sched, schedule)
      unset = [knob for knob, value in zip(chosen, sched.values(), strict=False)
               if value is None]
      if unset:
        raise UserError(f"{unset[0]}=None: only LEARNING_RATE and the cosine schedule's "
                        "LR_COS_WARMUP / _DECAY_START / _DECAY_END may be None (Pax's c4 rule "
                        "derives them from the global batch); give it a value.")
    opt = {}
    if optimizer == "adam":
      opt = dict(beta1=self.ADAM_BETA1, beta2=self.ADAM_BETA2, epsilon=self.ADAM_EPSILON,
                 epsilon_root=self.ADAM_EPSILON_ROOT, clip_threshold=self.ADAM_CLIP_THRESHOLD)
    elif optimizer == "sgd":
      opt = dict(beta1=self.ADAM_BETA1)  # the momentum
    return fdl.Config(
        Learner, optimizer=optimizer, learning_rate=learning_rate, schedule=schedule,
        weight_decay=self.WEIGHT_DECAY,
        clip_gradient_norm_to_value=self.CLIP_GRADIENT_NORM_TO_VALUE, **sched, **opt)

  def _by_global_batch(self, learning_rate: float | None, sched: dict[str, Any],
                       schedule: str) -> tuple[float, dict[str, Any]]:
    """Pax's c4.py rule for the knobs it lets be None, from the global batch (PERCORE_BATCH_SIZE
    x every device): LEARNING_RATE 2e-5 up to 3584 rows, else 3e-5; the cosine schedule's
    warmup ceil(265 x 1536 / batch) steps, its decay from the step after, to
    ceil(108600 x 1536 / batch)."""
    batch = int(self.PERCORE_BATCH_SIZE * jax.device_count() + 1e-6)
    if learning_rate is None:
      learning_rate = 2e-5 if batch <= 3584 else 3e-5
    sched = dict(sched)
    if schedule == "linear_rampup_cosine_decay":
      if sched["warmup_steps"] is None:
        sched["warmup_steps"] = math.ceil(265.0 * 1536 / batch - 1e-6)
      if sched["decay_start"] is None:
        sched["decay_start"] = sched["warmup_steps"] + 1
      if sched["decay_end"] is None:
        sched["decay_end"] = math.ceil(108600.0 * 1536 / batch - 1e-6)
    return learning_rate, sched

  def task(self) -> fdl.Config[Task]:
    return fdl.Config(
        Task, model=self.model(),
        train=fdl.Config(
            TrainSettings, learner=self.learner(), num_train_steps=self.NUM_TRAIN_STEPS,
            save_interval_steps=self.CHECKPOINT_EVERY_N_STEPS,
            save_max_to_keep=self.CHECKPOINT_MAX_TO_KEEP,
            summary_interval_steps=self.SUMMARY_INTERVAL_STEPS,
            eval_interval_steps=self.EVAL_INTERVAL_STEPS, seed=self.TRAINING_SEED,
            target_log_pplx=self.TARGET_LOG_PPLX,
            num_microbatches=self.accumulation_steps()))

  def accumulation_knob(self) -> str:
    """The hyperparameter that splits the batch into gradient-accumulation slices:
    NUM_MICROBATCHES (a pipelined experiment reads that as the pipeline's and
    accumulates GRADIENT_ACCUMULATION_STEPS)."""
    return "NUM_MICROBATCHES"

  def accumulation_steps(self) -> int:
    """The batch's gradient-accumulation slices: accumulation_knob's value."""
    return getattr(self, self.accumulation_knob())

  def per_host_batch_size(self) -> int:
    """PERCORE_BATCH_SIZE x this host's device count, by Pax's rule for fractions."""
    return pax_batch_size("PERCORE_BATCH_SIZE", self.PERCORE_BATCH_SIZE,
                          jax.local_device_count(), jax.process_count())

  def per_host_eval_batch_size(self) -> int:
    """PERCORE_EVAL_BATCH_SIZE (or PERCORE_BATCH_SIZE) x this host's device count."""
    percore = self.PERCORE_EVAL_BATCH_SIZE
    if percore is None:
      return self.per_host_batch_size()
    return pax_batch_size("PERCORE_EVAL_BATCH_SIZE", percore, jax.local_device_count(),
                          jax.process_count())


class PaxLearner:
  """The learner of Pax's templates (model_params, c4): `task_p.train.learner.optimizer` is a
  praxis optimizer config (paxlike.pax.optimizers), built from the knobs as Pax's
  set_default_adam / set_default_adafactor / set_adam_and_learning_rate_schedule build it,
  so a Pax file's edits after `super().task()` (`lp.optimizer.lr_schedule.warmup_steps =
  10`, `lp.optimizer.beta2 = 0.95`) reach it. OPTIMIZER 'adafactor' is then Pax's
  ShardedAdafactor (decay_method 'adam', beta1 0.9, decay_adam 0.99, int8 momentum), not
  T5X's Adafactor that the name means on paxlike's own templates."""

  def learner(self) -> fdl.Config[Learner]:
    knobs = super().learner()
    config.build(knobs)  # the knobs' own checks, in their names (LR_LRED_WARMUP <= ...)
    return fdl.Config(Learner, optimizer=praxis_optimizer(knobs))


def praxis_optimizer(knobs: fdl.Config[Learner]) -> fdl.Config[Any]:
  """The praxis optimizer config that runs what the knob-built learner `knobs` runs."""
  from paxlike.pax import optimizers, schedules

  k = knobs
  if k.schedule == "constant":
    schedule = fdl.Config(schedules.Constant)
  else:
    schedule = fdl.Config(
        schedules.LinearRampupCosineDecay if k.schedule == "linear_rampup_cosine_decay"
        else schedules.LinearRampupExponentialDecay, warmup_steps=k.warmup_steps,
        decay_start=k.decay_start, decay_end=k.decay_end, min_ratio=k.min_ratio, max=k.max)
  common = dict(learning_rate=k.learning_rate, lr_schedule=schedule,
                clip_gradient_norm_to_value=k.clip_gradient_norm_to_value)
  if k.optimizer == "adam":
    # maybe_inf_to_nan off: an inf gradient stops the run as a NaN does (paxlike.nonfinite),
    # and the optimizer state keeps the layout checkpoints of these templates already have.
    return fdl.Config(optimizers.Adam, beta1=k.beta1, beta2=k.beta2, epsilon=k.epsilon,
                      epsilon_root=k.epsilon_root, clip_threshold=k.clip_threshold,
                      weight_decay=k.weight_decay, maybe_inf_to_nan=False, **common)
  if k.optimizer == "adafactor":
    return fdl.Config(optimizers.ShardedAdafactor, decay_method="adam", beta1=0.9,
                      decay_adam=0.99, weight_decay=k.weight_decay, **common)
  return fdl.Config(optimizers.ShardedSgd, momentum=k.beta1 or None, **common)


class LoraHParams:
  """Pax's LoRA knobs (the LoRAMixin of paxml's GPU scripts) on a decoder's template.

  USE_LORA=True gives the attention's projections (q/k/v or combined, and the
  output), the feed-forward's, or both (LORA_TARGET_LAYERS 'attention', 'mlp',
  'all') LORA_RANK-wide adapters (paxlike.layers.linear.lora_output) and trains
  only them: the learner's bprop_variable_inclusion is Pax's, every parameter
  named lora. INIT_FROM's source needs no adapters: those it lacks start
  fresh, as Pax's CHECKPOINT_IGNORE_RULES for LoRA let them. Decoding and
  exports fold each adapter into its weight (merge_lora).
  """

  USE_LORA = False
  LORA_RANK = 8
  LORA_TARGET_LAYERS = "all"

  def lora_fields(self) -> dict[str, Any]:
    """The model's lora_rank and lora_target_layers ({} with USE_LORA False)."""
    if not self.USE_LORA:
      self.not_used("LORA_RANK", "LORA_TARGET_LAYERS", reason="USE_LORA is False")
      return {}
    if not isinstance(self.LORA_RANK, int) or isinstance(self.LORA_RANK, bool) \
        or self.LORA_RANK <= 0:
      raise UserError(f"LORA_RANK must be a positive integer, got {self.LORA_RANK!r}.")
    lora_targets(self.LORA_RANK, self.LORA_TARGET_LAYERS)
    return {"lora_rank": self.LORA_RANK, "lora_target_layers": self.LORA_TARGET_LAYERS}

  def task(self) -> fdl.Config[Any]:
    cfg = super().task()
    if self.USE_LORA:  # set on the task's learner, whichever learner() made it
      cfg.train.learner.bprop_variable_inclusion = [LORA_NAMES]
    return cfg


def pax_batch_size(name: str, percore: float, local_devices: int, processes: int = 1) -> int:
  """The per-host batch of a per-core batch size, by Pax's rule (lm_cloud's SyntheticDataset).

  At least 1 per core: PERCORE x local devices. Below 1 (Pax's pipelined
  configs use 0.75, 0.0625): the global batch is PERCORE x all devices, split
  evenly over the hosts. paxlike feeds every host, so the product must be a
  whole number of rows per host.

  Raises:
    UserError: a batch that is not a positive whole number of rows per host.
  """
  if isinstance(percore, bool) or not isinstance(percore, int | float) or percore <= 0:
    raise UserError(f"{name} must be a positive number, got {percore!r}.")
  per_host = percore * local_devices
  if percore < 1:
    global_batch = percore * local_devices * processes
    if global_batch != int(global_batch) or global_batch < 1:
      raise UserError(f"{name}={percore} on {counted(local_devices * processes, 'device')} gives a "
                      f"global batch of {global_batch:g} rows, not a whole number; pick a "
                      "per-core size whose product with the device count is an integer.")
    if int(global_batch) % processes:
      raise UserError(f"{name}={percore} gives a global batch of {int(global_batch)} rows, "
                      f"which {processes} hosts cannot share evenly (Pax would leave some "
                      "hosts idle; paxlike feeds every host); raise it.")
    return int(global_batch) // processes
  if per_host != int(per_host):
    raise UserError(f"{name}={percore} on {counted(local_devices, 'device')} per host gives "
                    f"{per_host:g} rows per host, not a whole number; pick a per-core size "
                    "whose product with the device count is an integer.")
  return int(per_host)
