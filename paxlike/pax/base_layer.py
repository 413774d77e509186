"""praxis.base_layer: WeightInit, and BaseLayer for a Pax user's own layers.

`model_p.params_init = WeightInit.Gaussian(0.006)` (Pax's GPT-3) or
`lm_tpl.softmax_tpl.params_init = ...` start the LM's weights (kernels and
tables) from that distribution; biases and norm scales keep their own, as in
praxis. paxlike.models.language_model.draw_weight draws them.

A Pax experiment file that writes its own layers (paxml's mnist.py: `class
CNN(base_layer.BaseLayer)` with `setup()`, `create_child`, `create_variable`
and `self.theta.w`) subclasses BaseLayer here: a flax.linen module with
praxis's fields and methods. What it keeps from praxis, and what it changes:

- Template fields (`template_field(Cls)`, or a field annotated
  `pax_fiddle.Config[...]`) stay configs when the experiment's task is built
  (praxis's DoNotBuild); the layer builds them itself with `create_child`.
- A child made by create_child / create_children takes its parent's dtype,
  fprop_dtype, params_init and mesh fields where its own are unset. Unset
  means not given: praxis also overwrote a child's dtype when it was
  float32, the default, even when set on purpose; here a given dtype stays.
- `create_variable(name, WeightHParams(shape, init, dtype))` draws the
  weight as praxis's init_var does (init_value below) into flax's `params`,
  split over the mesh axes its tensor_split_dims_mapping names (praxis layers
  pass `self.weight_split_dims_mapping.wt`), replicated where it names none.
  A non-trainable variable (`trainable=False`, praxis's NON_TRAINABLE
  collection: batch norm's moving statistics) is kept in `params` too, read
  with get_var and set with update_var; a train step stores what the pass
  set, and no optimizer touches it (paxlike.nontrainable).
- `maybe_shard(x, self.activation_split_dims_mapping.out, self.mesh_axis_names)`
  constrains an activation to that split in an SPMD step, as in praxis;
  elsewhere (pmap steps, init) x is left as it is.
- `add_summary(name, scalar)` reaches the run's summaries: the model's metrics
  carry it (base_model.BaseModel.fprop), averaged like the loss.
"""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import math
import typing
from collections.abc import Sequence
from typing import Any

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from paxlike import nontrainable
from paxlike.config import Unbuilt
from paxlike.errors import UserError
from paxlike.pax import pax_fiddle
from paxlike.pax.py_utils import NestedMap


@dataclasses.dataclass(frozen=True)
class WeightInitSpec:
  """One initializer: praxis's `method` ('gaussian', 'xavier', ...) and `scale`."""

  method: str
  scale: float

  def as_tuple(self) -> tuple[str, float]:
    return (self.method, float(self.scale))

  def __repr__(self) -> str:
    name = "".join(part.capitalize() for part in self.method.split("_"))
    return f"WeightInit.{name.replace('Fanin', 'FanIn').replace('Fanout', 'FanOut')}({self.scale})"


class WeightInit:
  """praxis's initializer constructors (paxlike's LM takes the first four)."""

  @staticmethod
  def Gaussian(scale: float = 1.0) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("gaussian", scale)

  @staticmethod
  def Uniform(scale: float = 1.0) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("uniform", scale)

  @staticmethod
  def Xavier(scale: float = 1.000001) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("xavier", scale)

  @staticmethod
  def Constant(scale: float = 0.0) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("constant", scale)

  @staticmethod
  def GaussianSqrtDim(scale: float = 1.0) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("gaussian_sqrt_dim", scale)

  @staticmethod
  def GaussianSqrtFanIn(scale: float = 1.0) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("gaussian_sqrt_fanin", scale)

  @staticmethod
  def GaussianSqrtFanOut(scale: float = 1.0) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("gaussian_sqrt_fanout", scale)

  @staticmethod
  def GaussianSqrtFanAvg(scale: float = 1.0) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("gaussian_sqrt_fanavg", scale)

  @staticmethod
  def UniformSqrtDim(scale: float = 1.0) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("uniform_sqrt_dim", scale)

  @staticmethod
  def UniformSqrtFanAvg(scale: float = 1.0) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("uniform_sqrt_fanavg", scale)

  @staticmethod
  def TruncatedGaussian(scale: float = 1.0) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("truncated_gaussian", scale)

  @staticmethod
  def TruncatedGaussianSqrtDim(scale: float = 1.0) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("truncated_gaussian_sqrt_dim", scale)

  @staticmethod
  def TruncatedGaussianSqrtFanIn(scale: float = 1.0) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("truncated_gaussian_sqrt_fanin", scale)

  @staticmethod
  def TruncatedGaussianSqrtFanOut(scale: float = 1.0) -> WeightInitSpec:  # noqa: N802
    return WeightInitSpec("truncated_gaussian_sqrt_fanout", scale)


