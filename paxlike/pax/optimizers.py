"""praxis.optimizers: Pax's optimizer configs, run by paxlike's learner (optax).

As Pax's files write them:

    lp = task_p.train.learner
    lp.optimizer = pax_fiddle.Config(optimizers.Adam, beta1=0.9, beta2=0.95,
                                     weight_decay=0.1, clip_gradient_norm_to_value=1.0)
    lp.optimizer.learning_rate = 6e-4
    lp.optimizer.lr_schedule = pax_fiddle.Config(schedules.LinearRampupCosineDecay, ...)

Each class has praxis's fields and defaults, and each field means what it
means in praxis (the optax chain is built in paxlike.learners). A field
paxlike does not model, set to anything but its default, is refused when
the config is built, naming it.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import optax

from paxlike import learners
from paxlike.errors import UserError
from paxlike.pax import schedules
from paxlike.pax.base_hyperparams import FiddleBaseParameterizable, instantiate


class BaseOptimizer(FiddleBaseParameterizable):
  """What every praxis optimizer has: learning rate, schedule, clipping, regularizers.

  The gradients' global norm is clipped to clip_gradient_norm_to_value (> 0),
  or each gradient's norm to clip_gradient_single_norm_to_value (> 0); the
  l1 / l2 regularizers add to the gradients (skip_lp_1d_vectors: not to
  vectors); decoupled_weight_decay subtracts lr x weight x parameter from
  each update. ema_decay and EWC are not modelled.
  """

  l2_regularizer_weight: float | None = None
  l1_regularizer_weight: float | None = None
  skip_lp_1d_vectors: bool = False
  decoupled_weight_decay: float | None = None
  clip_gradient_norm_to_value: float = 0.0
  clip_gradient_single_norm_to_value: float = 0.0
  learning_rate: float = 0.0
  lr_schedule: Any = None
  ema_decay: float = 0.0
  ewc_regularizer_weight: float = 0.0
  ewc_weight_per_var: Any = None

  # field -> (its default, what praxis uses it for): paxlike does not model it, so a
  # value that turns it on is refused (a float <= 0 is off, as in praxis).
  UNMODELLED = {
      "ema_decay": (0.0, "an exponential moving average of the weights"),
      "ewc_regularizer_weight": (0.0, "elastic weight consolidation"),
      "ewc_weight_per_var": (None, "elastic weight consolidation"),
  }

  def __post_init__(self) -> None:
    name = f"optimizers.{type(self).__name__}"
    for cls in reversed(type(self).__mro__):
      for field, (default, what) in vars(cls).get("UNMODELLED", {}).items():
        value = getattr(self, field)
        off = value == default or (isinstance(default, float) and isinstance(value, int | float)
                                   and value <= 0)
        if not off:
          raise UserError(f"{name}: {field}={value!r} ({what}) is not modelled by paxlike's "
                          f"learner; leave it at {default!r}.")
    if isinstance(self.learning_rate, int | float) and self.learning_rate < 0:
      raise UserError(f"{name}: learning_rate={self.learning_rate!r} must be 0 or more.")
    self.lr_schedule = instantiate(self.lr_schedule)
    if self.lr_schedule is None:
      raise UserError(f"{name} has no lr_schedule; set lp.optimizer.lr_schedule = "
                      "pax_fiddle.Config(schedules.Constant) (or a ramp-up schedule).")
    if not isinstance(self.lr_schedule, schedules.BaseSchedule):
      raise UserError(f"{name}: lr_schedule is {learners.config_name(self.lr_schedule)}, not "
                      "a schedule of paxlike.pax.schedules (Constant, LinearRampupCosineDecay, "
                      "LinearRampupExponentialDecay).")
    if self.clip_gradient_norm_to_value and self.clip_gradient_single_norm_to_value:
      raise UserError(f"{name} sets both clip_gradient_norm_to_value and "
                      "clip_gradient_single_norm_to_value, which praxis does not allow; "
                      "keep one.")
    if self.l1_regularizer_weight and self.l2_regularizer_weight:
      raise UserError(f"{name} sets both l1_regularizer_weight and l2_regularizer_weight, "
                      "which praxis does not allow; keep one.")
    if self.decoupled_weight_decay and (self.l1_regularizer_weight
                                        or self.l2_regularizer_weight):
      raise UserError(f"{name} mixes decoupled_weight_decay with an l1/l2 regularizer, which "
                      "praxis does not allow; keep one.")

  def learning_rate_fn(self) -> optax.Schedule:
    """learning_rate x the schedule's multiplier at a step."""
    lr, multiplier = self.learning_rate, self.lr_schedule.multiplier()
    return lambda step: lr * multiplier(step)

  def transformation(self) -> optax.GradientTransformation:
    """Clipping, regularizers, the optimizer itself, decoupled weight decay: praxis's order."""
    lr = self.learning_rate_fn()
    parts = []
    if self.clip_gradient_norm_to_value > 0:
      parts.append(optax.clip_by_global_norm(self.clip_gradient_norm_to_value))
    elif self.clip_gradient_single_norm_to_value > 0:
      parts.append(learners.clip_by_single_norm(self.clip_gradient_single_norm_to_value))
    if self.l1_regularizer_weight:
      parts.append(learners.lp_regularizer(self.l1_regularizer_weight, 1,
                                           self.skip_lp_1d_vectors))
    if self.l2_regularizer_weight:
      parts.append(learners.lp_regularizer(self.l2_regularizer_weight, 2,
                                           self.skip_lp_1d_vectors))
    parts.append(self.raw_transformation(lr))
    if self.decoupled_weight_decay:
      parts.append(learners.decoupled_weight_decay(lr, self.decoupled_weight_decay))
    return optax.chain(*parts)

  def raw_transformation(self, lr: optax.Schedule) -> optax.GradientTransformation:
    """The optimizer's own update rule, lr included (praxis's _get_raw_grad_transformation)."""
    raise NotImplementedError(f"{type(self).__name__} must define raw_transformation().")


