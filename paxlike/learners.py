"""Optimizer, schedule and gradient clipping from hyperparameters (optax).

Two ways to say what the learner does: its own fields (optimizer='adam',
beta1, ..., set by the templates from LEARNING_RATE / ADAM_* / LR_*), or, as
Pax's files write it, `learner.optimizer` set to a praxis optimizer config
(paxlike.pax.optimizers.Adam, ShardedAdafactor, ...) that carries its own
learning rate, schedule and clipping. The gradient transformations both
build on are here: praxis's Adam (praxis_adam), its sharded Adafactor
(sharded_adafactor), its ramp-up schedules (rampup_schedule) and the
regularizers and clippings its optimizers chain around them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from paxlike.errors import UserError
from paxlike.layers.linear import FP8_META

SCHEDULES = ("constant", "linear_rampup_cosine_decay", "linear_rampup_exponential_decay")
OPTIMIZERS = ("adam", "adafactor", "sgd")
# Learner's fields that only a named optimizer reads (a praxis optimizer config has its own).
KNOB_FIELDS = ("learning_rate", "schedule", "warmup_steps", "decay_start", "decay_end",
               "min_ratio", "max", "beta1", "beta2", "epsilon", "epsilon_root",
               "clip_threshold", "weight_decay", "clip_gradient_norm_to_value")


def config_name(value: Any) -> str:
  """How an error message shows a value that is a config or an object: its class's name."""
  import fiddle as fdl

  if isinstance(value, fdl.Buildable):
    target = fdl.get_callable(value)
    return f"Config({getattr(target, '__name__', type(target).__name__)})"
  if isinstance(value, str | int | float | bool | type(None)):
    return repr(value)
  return _a(type(value).__name__)


def _a(name: str) -> str:
  """'an Adam', 'a ShardedAdafactor'."""
  return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _unread_field(name: str, value: Any, optimizer: str) -> UserError:
  return UserError(f"learner.{name}={value!r} is not read when learner.optimizer is "
                   f"{optimizer}, which says the rate, schedule and clipping itself; set it on "
                   "the optimizer (lp.optimizer.learning_rate, lp.optimizer.lr_schedule, ...).")


def refuse_unread_fields(learner_cfg: Any) -> None:
  """Refuses a Learner config whose optimizer is a praxis optimizer config and which sets a
  field only a named optimizer reads (KNOB_FIELDS), whatever the value: on the config, what
  task() set is known (a built Learner cannot tell a 1e-3 set from the default 1e-3)."""
  import fiddle as fdl

  if not (isinstance(learner_cfg, fdl.Buildable) and fdl.get_callable(learner_cfg) is Learner):
    return
  optimizer = learner_cfg.__arguments__.get("optimizer")
  if not isinstance(optimizer, fdl.Buildable):
    return
  target = fdl.get_callable(optimizer)
  for name in KNOB_FIELDS:
    if name in learner_cfg.__arguments__:
      raise _unread_field(name, learner_cfg.__arguments__[name],
                          _a(getattr(target, "__name__", type(target).__name__)))