_DIM = {"gaussian_sqrt_dim", "uniform_sqrt_dim", "truncated_gaussian_sqrt_dim"}
_FAN_IN = {"gaussian_sqrt_fanin", "truncated_gaussian_sqrt_fanin"}
_FAN_OUT = {"gaussian_sqrt_fanout", "truncated_gaussian_sqrt_fanout"}
_FAN_AVG = {"gaussian_sqrt_fanavg", "uniform_sqrt_fanavg"}
_GAUSSIAN = {"gaussian", "gaussian_sqrt_dim", "gaussian_sqrt_fanin", "gaussian_sqrt_fanout",
             "gaussian_sqrt_fanavg"}
_TRUNCATED = {"truncated_gaussian", "truncated_gaussian_sqrt_dim",
              "truncated_gaussian_sqrt_fanin", "truncated_gaussian_sqrt_fanout"}
INIT_METHODS = tuple(sorted(_GAUSSIAN | _TRUNCATED | {"uniform", "uniform_sqrt_dim",
                                                      "uniform_sqrt_fanavg", "constant",
                                                      "xavier"}))


def fan_in_fan_out(shape: Sequence[int], fan_in_axes: Sequence[int] | None = None,
                   fan_out_axes: Sequence[int] | None = None) -> tuple[int | None, int | None]:
  """praxis's fans: a vector's length both ways; otherwise the last two dims (or the given
  axes), times the leading (receptive field) dims when no axes are given."""
  if not shape:
    return None, None
  if len(shape) == 1:
    return shape[0], shape[0]
  receptive = 1
  if fan_in_axes is None and fan_out_axes is None:
    fan_in_axes, fan_out_axes = [-2], [-1]
    receptive = int(np.prod(shape[:-2]))
  fan_in = int(np.prod([shape[i] for i in fan_in_axes])) * receptive
  fan_out = int(np.prod([shape[i] for i in fan_out_axes])) * receptive
  return fan_in, fan_out


def init_value(spec: WeightInitSpec, shape: Sequence[int], dtype: Any, key: jax.Array,
               fan_in_axes: Sequence[int] | None = None,
               fan_out_axes: Sequence[int] | None = None) -> jax.Array:
  """A weight drawn as praxis's init_var draws it for `spec`."""
  method, scale = spec.method, spec.scale
  shape = tuple(int(d) for d in shape)
  if method in _DIM:
    scale *= 1.0 / math.sqrt(shape[0] if shape else 1)
  fan_in, fan_out = fan_in_fan_out(shape, fan_in_axes, fan_out_axes)
  if method in _FAN_IN and fan_in is not None:
    scale *= 1.0 / math.sqrt(fan_in)
  if method in _FAN_OUT and fan_out is not None:
    scale *= 1.0 / math.sqrt(fan_out)
  if method in _FAN_AVG and fan_in is not None and fan_out is not None:
    scale *= math.sqrt(2.0 / (fan_in + fan_out))
  if method in _GAUSSIAN:
    return scale * jax.random.normal(key, shape, dtype)
  if method in ("uniform", "uniform_sqrt_dim"):
    return scale * jax.random.uniform(key, shape, dtype, -1.0, 1.0)
  if method == "uniform_sqrt_fanavg":
    return math.sqrt(3) * scale * jax.random.uniform(key, shape, dtype, -1.0, 1.0)
  if method in _TRUNCATED:
    return scale * jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)
  if method == "constant":
    return scale + jnp.zeros(shape, dtype)
  if method == "xavier":
    if fan_in is None:
      raise UserError(f"WeightInit.Xavier needs a weight with dims; got shape {shape}.")
    limit = scale * math.sqrt(6.0 / (fan_in + fan_out))
    return limit * jax.random.uniform(key, shape, dtype, -1.0, 1.0)
  raise UserError(f"params_init method {method!r} is not one paxlike draws; use one of "
                  f"{list(INIT_METHODS)}.")