class Adam(BaseOptimizer):
  """praxis's Adam: with sharded_adam (the default) praxis's own, whose update is capped
  to an RMS of clip_threshold (> 0) and adds weight_decay x the parameter; without,
  optax.adam (praxis then reads neither)."""

  beta1: float = 0.9
  beta2: float = 0.999
  epsilon: float = 1e-6
  epsilon_root: float = 0.0
  clip_threshold: float = 1.0
  weight_decay: float = 0.0
  sharded_adam: bool = True
  maybe_inf_to_nan: bool = True

  @classmethod
  def HParamsA(cls) -> Any:  # noqa: N802  (praxis's name)
    """praxis's commonly used Adam: beta1 0.9, beta2 0.997, epsilon 1e-9."""
    return cls.config(beta1=0.9, beta2=0.997, epsilon=1e-9)

  @classmethod
  def HParamsB(cls) -> Any:  # noqa: N802  (praxis's name)
    """praxis's other commonly used Adam: beta1 0.9, beta2 0.98, epsilon 1e-9."""
    return cls.config(beta1=0.9, beta2=0.98, epsilon=1e-9)

  def __post_init__(self) -> None:
    super().__post_init__()
    if not self.sharded_adam and (self.weight_decay or self.clip_threshold not in (1.0, 0.0)):
      raise UserError("optimizers.Adam with sharded_adam=False is optax.adam, which reads "
                      "neither weight_decay nor clip_threshold; set sharded_adam=True or "
                      "leave them at their defaults (use decoupled_weight_decay).")

  def raw_transformation(self, lr: optax.Schedule) -> optax.GradientTransformation:
    if not self.sharded_adam:
      return optax.adam(lr, b1=self.beta1, b2=self.beta2, eps=self.epsilon,
                        eps_root=self.epsilon_root)
    return learners.praxis_adam(
        lr, beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon,
        epsilon_root=self.epsilon_root, clip_threshold=self.clip_threshold,
        weight_decay=self.weight_decay, inf_to_nan=self.maybe_inf_to_nan)


class ShardedSgd(BaseOptimizer):
  """SGD, with momentum when it is set, Nesterov's when nesterov is."""

  momentum: float | None = None
  nesterov: bool = False

  def raw_transformation(self, lr: optax.Schedule) -> optax.GradientTransformation:
    return optax.sgd(lr, momentum=self.momentum, nesterov=self.nesterov)


class Sgd(ShardedSgd):
  """praxis's plain SGD: the same update as ShardedSgd."""


class Adafactor(BaseOptimizer):
  """praxis's wrapper of optax.adafactor, field by field."""

  min_dim_size_to_factor: int = 128
  decay_rate: float = 0.8
  decay_offset: int = 0
  multiply_by_parameter_scale: bool = True
  clip_threshold: float | None = 1.0
  momentum: float | None = None
  dtype_momentum: str = "float32"
  weight_decay_rate: float | None = None
  eps: float = 1e-30
  factored: bool = True

  def raw_transformation(self, lr: optax.Schedule) -> optax.GradientTransformation:
    return optax.adafactor(
        lr, min_dim_size_to_factor=self.min_dim_size_to_factor, decay_rate=self.decay_rate,
        decay_offset=self.decay_offset,
        multiply_by_parameter_scale=self.multiply_by_parameter_scale,
        clipping_threshold=self.clip_threshold, momentum=self.momentum,
        dtype_momentum=jnp.dtype(self.dtype_momentum), weight_decay_rate=self.weight_decay_rate,
        eps=self.eps, factored=self.factored)


