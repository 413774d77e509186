"""BaseExperiment: hyperparameters as UPPERCASE class attributes.

Also: `--set KEY=VALUE` overrides with type checks, and the dump of every
hyperparameter with the class (or `--set`) it came from.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from typing import Any

import numpy as np

from paxlike.errors import UserError

SET_SOURCE = "--set"


class BaseExperiment:
  """Base of every experiment. Subclass, set UPPERCASE attributes, register.

  Derived values belong inside task()/datasets(), computed from `self.X`, so
  a `--set` override of X reaches them.
  """

  # Mesh: None selects the pmap loop; a 3-list [replica, data, mdl] SPMD.
  ICI_MESH_SHAPE: list[int] | None = None
  DCN_MESH_SHAPE: list[int] | None = None
  # XLA flags on top of paxlike's platform presets, per platform ('cpu', 'gpu',
  # 'tpu' or 'all'): {"gpu": {"xla_gpu_enable_triton_gemm": True}}; None as a
  # value drops a preset flag. Flags exported in XLA_FLAGS/LIBTPU_INIT_ARGS win.
  XLA_FLAGS_OVERRIDES: dict[str, dict[str, Any]] | None = None
  # --pgle: how many steps are profiled, and which percentile of the measured
  # latencies auto PGLE compiles with.
  PGLE_PROFILING_RUNS = 3
  PGLE_AGGREGATION_PERCENTILE = 90
  # SPMD: also shard the activations' embed dim over 'mdl' (Pax's name and idea;
  # see paxlike.mesh.TRAINING_OPTIMIZED_RULES).
  TRAINING_OPTIMIZED_SHARDING = False
  # Initial weights for a run with no checkpoint of its own (paxlike.initial):
  # "hf:/path/to/flan-t5-base", "paxlike:JOB_LOG_DIR[@STEP]"; --init_from overrides
  # it. Rules map this model's parameter names (regex) to the source's, or to None
  # (fresh init); strict: an unmapped or missing parameter is an error.
  INIT_FROM: str | None = None
  INIT_FROM_RULES: list[tuple[str, str | None]] | None = None  # None: the same names
  INIT_FROM_STRICT = True
  INIT_FROM_OPTIMIZER = False  # also take the source's optimizer state (paxlike sources)

  def __init__(self) -> None:
    self._overrides: dict[str, Any] = {}

  def task(self) -> Any:
    """A fiddle config of the task: model + learner + train settings."""
    raise NotImplementedError(f"{type(self).__name__} must define task().")

  def datasets(self) -> list[Any]:
    """Fiddle configs of BaseInput subclasses: training first, then eval."""
    raise NotImplementedError(f"{type(self).__name__} must define datasets().")

  def decode_datasets(self) -> list[Any]:
    """Fiddle configs of BaseInput subclasses to decode; may be empty."""
    return []

  def validate(self) -> None:
    """Raises UserError when the hyperparameters do not fit together."""
    for name in ("ICI_MESH_SHAPE", "DCN_MESH_SHAPE"):
      shape = getattr(self, name)
      if shape is None:
        continue
      if (not isinstance(shape, list | tuple) or len(shape) != 3
          or not all(isinstance(d, int) and d > 0 for d in shape)):
        raise UserError(
            f"{name} must be a list of three positive ints [replica, data, mdl], "
            f"got {shape!r}.")
    if self.ICI_MESH_SHAPE is None and self.DCN_MESH_SHAPE is not None:
      raise UserError("DCN_MESH_SHAPE is set but ICI_MESH_SHAPE is None; set ICI_MESH_SHAPE "
                      "for an SPMD run or clear DCN_MESH_SHAPE for pmap.")

  @property
  def overrides(self) -> dict[str, Any]:
    return dict(self._overrides)


def is_hparam(name: str) -> bool:
  return name.isupper() and not name.startswith("_")


@dataclass(frozen=True)
class HParam:
  name: str
  value: Any
  source: str  # the defining class's qualified name, or "--set"


def hparams(exp: BaseExperiment) -> list[HParam]:
  """Every UPPERCASE attribute of exp with its value and provenance."""
  cls = type(exp)
  out = {}
  for klass in reversed(cls.__mro__):
    for name, value in vars(klass).items():
      # dtypes (jnp.float32, ...) and classes (ACTIVATION_CLS = layers.GELU) are callable
      # but are hyperparameters, not methods.
      if is_hparam(name) and (_is_dtype_like(value) or isinstance(value, type)
                              or not callable(value)):
        out[name] = HParam(name, getattr(exp, name), f"{klass.__module__}.{klass.__qualname__}")
  for name, value in getattr(exp, "_overrides", {}).items():
    out[name] = HParam(name, value, SET_SOURCE)
  return sorted(out.values(), key=lambda h: h.name)


def format_hparams(exp: BaseExperiment) -> str:
  """experiment_cls_vars.txt: grouped by the class (or --set) that defines each."""
  groups: dict[str, list[HParam]] = {}
  for h in hparams(exp):
    groups.setdefault(h.source, []).append(h)
  order = [f"{k.__module__}.{k.__qualname__}" for k in reversed(type(exp).__mro__)]
  order.append(SET_SOURCE)
  lines = [f"# experiment: {type(exp).__module__}.{type(exp).__qualname__}"]
  for source in order:
    if source not in groups:
      continue
    lines.append(f"\n# from {source}")
    lines.extend(f"{h.name} : {_show(h.value)}" for h in groups[source])
  return "\n".join(lines) + "\n"


def _show(value: Any) -> str:
  if _is_dtype_like(value):
    return np.dtype(value).name
  if isinstance(value, type):
    return f"{value.__module__}.{value.__qualname__}"
  return repr(value)


def _is_dtype_like(value: Any) -> bool:
  if isinstance(value, np.dtype):
    return True
  if isinstance(value, type):
    # numpy scalar types (np.float32, ml_dtypes.bfloat16) and jnp's (jnp.bfloat16).
    return issubclass(value, np.generic) or isinstance(getattr(value, "dtype", None), np.dtype)
  return False


def parse_override(text: str) -> tuple[str, str]:
  if "=" not in text:
    raise UserError(f"--set {text!r} has no '='; write --set KEY=VALUE.")
  key, value = text.split("=", 1)
  return key.strip(), value.strip()


def _convert_named(key: str, raw: str, current: Any) -> Any:
  """A class or enum member by (dotted) name: ACTIVATION_CLS=GELU or =layers.GELU; an
  AutodiffCheckpointType member by its name (layers.AutodiffCheckpointType.SAVE_NOTHING)."""
  import enum

  from paxlike.layers import activations

  name = raw.rsplit(".", 1)[-1].strip()
  if isinstance(current, enum.Enum):
    choices = {m.name: m for m in type(current)}
  else:
    choices = {c.__name__: c for c in vars(activations).values()
               if isinstance(c, type) and issubclass(c, activations.BaseActivation)
               and c is not activations.BaseActivation}
  by_lower = {k.lower(): v for k, v in choices.items()}
  if name.lower() in by_lower:
    return by_lower[name.lower()]
  raise UserError(f"--set {key}={raw}: {name!r} is not one of {', '.join(sorted(choices))}.")


def _convert(key: str, raw: str, current: Any) -> Any:
  """Parses raw as a Python literal and checks it against current's type.

  A dtype attribute takes a dtype name; an activation class or an enum member
  takes its name (see _convert_named).
  """
  import enum

  from paxlike.layers import activations

  if (isinstance(current, type) and issubclass(current, activations.BaseActivation)) or (
      isinstance(current, enum.Enum)):
    return _convert_named(key, raw, current)
  if _is_dtype_like(current):
    try:
      import ml_dtypes  # noqa: F401  (registers bfloat16 & friends with numpy)
      return np.dtype(raw).type if raw else current
    except TypeError:
      raise UserError(f"--set {key}={raw}: {raw!r} is not a dtype name; "
                      "use e.g. float32 or bfloat16.") from None
  try:
    value = ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    if isinstance(current, str) or current is None:
      return raw  # a bare word for a string attribute
    raise UserError(f"--set {key}={raw}: {raw!r} is not a Python literal; "
                    f"{key} expects {type(current).__name__}.") from None
  if current is None:
    return value
  ok = isinstance(value, type(current))
  if isinstance(current, bool) or isinstance(value, bool):
    ok = isinstance(value, bool) and isinstance(current, bool)
  elif isinstance(current, float) and isinstance(value, int):
    value, ok = float(value), True
  elif isinstance(current, list | tuple) and isinstance(value, list | tuple):
    value, ok = type(current)(value), True
  if not ok:
    raise UserError(f"--set {key}={raw}: {key} expects {type(current).__name__} "
                    f"(it is {current!r}), got {type(value).__name__}.")
  return value


def apply_overrides(exp: BaseExperiment, overrides: list[str]) -> None:
  """Applies `KEY=VALUE` strings to exp as instance attributes.

  Raises:
    UserError: an unknown key (with a did-you-mean), or a value of the wrong type.
  """
  known = {h.name: h.value for h in hparams(exp)}
  for text in overrides:
    key, raw = parse_override(text)
    if key not in known:
      close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
      hint = f" Did you mean {' or '.join(close)}?" if close else ""
      raise UserError(f"--set {key}: {type(exp).__name__} has no hyperparameter {key}.{hint}")
    value = _convert(key, raw, known[key])
    setattr(exp, key, value)
    exp._overrides[key] = value
    known[key] = value


def instantiate(cls: type, overrides: list[str] = ()) -> BaseExperiment:
  """Creates the experiment, applies overrides and validates it."""
  exp = cls()
  if not isinstance(exp, BaseExperiment):
    raise UserError(f"{cls.__qualname__} is not a BaseExperiment subclass.")
  apply_overrides(exp, list(overrides))
  exp.validate()
  return exp