@dataclasses.dataclass
class WeightHParams:
  """praxis's WeightHParams: a variable's shape, initializer and dtype (None: the layer's)."""

  shape: Sequence[int]
  init: WeightInitSpec | None = None
  dtype: Any = None
  collections: Sequence[str] | None = None
  mesh_shape: Sequence[int] | None = None
  tensor_split_dims_mapping: Sequence[Any] | None = None
  repeat_prefix: Sequence[int] | None = None
  repeat_prefix_split_dims_mapping: Sequence[Any] | None = None
  repeat_optimizer_dims_mapping: Sequence[Any] | None = None
  fan_in_axes: Sequence[int] | None = None
  fan_out_axes: Sequence[int] | None = None


# ------------------------------------------------------------ template fields

_TEMPLATE = "paxlike_template"


def template_field(template: Any = None) -> Any:
  """praxis's template_field: the field holds a config (of `template`, a class or a
  config; None: no default) that the layer builds itself with create_child."""
  if template is None:
    def factory() -> Any:
      return None
  elif isinstance(template, fdl.Buildable):
    def factory() -> Any:
      return copy.deepcopy(template)
  else:
    def factory() -> Any:
      return pax_fiddle.Config(template)
  return dataclasses.field(default_factory=factory, metadata={_TEMPLATE: True})


def instance_field(default_factory: Any) -> Any:
  """praxis's instance_field: the field holds a built object; a factory that returns a
  config is built."""
  def factory() -> Any:
    value = default_factory() if callable(default_factory) else default_factory
    return fdl.build(value) if isinstance(value, fdl.Buildable) else value
  return dataclasses.field(default_factory=factory)


def _is_template_annotation(annotation: Any) -> bool:
  if isinstance(annotation, str):
    return "Config[" in annotation or annotation.strip() in ("pax_fiddle.Config", "Config")
  if annotation is pax_fiddle.Config or annotation is fdl.Config:
    return True
  origin = typing.get_origin(annotation)
  if origin is not None and isinstance(origin, type) and issubclass(origin, fdl.Buildable):
    return True
  return any(_is_template_annotation(a) for a in typing.get_args(annotation))


def template_fields(cls: type) -> set[str]:
  """The fields of a BaseLayer subclass that hold templates: made with template_field, or
  annotated as a config."""
  names = set()
  hints = {}
  for klass in reversed(cls.__mro__):
    hints.update(getattr(klass, "__annotations__", {}))
  for field in dataclasses.fields(cls):
    if field.metadata.get(_TEMPLATE) or _is_template_annotation(hints.get(field.name)):
      names.add(field.name)
  return names


def _unwrap(value: Any) -> Any:
  if isinstance(value, Unbuilt):
    return value.config
  if isinstance(value, list | tuple) and any(isinstance(v, Unbuilt) for v in value):
    return type(value)(_unwrap(v) for v in value)
  return value


# ------------------------------------------------------------------- summaries

# BaseModel.fprop collects add_summary's scalars here while its forward pass traces, with
# the task's summary_verbosity.
_SUMMARIES: contextvars.ContextVar[tuple[dict[str, Any], int] | None] = contextvars.ContextVar(
    "paxlike_pax_summaries", default=None)

# ... and update_var's moves of non-trainable variables: path -> (stored value, new value).
_MOVES: contextvars.ContextVar[dict[str, tuple[Any, Any]] | None] = contextvars.ContextVar(
    "paxlike_pax_moves", default=None)


class SummaryType:
  """praxis's summary kinds; paxlike writes scalars."""

  SCALAR = "scalar"
  IMAGE = "image"
  TEXT = "text"
  AUDIO = "audio"
  HISTOGRAM = "histogram"