@dataclasses.dataclass
class Learner:
  """What turns gradients into updates.

  The rate at a step is `learning_rate` x the schedule's multiplier, as in
  praxis. Both ramp-up schedules rise linearly from 0 at step 0 to `max` at
  `warmup_steps` (warmup_steps 0: the first step has the full rate), stay
  there until `decay_start`, then decay to `max x min_ratio` at `decay_end`
  (cosine: half a cosine wave; exponential: a geometric curve) and stay
  constant after it.

  Adam follows praxis's: `epsilon_root` inside the square root, `epsilon`
  outside it, and with `clip_threshold` > 0 each parameter's update is
  scaled down to an RMS of at most clip_threshold (before the learning rate);
  `clip_gradient_norm_to_value` > 0 clips the gradients' global norm first.

  `optimizer` may instead be a praxis optimizer (paxlike.pax.optimizers:
  what `lp.optimizer = pax_fiddle.Config(optimizers.Adam, ...)` builds). It
  then says everything: its learning_rate, lr_schedule and clipping are the
  run's, and the fields above except loss_name are not read.
  """

  optimizer: Any = "adam"  # a name in OPTIMIZERS, or a praxis optimizer
  learning_rate: float = 1e-3
  schedule: str = "constant"
  warmup_steps: int = 0
  decay_start: int = 0
  decay_end: int = 0
  min_ratio: float = 0.1
  max: float = 1.0
  beta1: float = 0.9
  beta2: float = 0.99
  epsilon: float = 1e-6
  epsilon_root: float = 0.0
  clip_threshold: float = 0.0
  weight_decay: float = 0.0
  clip_gradient_norm_to_value: float = 0.0
  # Pax's learner fields that its experiment files set: the metric to minimise (paxlike's
  # models have one loss, 'total_loss' or 'loss'; a Pax user's model names its metrics,
  # BaseModel.for_task); the separator only names scanned layers' variables in Pax.
  loss_name: str = "total_loss"
  repeat_prefix_sep: str = "#"
  # praxis's Learner fields: regexes over parameter names ('transformer/repeat/ffn/ffn1/w',
  # as model_analysis.txt lists them), each matching a whole name. Non-empty inclusion
  # trains only the parameters it matches; exclusion freezes the ones it matches. A
  # frozen parameter gets no gradient and no optimizer slots (see freeze()).
  bprop_variable_inclusion: Sequence[str] = ()
  bprop_variable_exclusion: Sequence[str] = ()

  def __post_init__(self) -> None:
    for field in ("bprop_variable_inclusion", "bprop_variable_exclusion"):
      patterns = getattr(self, field)
      if isinstance(patterns, str):
        patterns = (patterns,)
      setattr(self, field, tuple(patterns))
      for pattern in patterns:
        try:
          re.compile(pattern)
        except (re.error, TypeError) as e:
          raise UserError(f"learner.{field} entry {pattern!r} is not a regular expression "
                          f"({e}).") from None
    if not isinstance(self.optimizer, str):
      if not (callable(getattr(self.optimizer, "learning_rate_fn", None))
              and callable(getattr(self.optimizer, "transformation", None))):
        raise UserError(f"learner.optimizer is {config_name(self.optimizer)}, which paxlike's "
                        f"learner cannot run; use one of {OPTIMIZERS} or a praxis optimizer "
                        "config (optimizers.Adam, optimizers.ShardedAdafactor, ...).")
      # (A field set to its default is refused on the config: refuse_unread_fields.)
      for f in dataclasses.fields(self):
        if f.name in KNOB_FIELDS and getattr(self, f.name) != f.default:
          raise _unread_field(f.name, getattr(self, f.name), config_name(self.optimizer))
      return
    if self.optimizer not in OPTIMIZERS:
      raise UserError(f"OPTIMIZER={self.optimizer!r} is not one of {OPTIMIZERS}.")
    if isinstance(self.learning_rate, int | float) and self.learning_rate < 0:
      raise UserError(f"LEARNING_RATE={self.learning_rate!r} must be 0 or more.")
    if self.schedule not in SCHEDULES:
      raise UserError(f"LR_SCHEDULE={self.schedule!r} is not one of {SCHEDULES}.")
    if self.schedule != "constant":
      prefix = "LR_COS" if self.schedule == "linear_rampup_cosine_decay" else "LR_LRED"
      if not 0 <= self.warmup_steps <= self.decay_start < self.decay_end:
        raise UserError(
            f"LR_SCHEDULE={self.schedule!r} needs 0 <= {prefix}_WARMUP <= {prefix}_DECAY_START "
            f"< {prefix}_DECAY_END, got {self.warmup_steps}, {self.decay_start}, "
            f"{self.decay_end}.")

  def lr_schedule(self) -> optax.Schedule:
    """The learning rate at each step (optax counts the first update as step 0)."""
    if not isinstance(self.optimizer, str):
      return self.optimizer.learning_rate_fn()
    lr = self.learning_rate
    if self.schedule == "constant":
      return optax.constant_schedule(lr)
    return rampup_schedule(self.schedule, lr * self.max, self.warmup_steps, self.decay_start,
                           self.decay_end, self.min_ratio)

  def trainable(self, tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """tree (parameters, or anything keyed as they are) with None for each frozen one.

    Raises:
      UserError: the patterns leave no parameter to train.
    """
    include, exclude = self.bprop_variable_inclusion, self.bprop_variable_exclusion
    if not include and not exclude:
      return tree

    def keep(path: Any, leaf: Any) -> Any:
      name = _param_name(path)
      if re.fullmatch(FP8_META, name):  # written by the step, whatever is frozen
        return leaf
      if include and not any(re.fullmatch(p, name) for p in include):
        return None
      return None if any(re.fullmatch(p, name) for p in exclude) else leaf

    out = jax.tree_util.tree_map_with_path(keep, tree, is_leaf=is_leaf)
    if not jax.tree.leaves(out, is_leaf=is_leaf):
      first_path = jax.tree_util.tree_flatten_with_path(tree, is_leaf)[0][0][0]
      raise UserError(f"learner.bprop_variable_inclusion={list(include)} and "
                      f"bprop_variable_exclusion={list(exclude)} leave no parameter to train; "
                      "the names are those model_analysis.txt lists "
                      f"({_param_name(first_path)}, ...).")
    return out

  def check_names(self, params: Any) -> None:
    """Refuses a bprop_variable_* pattern that matches none of the model's parameters
    (a pattern in praxis's names, `.*ff_layer.*`, would otherwise freeze nothing).

    Raises:
      UserError: naming the pattern and the names it is matched against.
    """
    names = [_param_name(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    for field in ("bprop_variable_inclusion", "bprop_variable_exclusion"):
      for pattern in getattr(self, field):
        if not any(re.fullmatch(pattern, name) for name in names):
          raise UserError(f"learner.{field} entry {pattern!r} matches no parameter; the "
                          "names are those model_analysis.txt lists "
                          f"({names[0] if names else 'none'}, ...), not praxis's.")

  def transform(self) -> optax.GradientTransformation:
    """The optax chain: clip by global norm, then the optimizer; freeze() around it when
    bprop_variable_inclusion / _exclusion freeze parameters."""
    if self.bprop_variable_inclusion or self.bprop_variable_exclusion:
      return freeze(self._transform(), self.trainable)
    return self._transform()

  def _transform(self) -> optax.GradientTransformation:
    if not isinstance(self.optimizer, str):
      return self.optimizer.transformation()
    schedule = self.lr_schedule()
    if self.optimizer == "adam":
      opt = praxis_adam(schedule, beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon,
                        epsilon_root=self.epsilon_root, clip_threshold=self.clip_threshold,
                        weight_decay=self.weight_decay)
    elif self.optimizer == "adafactor":
      opt = optax.adafactor(schedule, weight_decay_rate=self.weight_decay or None)
    else:
      opt = optax.sgd(schedule, momentum=self.beta1 or None)
    if self.clip_gradient_norm_to_value > 0:
      return optax.chain(optax.clip_by_global_norm(self.clip_gradient_norm_to_value), opt)
    return opt


def _param_name(path: Any) -> str:
  """A parameter's tree path as model_analysis.txt names it: 'transformer/repeat/ffn/ffn1/w'."""
  return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


class FrozenTransformation(NamedTuple):
  """An optax transformation over the parameters `select` keeps (freeze()).

  init and update take and give whole parameter trees; the state is
  `inner`'s over the selected ones. Updates are None for the frozen
  parameters: apply them with apply_updates below. Gradients may come
  selected already (None where frozen), as the train step computes them.
  """

  init: Callable[[Any], Any]
  update: Callable[..., tuple[Any, Any]]
  inner: optax.GradientTransformation
  select: Callable[[Any], Any]


def freeze(inner: optax.GradientTransformation,
           select: Callable[[Any], Any]) -> FrozenTransformation:
  """inner over select(params) only: a frozen parameter has no slots and no update."""
  def init(params: Any) -> Any:
    return inner.init(select(params))

  def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
    return inner.update(select(updates), state, None if params is None else select(params))

  return FrozenTransformation(init, update, inner, select)


def apply_updates(params: Any, updates: Any) -> Any:
  """optax.apply_updates where an update may be None (a frozen parameter: unchanged)."""
  return jax.tree.map(
      lambda p, u: p if u is None else (jnp.asarray(p) + u).astype(jnp.asarray(p).dtype),
      params, updates)


# ------------------------------------------------------------------ schedules


def rampup_schedule(kind: str, peak: float, warmup_steps: int, decay_start: int,
                    decay_end: int, min_ratio: float) -> optax.Schedule:
  """praxis's LinearRampup{Cosine,Exponential}Decay, peaking at `peak`.

  Linear from 0 at step 0 to peak at warmup_steps (none when 0), constant
  to decay_start, then cosine or exponential to peak x min_ratio at
  decay_end, constant after.
  """
  parts, boundaries = [], []
  if warmup_steps > 0:
    parts.append(optax.linear_schedule(0.0, peak, warmup_steps))
    boundaries.append(warmup_steps)
  parts.append(optax.constant_schedule(peak))
  boundaries.append(decay_start)
  span = decay_end - decay_start
  if kind == "linear_rampup_cosine_decay":
    parts.append(optax.cosine_decay_schedule(peak, span, alpha=min_ratio))
  else:
    parts.append(optax.exponential_decay(peak, span, min_ratio, end_value=peak * min_ratio))
  return optax.join_schedules(parts, boundaries)


# ---------------------------------------------------- praxis's transformations


def praxis_adam(schedule: optax.Schedule, *, beta1: float, beta2: float, epsilon: float,
                epsilon_root: float, clip_threshold: float, weight_decay: float,
                inf_to_nan: bool = False) -> optax.GradientTransformation:
  """praxis's sharded Adam: bias-corrected moments, `m / (sqrt(v + epsilon_root) + epsilon)`,
  each parameter's update capped to an RMS of clip_threshold (when > 0), plus
  weight_decay x the parameter, all times the learning rate."""
  parts = [_inf_to_nan()] if inf_to_nan else []
  parts.append(optax.scale_by_adam(b1=beta1, b2=beta2, eps=epsilon, eps_root=epsilon_root))
  if clip_threshold > 0:
    parts.append(optax.clip_by_block_rms(clip_threshold))
  if weight_decay:
    parts.append(optax.add_decayed_weights(weight_decay))
  parts.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*parts)


def _inf_to_nan() -> optax.GradientTransformation:
  """Infinities become NaN (praxis's maybe_inf_to_nan): a 1 / inf cannot hide as 0 later."""
  def fn(updates: Any, params: Any = None) -> Any:
    del params
    return jax.tree.map(lambda g: jnp.where(jnp.isinf(g), jnp.nan, g), updates)
  return optax.stateless(fn)


def lp_regularizer(weight: float, p: int, skip_1d: bool) -> optax.GradientTransformation:
  """Adds weight x param (p=2) or weight x sign(param) (p=1) to each gradient; with
  skip_1d, vectors and scalars are left alone (praxis's l1/l2_regularizer_weight)."""
  def add(g: jax.Array, w: jax.Array) -> jax.Array:
    if skip_1d and w.ndim <= 1:
      return g
    return g + weight * (w if p == 2 else jnp.sign(w))

  def fn(updates: Any, params: Any = None) -> Any:
    return jax.tree.map(add, updates, params)
  return optax.stateless(fn)


class _CountState(NamedTuple):
  count: jax.Array


def decoupled_weight_decay(schedule: optax.Schedule,
                           weight: float) -> optax.GradientTransformation:
  """Subtracts lr x weight x param from each (already lr-scaled) update (praxis's
  decoupled_weight_decay)."""
  def init(params: Any) -> _CountState:
    del params
    return _CountState(jnp.zeros([], jnp.int32))

  def update(updates: Any, state: _CountState, params: Any = None) -> tuple[Any, _CountState]:
    lr = schedule(state.count)
    updates = jax.tree.map(lambda u, w: u - lr * weight * w, updates, params)
    return updates, _CountState(state.count + 1)
  return optax.GradientTransformation(init, update)


def clip_by_single_norm(max_norm: float) -> optax.GradientTransformation:
  """Scales each gradient tensor down to an L2 norm of at most max_norm (praxis's
  clip_gradient_single_norm_to_value)."""
  def fn(updates: Any, params: Any = None) -> Any:
    del params
    return jax.tree.map(
        lambda g: g * jnp.minimum(1.0, max_norm / jnp.sqrt(jnp.sum(g * g))), updates)
  return optax.stateless(fn)


class AdafactorState(NamedTuple):
  """praxis's sharded Adafactor slots, one tree each; unused slots are shape-(1,) zeros."""

  count: jax.Array
  m: Any
  m_scale: Any
  vr: Any
  vc: Any
  v: Any


@dataclasses.dataclass(frozen=True)
class AdafactorSettings:
  """praxis's ShardedAdafactor, field by field (see paxlike.pax.optimizers.ShardedAdafactor)."""

  decay_method: str = "adam"
  decay_adam: float = 0.99
  decay_pow: float = 0.0
  beta1: float = 0.0
  clip_threshold: float | None = 1.0
  factored: bool = True
  epsilon1_grad_sq_reg: float = 1e-30
  quantized_dtype: str = "int8"
  sort_factored_second_moment_dims: bool = False
  min_dim_size_to_factor: int = 128
  multiply_by_parameter_scale: bool = False
  epsilon2_param_scale_reg: float = 1e-3
  weight_decay: float | None = None
  layerwise_adaptation: bool = False
  maybe_inf_to_nan: bool = True


def _rms(x: jax.Array) -> jax.Array:
  return jnp.sqrt(jnp.mean(jnp.square(x)))


def _quantize(x: jax.Array, dtype: Any) -> tuple[jax.Array, jax.Array]:
  """Symmetric per-column quantization: (ints, bucket size per column) as praxis stores m."""
  buckets = 127.0 if dtype == jnp.int8 else 32767.0
  size = jnp.max(jnp.abs(x), axis=0) / buckets
  safe = jnp.where(size > 0, size, 1.0)
  return jnp.round(x / safe[None]).astype(dtype), size


def sharded_adafactor(schedule: optax.Schedule,
                      s: AdafactorSettings) -> optax.GradientTransformation:
  """praxis's sharded Adafactor (Shazeer & Stern 2018) as an optax transformation.

  Per parameter: squared gradients (+ epsilon1) averaged into factored row /
  column statistics (matrices) or a full one, decayed as Adam's bias-corrected
  beta2 (decay_method 'adam') or 1 - (t+1)^-decay_pow ('pow'); the scaled
  gradient's RMS capped at clip_threshold; times the learning rate (and the
  parameter's RMS with multiply_by_parameter_scale); momentum beta1 (stored in
  quantized_dtype); plus weight_decay x lr x the parameter.
  """
  qdtype = jnp.dtype(s.quantized_dtype)
  quantized = jnp.issubdtype(qdtype, jnp.integer)

  def factored_dims(shape: tuple[int, ...]) -> tuple[int, int] | None:
    if not s.factored or len(shape) < 2:
      return None
    if not s.sort_factored_second_moment_dims:
      return len(shape) - 1, len(shape) - 2
    order = sorted(range(len(shape)), key=lambda i: -shape[i])
    if shape[order[1]] < s.min_dim_size_to_factor:
      return None
    return order[0], order[1]

  def one() -> jax.Array:
    return jnp.zeros((1,), jnp.float32)

  def init(params: Any) -> AdafactorState:
    def m(p):
      if not s.beta1:
        return one()
      return jnp.zeros(p.shape, qdtype if (p.ndim >= 1 or not quantized) else jnp.float32)

    def m_scale(p):
      return jnp.zeros(p.shape[1:], jnp.float32) if s.beta1 and quantized and p.ndim else one()

    def reduced(p, which):
      dims = factored_dims(p.shape)
      if dims is None:
        return one()
      return jnp.zeros(tuple(d for i, d in enumerate(p.shape) if i != dims[which]), jnp.float32)

    def v(p):
      return one() if factored_dims(p.shape) else jnp.zeros(p.shape, jnp.float32)

    tm = jax.tree.map
    return AdafactorState(jnp.zeros([], jnp.int32), tm(m, params), tm(m_scale, params),
                          tm(lambda p: reduced(p, 0), params), tm(lambda p: reduced(p, 1), params),
                          tm(v, params))

  def nan_inf(x: jax.Array) -> jax.Array:
    return jnp.where(jnp.isinf(x), jnp.nan, x) if s.maybe_inf_to_nan else x

  def update(grads: Any, state: AdafactorState, params: Any = None) -> tuple[Any, AdafactorState]:
    if params is None:
      raise ValueError("sharded_adafactor needs the parameters in update().")
    count = state.count
    t = count.astype(jnp.float32) + 1.0
    if s.decay_method == "adam":
      decay = s.decay_adam * (1.0 - s.decay_adam ** (t - 1.0)) / (1.0 - s.decay_adam ** t)
    else:
      decay = 1.0 - t ** (-s.decay_pow)
    lr = schedule(count)

    def one_param(g, p, m, m_scale, vr, vc, v):
      g = nan_inf(g.astype(jnp.float32))
      g2 = jnp.square(g) + s.epsilon1_grad_sq_reg
      scale = lr * jnp.maximum(_rms(p), s.epsilon2_param_scale_reg) if (
          s.multiply_by_parameter_scale) else lr
      dims = factored_dims(p.shape)
      if dims is not None:
        r_axis, c_axis = dims
        vr = decay * vr + (1.0 - decay) * nan_inf(jnp.mean(g2, axis=r_axis))
        vc = decay * vc + (1.0 - decay) * nan_inf(jnp.mean(g2, axis=c_axis))
        r = 1.0 / jnp.sqrt(vr / jnp.mean(vr, axis=-1, keepdims=True))
        x = g * jnp.expand_dims(r, r_axis) * jnp.expand_dims(1.0 / jnp.sqrt(vc), c_axis)
      else:
        v = decay * v + (1.0 - decay) * g2
        x = g / jnp.sqrt(v)
      if s.clip_threshold is not None:
        x = x / nan_inf(jnp.maximum(1.0, _rms(x) / s.clip_threshold))
      sub = scale * x
      if s.beta1:
        if quantized and p.ndim:
          old = m.astype(jnp.float32) * m_scale[None]
        else:
          old = m.astype(jnp.float32)
        sub = nan_inf(s.beta1 * old + (1.0 - s.beta1) * sub)
        if quantized and p.ndim:
          m, m_scale = _quantize(sub, qdtype)
        else:
          m = sub.astype(m.dtype)
      if s.weight_decay is not None:
        sub = sub + s.weight_decay * lr * p
      if s.layerwise_adaptation:
        w_norm = _rms(p)
        g_norm = _rms(sub / scale) + s.epsilon1_grad_sq_reg
        sub = sub * jnp.where((w_norm > 0) & (g_norm > 0), w_norm / g_norm, 1.0)
      return (-sub).astype(p.dtype), m, m_scale, vr, vc, v

    out = jax.tree.map(one_param, grads, params, state.m, state.m_scale, state.vr, state.vc,
                       state.v)
    treedef = jax.tree.structure(grads)
    fields = list(zip(*treedef.flatten_up_to(out), strict=True))
    trees = [jax.tree.unflatten(treedef, f) for f in fields]
    return trees[0], AdafactorState(count + 1, *trees[1:])

  return optax.GradientTransformation(init, update)