class ShardedAdafactor(BaseOptimizer):
  """praxis's sharded Adafactor (see paxlike.learners.sharded_adafactor).

  decay_method 'adam' decays the second moment as Adam's bias-corrected
  decay_adam, 'pow' as 1 - (step+1)^-decay_pow; beta1 > 0 keeps momentum, in
  quantized_dtype ('int8', 'int16', 'bfloat16', 'float32'); weight_decay is
  decoupled (x lr x the parameter). Per-variable settings by name
  (a weight_decay dict, exclude_from_layerwise_adaptation) and per-variable
  summaries are not modelled.
  """

  weight_decay: Any = None
  layerwise_adaptation: bool = False
  exclude_from_layerwise_adaptation: Any = None
  decay_method: str = ""
  decay_adam: float = 0.0
  decay_pow: float = 0.0
  beta1: float = 0.0
  clip_threshold: float | None = 1.0
  factored: bool = True
  epsilon1_grad_sq_reg: float = 1e-30
  quantized_dtype: str = "int8"
  respect_skip_lp_regularization: bool = False
  per_var_learning_summary: bool = False
  sort_factored_second_moment_dims: bool = False
  min_dim_size_to_factor: int = 128
  multiply_by_parameter_scale: bool = False
  epsilon2_param_scale_reg: float = 1e-3
  maybe_inf_to_nan: bool = True
  name: str = ""

  UNMODELLED = {
      "exclude_from_layerwise_adaptation": (None, "variables picked by praxis's names"),
      "respect_skip_lp_regularization": (False, "praxis's SKIP_LP_REGULARIZATION collection"),
      "per_var_learning_summary": (False, "per-variable summaries"),
  }

  @classmethod
  def HParamsAdamB(cls) -> Any:  # noqa: N802  (praxis's name)
    """praxis's commonly used Adam-like Adafactor: beta1 0.9, decay_adam 0.98, int8 momentum."""
    return cls.config(beta1=0.9, decay_method="adam", decay_adam=0.98, quantized_dtype="int8")

  def __post_init__(self) -> None:
    super().__post_init__()
    where = "optimizers.ShardedAdafactor"
    if self.decay_method not in ("adam", "pow"):
      raise UserError(f"{where}: decay_method={self.decay_method!r} is not 'adam' or 'pow' "
                      "(praxis has no default); set decay_method='adam' with decay_adam.")
    rate = self.decay_adam if self.decay_method == "adam" else self.decay_pow
    if not rate > 0:
      raise UserError(f"{where}: decay_method={self.decay_method!r} needs decay_"
                      f"{self.decay_method} > 0, got {rate!r}.")
    if isinstance(self.weight_decay, dict):
      raise UserError(f"{where}: weight_decay as a dict of variable-name patterns is not "
                      "modelled (paxlike's variables have other names); give one float.")
    if self.quantized_dtype not in ("int8", "int16", "bfloat16", "float32"):
      raise UserError(f"{where}: quantized_dtype={self.quantized_dtype!r} is not one of "
                      "'int8', 'int16', 'bfloat16', 'float32'.")

  def raw_transformation(self, lr: optax.Schedule) -> optax.GradientTransformation:
    return learners.sharded_adafactor(lr, learners.AdafactorSettings(
        decay_method=self.decay_method, decay_adam=self.decay_adam, decay_pow=self.decay_pow,
        beta1=self.beta1, clip_threshold=self.clip_threshold, factored=self.factored,
        epsilon1_grad_sq_reg=self.epsilon1_grad_sq_reg, quantized_dtype=self.quantized_dtype,
        sort_factored_second_moment_dims=self.sort_factored_second_moment_dims,
        min_dim_size_to_factor=self.min_dim_size_to_factor,
        multiply_by_parameter_scale=self.multiply_by_parameter_scale,
        epsilon2_param_scale_reg=self.epsilon2_param_scale_reg, weight_decay=self.weight_decay,
        layerwise_adaptation=self.layerwise_adaptation,
        maybe_inf_to_nan=self.maybe_inf_to_nan))


__all__ = ["Adafactor", "Adam", "BaseOptimizer", "Sgd", "ShardedAdafactor", "ShardedSgd"]