class _Sharding:
  """What praxis's sharding hparams share: `wp.clone()`, as praxis's layers call it."""

  def clone(self) -> Any:
    return copy.deepcopy(self)


# The fields a child takes from its parent where its own are unset (None).
INHERITED = ("dtype", "fprop_dtype", "params_init", "skip_lp_regularization",
             "ici_mesh_shape", "dcn_mesh_shape", "mesh_axis_names", "contiguous_submeshes")


class BaseLayer(nn.Module):
  """praxis's BaseLayer on flax.linen; see the module docstring.

  Attributes (praxis's): dtype, the variables' dtype (float32 when unset and not
  inherited); fprop_dtype, the activations' (the dtype when unset); params_init,
  the initializer of variables that name none (Xavier(1.000001) when unset);
  the mesh fields, which the experiment's ICI_MESH_SHAPE decides in paxlike.
  """

  dtype: Any = None
  fprop_dtype: Any = None
  params_init: Any = None
  skip_lp_regularization: bool | None = None
  ici_mesh_shape: Sequence[int] | None = None
  dcn_mesh_shape: Sequence[int] | None = None
  contiguous_submeshes: bool | None = None
  mesh_axis_names: Sequence[str] | None = None
  shared_weight_layer_id: str | None = None
  weight_split_dims_mapping: Any = None
  activation_split_dims_mapping: Any = None

  @dataclasses.dataclass
  class WeightSharding(_Sharding):
    """praxis's BaseLayer.WeightSharding (a layer subclasses it to add its own fields):
    `self.weight_split_dims_mapping.wt` reads None unless set; praxis's layers pass it to
    create_variable, which splits the weight as it says."""

    wt: Any = None

  @dataclasses.dataclass
  class ActivationSharding(_Sharding):
    """praxis's BaseLayer.ActivationSharding: `.out` reads None unless set; praxis's layers
    pass it to maybe_shard, which constrains the activation to that split."""

    out: Any = None

  @property
  def mesh_shape(self) -> Sequence[int] | None:
    """praxis's mesh_shape: the ICI mesh times the DCN one, or None."""
    if self.ici_mesh_shape is None or self.dcn_mesh_shape is None:
      return self.ici_mesh_shape
    return [i * d for i, d in zip(self.ici_mesh_shape, self.dcn_mesh_shape, strict=True)]

  @classmethod
  def template_fields(cls) -> set[str]:
    """Fields whose configs fdl.build leaves unbuilt (paxlike.config.build asks)."""
    return template_fields(cls)

  @classmethod
  def sub_templates(cls) -> dict[str, Any]:
    """The template fields' default configs (and the sharding ones), which
    pax_fiddle.Config(cls) sets so that `model_p.network_tpl.num_classes = 5` edits one
    (praxis's configs do the same)."""
    out = {"weight_split_dims_mapping": pax_fiddle.Config(cls.WeightSharding),
           "activation_split_dims_mapping": pax_fiddle.Config(cls.ActivationSharding)}
    templates = template_fields(cls)
    for field in dataclasses.fields(cls):
      if field.name in templates and field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
        if isinstance(value, fdl.Buildable):
          out[field.name] = value
    return out

  def __post_init__(self) -> None:
    for field in dataclasses.fields(self):
      value = getattr(self, field.name, None)
      unwrapped = _unwrap(value)
      if unwrapped is not value:
        object.__setattr__(self, field.name, unwrapped)
    object.__setattr__(self, "_unset", tuple(f for f in INHERITED if getattr(self, f) is None))
    if self.dtype is None:
      object.__setattr__(self, "dtype", jnp.float32)
    if self.fprop_dtype is None:
      object.__setattr__(self, "fprop_dtype", self.dtype)
    if self.params_init is None:
      object.__setattr__(self, "params_init", WeightInit.Xavier())
    for name, cls in (("weight_split_dims_mapping", type(self).WeightSharding),
                      ("activation_split_dims_mapping", type(self).ActivationSharding)):
      value = getattr(self, name)
      if value is None or isinstance(value, fdl.Buildable):
        object.__setattr__(self, name, cls() if value is None else fdl.build(value))
    if self.shared_weight_layer_id:
      raise UserError(f"{type(self).__name__}.shared_weight_layer_id = "
                      f"{self.shared_weight_layer_id!r}: paxlike does not share weights between "
                      "layers by id; drop it.")
    super().__post_init__()

  # ------------------------------------------------------------ children

  @nn.nowrap
  def create_child(self, name: str, params: Any, *, skip_clone: bool = False) -> Any:
    """Builds the config (or copies the layer) `params` as the child `name`."""
    del skip_clone
    child = self._make_child(params)
    setattr(self, name, child)
    return getattr(self, name)

  @nn.nowrap
  def create_children(self, name: str, params: Sequence[Any], *,
                      skip_clone: bool = False) -> list[Any]:
    """The configs `params` built as the children name_0, name_1, ..."""
    del skip_clone
    setattr(self, name, [self._make_child(p) for p in params])
    return getattr(self, name)

  @nn.nowrap
  def _make_child(self, params: Any) -> Any:
    if isinstance(params, fdl.Buildable):
      cfg = copy.deepcopy(params)
      target = fdl.get_callable(cfg)
      twin = vars(target).get("runnable_twin") if isinstance(target, type) else None
      if twin is not None:  # a praxis LM tree node whose runnable layer is another class
        cfg, target = _as_twin(cfg, twin), twin
      if isinstance(target, type) and issubclass(target, BaseLayer):
        for field in INHERITED:
          if getattr(cfg, field, None) is None:
            setattr(cfg, field, copy.deepcopy(getattr(self, field)))
      if "name" in cfg.__arguments__:
        del cfg.name  # the child's name is the one create_child gives it
      return pax_fiddle.build(cfg)
    if isinstance(params, BaseLayer):
      updates = {f: copy.deepcopy(getattr(self, f)) for f in params._unset}
      return params.clone(parent=None, name=None, **updates)
    if isinstance(params, nn.Module):
      return params.clone(parent=None, name=None)
    if params is None or (callable(params) and not isinstance(params, type)):
      return params  # a built activation (or None, where a template field holds none)
    raise UserError(f"{type(self).__name__}: create_child got {type(params).__name__}, not "
                    "the config of a layer.")

  # ----------------------------------------------------------- variables

  @nn.nowrap
  def create_variable(self, name: str, var_hparams: WeightHParams,
                      trainable: bool = True) -> jax.Array:
    """Creates the variable `name` (praxis's create_variable); self.theta.<name> reads it."""
    where = f"{type(self).__name__}.create_variable({name!r})"
    if var_hparams.repeat_prefix:
      raise UserError(f"{where}: repeat_prefix is not run by paxlike; create one variable "
                      "per layer.")
    init = var_hparams.init if var_hparams.init is not None else self.params_init
    dtype = var_hparams.dtype if var_hparams.dtype is not None else self.dtype
    if init.method not in INIT_METHODS:
      raise UserError(f"{where}: params_init method {init.method!r} is not one paxlike draws; "
                      f"use one of {list(INIT_METHODS)}.")
    shape = tuple(int(d) for d in var_hparams.shape)

    def draw(key: jax.Array) -> jax.Array:
      return init_value(init, shape, dtype, key, var_hparams.fan_in_axes,
                        var_hparams.fan_out_axes)

    split = self._split_names(where, shape, var_hparams.tensor_split_dims_mapping)
    value = self.param(name, draw if split is None else nn.with_logical_partitioning(draw, split))
    if not trainable:
      # praxis's NON_TRAINABLE collection: kept in params beside the weights, read without
      # a gradient, moved by update_var (paxlike.nontrainable says how).
      nontrainable.declare("/".join((*self.scope.path, name)))
      kept = self.__dict__.get("_var_values")
      if kept is None:
        kept = {}
        object.__setattr__(self, "_var_values", kept)
      kept[name] = [value, nontrainable.frozen(value)]  # [as stored, as read now]
      return kept[name][1]
    theta = self.__dict__.get("_theta_values")
    if theta is None:
      theta = NestedMap()
      object.__setattr__(self, "_theta_values", theta)
    theta[name] = value
    return value

  @nn.nowrap
  def _split_names(self, where: str, shape: tuple[int, ...], mapping: Any
                   ) -> tuple[str | None, ...] | None:
    """praxis's tensor_split_dims_mapping as logical names that are the mesh axes themselves
    (paxlike.mesh.DIRECT); None where it splits nothing. An entry is a mesh axis name, a
    tuple of them, an index into the layer's mesh_axis_names, or None / -1 (not split)."""
    if mapping is None or all(d in (-1, None) for d in mapping):
      return None
    from paxlike import mesh as mesh_lib

    axes = tuple(self.mesh_axis_names or mesh_lib.MESH_AXES)
    if len(mapping) != len(shape):
      raise UserError(f"{where}: tensor_split_dims_mapping {tuple(mapping)} has "
                      f"{len(mapping)} entries for a weight of shape {shape}.")
    try:
      return tuple(mesh_lib.direct_name(split, axes) if split else None
                   for split in split_axes(mapping, axes))
    except (IndexError, UserError) as e:
      why = str(e).rstrip(".") if isinstance(e, UserError) else "an index past the mesh's axes"
      raise UserError(f"{where}: tensor_split_dims_mapping {tuple(mapping)}: {why} "
                      f"(mesh axes {', '.join(axes)}).") from None

  @property
  def theta(self) -> NestedMap:
    """The variables this layer created, by name, floating ones cast to fprop_dtype
    (praxis's self.theta)."""
    values = self.__dict__.get("_theta_values") or {}
    return NestedMap({k: v.astype(self.fprop_dtype)
                      if jnp.issubdtype(v.dtype, jnp.floating) else v
                      for k, v in values.items()})

  @nn.nowrap
  def get_var(self, name: str) -> jax.Array:
    """The non-trainable variable `name` (create_variable(..., trainable=False)) as this pass
    last set it (praxis's get_var); no gradient reaches the stored value."""
    kept = self.__dict__.get("_var_values") or {}
    if name not in kept:
      raise UserError(f"{type(self).__name__}.get_var({name!r}): no non-trainable variable "
                      f"of that name; create it with create_variable({name!r}, ..., "
                      "trainable=False).")
    return kept[name][1]

  @nn.nowrap
  def update_var(self, name: str, new_val: jax.Array) -> None:
    """Sets the non-trainable variable `name` (praxis's update_var): get_var reads new_val
    for the rest of this pass, and a train step stores it (the step's batches' mean where
    microbatches or pmap devices each set one)."""
    self.get_var(name)  # the line for a name that is not one
    entry = self.__dict__["_var_values"][name]
    entry[1] = new_val
    moves = _MOVES.get()
    if moves is not None:
      moves["/".join((*self.scope.path, name))] = (entry[0], new_val)

  # ----------------------------------------------------------- summaries

  @nn.nowrap
  def add_summary(self, name: str, tensor: Any, summary_type: str = SummaryType.SCALAR,
                  verbosity: int = 2) -> None:
    """Adds a scalar to the run's summaries (praxis's add_summary; written as the model's
    metric `name` where verbosity is at most the task's summary_verbosity)."""
    current = _SUMMARIES.get()
    if current is None or verbosity > current[1]:
      return  # outside a model's forward pass (init, decode), or more verbose than wanted
    sink = current[0]
    if callable(tensor):
      tensor = tensor()
    if summary_type != SummaryType.SCALAR or jnp.ndim(tensor) != 0:
      raise UserError(f"{type(self).__name__}.add_summary({name!r}): paxlike writes scalar "
                      f"summaries; got a {summary_type} of shape {jnp.shape(tensor)}.")
    key, n = name, 1
    while key in sink:
      key, n = f"{name}{n}", n + 1
    sink[key] = jnp.asarray(tensor, jnp.float32)

  @nn.nowrap
  def add_aux_loss(self, name: str, value: Any, weight: Any = None) -> None:
    raise UserError(f"{type(self).__name__}.add_aux_loss({name!r}): paxlike adds no auxiliary "
                    "losses to a Pax model's; add it to compute_loss's loss instead.")

  @property
  def do_eval(self) -> bool:
    """Whether this pass evaluates (praxis's do_eval): the train step alone passes the
    'dropout' key, so eval, init and decode passes are eval."""
    return self.scope is None or not self.has_rng("dropout")

  @nn.nowrap
  def next_prng_key(self, name: str = "random") -> jax.Array:
    """A fresh key (praxis's 'random' stream is paxlike's 'dropout' stream)."""
    return self.make_rng("dropout" if name == "random" else name)


LayerTpl = pax_fiddle.Config


def _as_twin(cfg: fdl.Buildable, twin: type) -> fdl.Buildable:
  """The config of a praxis tree node (paxlike.pax.praxis_layers: FullSoftmax) as the
  config of its runnable twin, with the same arguments and sharding mappings."""
  args = dict(cfg.__arguments__)
  for key, sharding in (("weight_split_dims_mapping", twin.WeightSharding),
                        ("activation_split_dims_mapping", twin.ActivationSharding)):
    value = args.pop(key, None)
    fields = value.__arguments__ if isinstance(value, fdl.Buildable) else {}
    if any(v is not None for v in fields.values()):
      args[key] = pax_fiddle.Config(sharding, **fields)
  try:
    return pax_fiddle.Config(twin, **args)
  except (TypeError, ValueError) as e:
    raise UserError(f"{fdl.get_callable(cfg).__name__}, built as a layer: {e}") from None


def split_axes(mapping: Sequence[Any], axes: Sequence[str]) -> list[tuple[str, ...]]:
  """praxis's split dims mapping, dim by dim, as the mesh axis names each dim is split over:
  () for None or -1; a name, a tuple of names, or an index into `axes` (IndexError past
  them) otherwise."""
  out = []
  for entry in mapping:
    if entry is None or entry == -1:
      out.append(())
      continue
    entries = entry if isinstance(entry, tuple | list) else (entry,)
    out.append(tuple(axes[e] if isinstance(e, int) else e for e in entries))
  return out


def maybe_shard(x: jax.Array, split_dims_mapping: Any = None,
                mesh_axis_names: Any = None, unconstrained_dims: Sequence[int] | None = None
                ) -> jax.Array:
  """praxis's maybe_shard: x constrained to the split its mapping names (an entry per dim: a
  mesh axis name, a tuple of them, an index into mesh_axis_names, or None / -1 for none).

  As in praxis, nothing happens without a mapping or mesh_axis_names. It also leaves x as it
  is outside an SPMD trace (pmap steps, init): only a mesh being traced over can place it.
  unconstrained_dims are left to XLA's propagation.
  """
  if split_dims_mapping is None or mesh_axis_names is None:
    return x
  if len(split_dims_mapping) != x.ndim:
    raise UserError(f"maybe_shard: split dims mapping {tuple(split_dims_mapping)} has "
                    f"{len(split_dims_mapping)} entries for an activation of shape {x.shape}.")
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  axes = tuple(mesh_axis_names)
  try:
    splits = split_axes(split_dims_mapping, axes)
  except IndexError:
    raise UserError(f"maybe_shard: split dims mapping {tuple(split_dims_mapping)} has an "
                    f"index past mesh_axis_names {list(axes)}.") from None
  unknown = [n for split in splits for n in split if n not in mesh.axis_names]
  if unknown:
    raise UserError(f"maybe_shard: split dims mapping {tuple(split_dims_mapping)} names "
                    f"{unknown[0]!r}, not an axis of the mesh ({', '.join(mesh.axis_names)}).")
  parts = [None if not split else split[0] if len(split) == 1 else split for split in splits]
  for dim in unconstrained_dims or ():
    parts[dim] = jax.sharding.PartitionSpec.UNCONSTRAINED
  return jax.lax.with_sharding_constraint(x, jax.sharding.PartitionSpec(*parts))


__all__ = ["INIT_METHODS", "BaseLayer", "LayerTpl", "SummaryType", "WeightHParams", "WeightInit",
           "WeightInitSpec", "fan_in_fan_out", "init_value", "instance_field", "maybe_shard",
           "template_field"]
