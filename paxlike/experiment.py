"""BaseExperiment: hyperparameters as UPPERCASE class attributes.

Also: `--set KEY=VALUE` overrides with type checks (and `--set a.b=VALUE` into
the built task config), the dump of every hyperparameter with the class (or
`--set`) it came from, and the check that every hyperparameter a user wrote
was read (nothing is silently ignored).
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import functools
import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import fiddle as fdl
import numpy as np
from absl import logging

from paxlike import knob_branches, registry
from paxlike import mesh as mesh_lib
from paxlike.errors import UserError, counted, user_frame

SET_SOURCE = "--set"
JOB_SOURCE = "the job's training run (--set, run_env.json)"  # what a later run takes (main)
# int hyperparameters that Pax also allows as fractions.
FRACTIONAL_HPARAMS = ("PERCORE_BATCH_SIZE", "PERCORE_EVAL_BATCH_SIZE")


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
  # Trace this many training steps, from step PROFILER_CAPTURE_STEP (0: the
  # default, 3), into job_log_dir/profile (paxlike.profiler); --profile_steps and
  # --profile_start_step win. None or 0: no trace.
  PROFILER_NUM_STEPS: int | None = None
  PROFILER_CAPTURE_STEP = 0
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
  # Attention (Pax's switches; paxlike.layers.attention): None picks per platform
  # (cuDNN's fused kernel on CUDA for bf16/fp16, XLA elsewhere); True asks for the
  # fused kernel wherever it can run; False keeps XLA everywhere. The first one set wins.
  USE_CUDNN_FLASH_ATTENTION: bool | None = None
  USE_FLASH_ATTENTION: bool | None = None

  def __init__(self) -> None:
    self._overrides: dict[str, Any] = {}

  def __getattribute__(self, name: str) -> Any:
    # Records every UPPERCASE hyperparameter read, so that a run can refuse the
    # ones nothing reads (check_all_read).
    if name[:1] != "_" and name.isupper():
      reads = object.__getattribute__(self, "__dict__").get("_hparam_reads")
      if reads is not None:
        reads.add(name)
    return object.__getattribute__(self, name)

  def not_used(self, *names: str, reason: str, config: str | None = None) -> None:
    """Declares these hyperparameters consulted but not used in this configuration.

    A template calls this for knobs that legitimately do nothing here (the
    other schedule's LR_* when LR_SCHEDULE picks one): set on a class they
    pass the read check with a warning that gives the reason; set by `--set`
    they are refused with it, since the user asked for something that has no
    effect. config: the task's sub-config they would feed (a dotted path,
    "train.learner.optimizer"); where the user's task() replaces it with
    another class's, that replacement is the reason given instead.
    """
    unused = self.__dict__.setdefault("_hparam_unused", {})
    for name in names:
      unused[name] = (reason, config)

  def task(self) -> Any:
    """A fiddle config of the task: model + learner + train settings."""
    raise NotImplementedError(f"{type(self).__name__} must define task().")

  def datasets(self) -> list[Any]:
    """Fiddle configs of BaseInput subclasses: training first, then eval."""
    raise NotImplementedError(f"{type(self).__name__} must define datasets().")

  def decode_datasets(self) -> list[Any]:
    """Fiddle configs of BaseInput subclasses to decode; may be empty (by default, Pax's
    older name for them, decoder_datasets())."""
    return self.decoder_datasets()

  def decoder_datasets(self) -> list[Any]:
    """Pax's older name of decode_datasets (a file that defines it is read through it)."""
    return []

  def get_input_specs_provider_params(self) -> Any:
    """Pax's: the config of a BaseInputSpecsProvider (paxlike.pax.base_input) whose
    get_input_specs() gives the batch shapes the model initialises from, per process under
    SPMD and per device under pmap. None (the default) means the training input's, as
    Pax's default does. A run with no training input reads it: an eval- or decode-only
    experiment overrides it (with a training input, paxlike takes that input's shapes)."""
    return None

  def training_dataset(self) -> Any:
    """Pax's: the config of the one training input in datasets()."""
    train = [c for c in self.datasets() if getattr(input_config(c), "is_training", True)]
    if len(train) != 1:
      raise UserError(f"{type(self).__name__}.datasets() has {len(train)} inputs with "
                      "is_training=True; training_dataset() needs exactly one.")
    return train[0]

  def validate(self) -> None:
    """Raises UserError when the hyperparameters do not fit together."""
    pipelined = self.pipelined_mesh()
    for name in ("ICI_MESH_SHAPE", "DCN_MESH_SHAPE"):
      shape = getattr(self, name)
      if shape is None:
        continue
      if (not isinstance(shape, list | tuple) or len(shape) not in ((4, 5) if pipelined else (3, 4))
          or not all(isinstance(d, int) and d > 0 for d in shape)):
        names = ("four positive ints [stage, replica, data, mdl] (or five with expert "
                 "parallelism, [stage, replica, data, data_expert, mdl])" if pipelined else
                 "three positive ints [replica, data, mdl] (or four for expert parallelism, "
                 "[replica, data, data_expert, mdl])")
        raise UserError(f"{name} must be a list of {names}, got {shape!r}.")
    ici, dcn = self.ICI_MESH_SHAPE, self.DCN_MESH_SHAPE
    if ici is not None and dcn is not None and len(ici) != len(dcn):
      four = ("" if pipelined else
              " (four axes here are expert parallelism's [replica, data, data_expert, mdl]; "
              "a pipeline's [stage, replica, data, mdl] needs a "
              "TransformerLmSpmdPipelineAdafactor / Adam or LlamaSpmdPipelineAdam experiment "
              "with NUM_STAGES)")
      raise UserError(f"ICI_MESH_SHAPE={list(ici)} and DCN_MESH_SHAPE={list(dcn)} have "
                      f"different numbers of axes; give both the same{four}.")
    if pipelined and self.ICI_MESH_SHAPE is not None:
      stages = self.ICI_MESH_SHAPE[0] * (self.DCN_MESH_SHAPE or [1])[0]
      if stages != getattr(self, "NUM_STAGES", None):
        raise UserError(
            f"the mesh's stage axis (ICI_MESH_SHAPE[0] x DCN_MESH_SHAPE[0] = {stages}) is not "
            f"NUM_STAGES={getattr(self, 'NUM_STAGES', None)}; make them equal.")
    if self.ICI_MESH_SHAPE is None and self.DCN_MESH_SHAPE is not None:
      raise UserError("DCN_MESH_SHAPE is set but ICI_MESH_SHAPE is None; set ICI_MESH_SHAPE "
                      "for an SPMD run or clear DCN_MESH_SHAPE for pmap.")

  def pipelined_mesh(self) -> bool:
    """Whether this experiment's meshes are a pipeline's ([stage, replica, data, mdl])."""
    return False

  def mesh_axis_names(self) -> tuple[str, ...]:
    """The mesh's axis names: Pax's [replica, data, mdl]; four axes are a pipeline's
    [stage, replica, data, mdl] or, otherwise, expert parallelism's
    [replica, data, data_expert, mdl] (Pax's only other 4-axis mesh); five, a pipeline's
    with expert parallelism [stage, replica, data, data_expert, mdl]."""
    shape = self.ICI_MESH_SHAPE if self.ICI_MESH_SHAPE is not None else self.DCN_MESH_SHAPE
    if self.pipelined_mesh() and len(shape or ()) != len(mesh_lib.PIPELINE_EXPERT_MESH_AXES):
      return mesh_lib.PIPELINE_MESH_AXES
    return mesh_lib.axes_for(shape or (), pipelined=False)

  def axis_rules(self, rules: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    """The logical-axis rules this experiment shards by, given its mesh's
    (paxlike.mesh.rules_for): those, here; a template that places some dims itself
    (a pipeline's EMB_W_DATA_DIMS, the MLP classifier's weight mappings) changes them."""
    return rules

  @property
  def overrides(self) -> dict[str, Any]:
    return dict(self._overrides)


class PaxAlias(property):
  """pax_alias's property; pax_name is the Pax hyperparameter it reads."""

  pax_name = ""


def pax_alias(name: str, pax_name: str, convert: Callable[[Any], Any] | None = None
              ) -> PaxAlias:
  """A hyperparameter paxlike reads under its own name that a template takes from Pax's
  (the MLP classifier's ICI_MESH_SHAPE is Pax's MESH_SHAPE; BERT's FPROP_DTYPE follows
  ENABLE_BFLOAT16): reading gives Pax's value (through convert, if given); a --set of it
  is refused, naming Pax's."""

  def get(self: Any) -> Any:
    value = getattr(self, pax_name)
    return value if convert is None else convert(value)

  def refuse(self: Any, value: Any) -> None:
    fix = f"write --set {pax_name}={value!r}" if convert is None else f"set {pax_name}"
    raise UserError(f"{type(self).__name__}'s {name} is Pax's {pax_name}; {fix}.")

  alias = PaxAlias(get, refuse)
  alias.pax_name = pax_name
  return alias


def is_pmap(exp: Any) -> bool:
  """Pax's rule: an experiment that sets no ICI_MESH_SHAPE runs under pmap."""
  return exp.ICI_MESH_SHAPE is None


def user_name(exp: Any, name: str) -> str:
  """The name a user sets hyperparameter `name` by on exp's class: Pax's, where a template
  reads it through pax_alias (MESH_SHAPE for ICI_MESH_SHAPE), else name itself."""
  found = inspect.getattr_static(type(exp), name, None)
  return found.pax_name if isinstance(found, PaxAlias) else name


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
  with untracked(exp):  # listing them is not reading them
    for klass in reversed(cls.__mro__):
      for name, value in vars(klass).items():
        # dtypes (jnp.float32, ...) and classes (ACTIVATION_CLS = layers.GELU) are callable
        # but are hyperparameters, not methods.
        if is_hparam(name) and (_is_dtype_like(value) or isinstance(value, type)
                                or not callable(value)):
          out[name] = HParam(name, getattr(exp, name),
                             f"{klass.__module__}.{klass.__qualname__}")
  inherited = exp.__dict__.get("_inherited", set())
  for name, value in getattr(exp, "_overrides", {}).items():
    out[name] = HParam(name, value, JOB_SOURCE if name in inherited else SET_SOURCE)
  return sorted(out.values(), key=lambda h: h.name)


def format_hparams(exp: BaseExperiment) -> str:
  """experiment_cls_vars.txt: grouped by the class (or --set) that defines each."""
  groups: dict[str, list[HParam]] = {}
  for h in hparams(exp):
    groups.setdefault(h.source, []).append(h)
  order = [f"{k.__module__}.{k.__qualname__}" for k in reversed(type(exp).__mro__)]
  order += [JOB_SOURCE, SET_SOURCE]
  lines = [f"# experiment: {type(exp).__module__}.{type(exp).__qualname__}"]
  for source in order:
    if source not in groups:
      continue
    lines.append(f"\n# from {source}")
    lines.extend(f"{h.name} : {_show(h.value)}" for h in groups[source])
  return "\n".join(lines) + "\n"


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _show(value: Any) -> str:
  """A value as a message shows it: by name, never by a memory address."""
  if _is_dtype_like(value):
    return np.dtype(value).name
  if isinstance(value, type) or inspect.isroutine(value):
    return f"{value.__module__}.{value.__qualname__}"
  text = repr(value)
  if isinstance(value, fdl.Buildable):
    text = text[1:-1]  # <Config[Adam(lr=0.1)]> -> Config[Adam(lr=0.1)]
    if _ADDRESS.search(text):
      return f"{type(value).__name__}[{fdl.get_callable(value).__qualname__}(...)]"
    return text
  if _ADDRESS.search(text):  # object's default repr, or a container holding one
    return f"{type(value).__module__}.{type(value).__qualname__}(...)"
  return text


def _sentence(text: str) -> str:
  """text ended once: `did you mean X?` keeps its question mark, anything else gets a period."""
  return text if text.endswith(("?", ".")) else f"{text}."


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


def _allows_none(exp_cls: type | None, key: str, current: Any) -> bool:
  """Whether `--set KEY=None` fits: a string whose unset value is "" or whose annotation
  (on the class that declares it) allows None, as INIT_FROM's `str | None`."""
  if current == "" or key in PAX_CLAIMS:  # a claim of None claims nothing
    return True
  for klass in (exp_cls.__mro__ if exp_cls else ()):
    note = vars(klass).get("__annotations__", {}).get(key)
    if note is not None:
      return "None" in str(note) or "Optional" in str(note)
  return False


def _convert(key: str, raw: str, current: Any, exp_cls: type | None = None) -> Any:
  """Parses raw as a Python literal and checks it against current's type.

  A dtype attribute takes a dtype name; an activation class or an enum member
  takes its name (see _convert_named). None is taken where the hyperparameter
  may be unset (_allows_none).
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
  if current is None or (value is None and _allows_none(exp_cls, key, current)):
    return value
  ok = isinstance(value, type(current))
  if isinstance(current, bool) or isinstance(value, bool):
    ok = isinstance(value, bool) and isinstance(current, bool)
  elif isinstance(current, float) and isinstance(value, int):
    value, ok = float(value), True
  elif isinstance(current, int) and isinstance(value, float) and (
      value.is_integer() or key in FRACTIONAL_HPARAMS):
    ok = True  # 4.0 is 4; Pax's per-core batch sizes may be fractions (0.75)
    value = int(value) if value.is_integer() else value
  elif isinstance(current, list | tuple) and isinstance(value, list | tuple):
    value, ok = type(current)(value), True
  if not ok:
    raise UserError(f"--set {key}={raw}: {key} expects {type(current).__name__} "
                    f"(it is {_show(current)}), got {type(value).__name__}.")
  return value


def apply_overrides(exp: BaseExperiment, overrides: list[str]) -> None:
  """Applies `KEY=VALUE` strings to exp as instance attributes.

  Raises:
    UserError: an unknown key (with a did-you-mean), or a value of the wrong type.
  """
  known = {h.name: h.value for h in hparams(exp)}
  with untracked(exp):
    known.update({n: getattr(exp, n) for n in class_hparams(type(exp)) if n not in known})
  for text in overrides:
    key, raw = parse_override(text)
    if is_task_path(key):  # applied to the built task config, after task()
      exp.__dict__.setdefault("_path_overrides", {})[key] = raw
      continue
    if key in PAX_RENAMED and key not in known:
      raise UserError(f"--set {key}: paxlike calls it {PAX_RENAMED[key]} (Pax's name); "
                      f"write --set {PAX_RENAMED[key]}={raw}.")
    if not key:
      raise UserError(f"--set {text!r} names no hyperparameter; write --set KEY=VALUE.")
    if key not in known:
      close = ([key.upper()] if key.upper() in known else []) or difflib.get_close_matches(
          key, list(known), n=3, cutoff=0.6)
      hint = f" Did you mean {' or '.join(close)}?" if close else ""
      raise UserError(f"--set {key}: {type(exp).__name__} has no hyperparameter {key}.{hint}")
    value = _convert(key, raw, known[key], type(exp))
    setattr(exp, key, value)
    exp._overrides[key] = value
    known[key] = value


def instantiate(cls: type, overrides: list[str] = ()) -> BaseExperiment:
  """Creates the experiment, applies overrides and validates it."""
  exp = cls()
  if not isinstance(exp, BaseExperiment):
    raise UserError(f"{cls.__qualname__} is not a BaseExperiment subclass.")
  apply_overrides(exp, list(overrides))
  _adopt_model_mesh(exp)
  exp.validate()
  return exp


def _adopt_model_mesh(exp: BaseExperiment) -> None:
  """Pax runs SPMD where task_p.model.ici_mesh_shape is set, pmap where it is not. A Pax
  file that sets the model's mesh and no ICI_MESH_SHAPE (paxml's imagenet_resnets.py, from
  its own MESH_SHAPE) gets that mesh as its ICI_MESH_SHAPE (and DCN_MESH_SHAPE)."""
  if exp.ICI_MESH_SHAPE is not None or _is_paxlike_class(type(exp)):
    return
  try:
    model = task_config(exp).model
  except Exception:  # noqa: BLE001  (building the task reports it, in its own words)
    return
  ici = getattr(model, "ici_mesh_shape", None)
  if ici is None:
    return
  exp.ICI_MESH_SHAPE = list(ici)
  dcn = getattr(model, "dcn_mesh_shape", None)
  if dcn is not None and exp.DCN_MESH_SHAPE is None:
    exp.DCN_MESH_SHAPE = list(dcn)


# ----------------------------------------------------------- read tracking

# paxlike's old names for what Pax calls otherwise: refused with Pax's name.
PAX_RENAMED = {
    "MAX_CKPT_TO_KEEP": "CHECKPOINT_MAX_TO_KEEP",
    "TRAIN_SEED": "TRAINING_SEED",
    "DROPOUT_RATE": "DROPOUT_PROB",
    "LAYER_NORM_EPSILON": "LAYERNORM_EPSILON",
}

# Pax hyperparameters paxlike does not model yet, with what Pax uses them for.
PAX_UNMODELED = {
    "USE_TRITON_LAYER_NORM": "a Triton layer-norm kernel on GPU",
    "PROFILER_MIN_DURATION_SEC": "the shortest profile Pax's profiler captures",
    "TRAIN_MIXTURE": "a SeqIO training mixture name",
    "EVAL_MIXTURE": "a SeqIO eval mixture name",
}

# Knobs Pax's own LM files set where nothing reads them, in Pax either: what does the job.
# (NUM_GPUS and an LM's ENABLE_BFLOAT16 were here; they are PAX_CLAIMS now, read as checks.)
PAX_UNREAD: dict[str, str] = {}


def _pmap(exp: BaseExperiment) -> bool:
  """Whether the run is the pmap loop (no ICI_MESH_SHAPE): on every device there is."""
  return _untracked_get(exp, "ICI_MESH_SHAPE") is None


def _mesh_devices(exp: BaseExperiment, device_count: int | None) -> tuple[int, str] | None:
  """The devices the run takes and where that number comes from: ICI_MESH_SHAPE x
  DCN_MESH_SHAPE, or for a pmap run every device, device_count (None before the backend
  starts, which must wait for jax.distributed: then not known)."""
  if _pmap(exp):
    return None if device_count is None else (device_count, "pmap: every device")
  ici, dcn = _untracked_get(exp, "ICI_MESH_SHAPE"), _untracked_get(exp, "DCN_MESH_SHAPE")
  shapes = f"ICI_MESH_SHAPE {list(ici)}" + (f" x DCN_MESH_SHAPE {list(dcn)}" if dcn else "")
  return int(np.prod(ici)) * int(np.prod(dcn or [1])), shapes


def _num_gpus_claim(exp: BaseExperiment, claimed: Any, device_count: int | None) -> str | None:
  mesh = _mesh_devices(exp, device_count)
  if mesh is None:  # a pmap run before the backend starts: checked when it has
    return None
  devices, where = mesh
  if isinstance(claimed, int) and not isinstance(claimed, bool) and claimed == devices:
    return None
  decides = "the devices decide" if _pmap(exp) else "the mesh decides"
  return (f"the run takes {counted(devices, 'device')} ({where}); Pax reads "
          f"NUM_GPUS nowhere, and paxlike only checks it: {decides}")


def _enable_bfloat16_claim(exp: BaseExperiment, claimed: Any,
                           device_count: int | None) -> str | None:
  del device_count
  fprop = _untracked_get(exp, "FPROP_DTYPE") if hasattr(type(exp), "FPROP_DTYPE") else None
  try:
    if fprop is None or bool(claimed) == (np.dtype(fprop).name == "bfloat16"):
      return None
  except TypeError:  # not a dtype: the template says so in its own words
    return None
  return (f"FPROP_DTYPE is {_show(fprop)}; an LM's activations take FPROP_DTYPE, in Pax too "
          "(only its BERT templates read ENABLE_BFLOAT16)")


# Knobs Pax's LM files set that state what another setting decides, read by nothing in Pax:
# paxlike reads them as a check of that setting (check_pax_claims). -> (what decides, of the
# experiment; check (experiment, claim, device count or None): None when the claim holds,
# else what the run does instead).
PAX_CLAIMS: dict[str, tuple[Callable[[BaseExperiment], str],
                            Callable[[BaseExperiment, Any, int | None], str | None]]] = {
    "NUM_GPUS": (lambda exp: "the devices it runs on" if _pmap(exp) else "the mesh's shapes",
                 _num_gpus_claim),
    "ENABLE_BFLOAT16": (lambda exp: "FPROP_DTYPE", _enable_bfloat16_claim),
}


def check_pax_claims(exp: BaseExperiment, device_count: int | None = None) -> None:
  """Reads each PAX_CLAIMS knob the experiment sets and nothing else read (NUM_GPUS, an LM's
  ENABLE_BFLOAT16), checking it against the setting that decides. A class's claim that does
  not hold is a warning: the class runs as Pax runs it (nvidia.py's Grok_Proxy_PP says
  NUM_GPUS = 64 beside a mesh of 512). A --set one is refused: it changes nothing. None
  claims nothing. device_count: jax.device_count() once the backend has started (a pmap
  run's NUM_GPUS is checked against it), else None.

  Raises:
    UserError: a --set claim that does not hold, one line each.
  """
  reads = hparams_read(exp)
  overrides = exp.__dict__.get("_overrides", {})
  inherited = exp.__dict__.get("_inherited", set())
  defined = class_hparams(type(exp))
  lines = []
  for name, (decides, check) in PAX_CLAIMS.items():
    if name in reads or not (name in defined or name in overrides):
      continue
    claimed = getattr(exp, name)  # read: checked below
    wrong = None if claimed is None else check(exp, claimed, device_count)
    if wrong is None:
      continue
    if name in overrides and name not in inherited:
      lines.append(f"--set {name}={_show(claimed)}: {wrong}; set {decides(exp)} instead (or "
                   f"--set {name}=None).")
    else:
      klass = defined.get(name, type(exp))
      warn(f"{name} = {_show(claimed)} on {klass.__name__} does not hold: {wrong}.")
  if lines:
    raise UserError("\n".join(lines))


def _is_paxlike_class(klass: type) -> bool:
  module = klass.__module__ or ""
  return module == "paxlike" or module.startswith("paxlike.")


def _is_hparam_value(value: Any) -> bool:
  """Data, dtypes and classes (ACTIVATION_CLS = layers.GELU) are; methods are not."""
  return not (inspect.isfunction(value) or inspect.ismethoddescriptor(value)
              or isinstance(value, property | staticmethod | classmethod))


def class_hparams(cls: type) -> dict[str, type]:
  """Every UPPERCASE attribute on cls's class chain -> the most derived class that sets it."""
  out: dict[str, type] = {}
  for klass in reversed(cls.__mro__):
    for name, value in vars(klass).items():
      if is_hparam(name) and _is_hparam_value(value):
        out[name] = klass
  return out


@contextlib.contextmanager
def untracked(exp: BaseExperiment) -> Iterator[None]:
  """Reads inside this block are paxlike's bookkeeping, not uses."""
  d = object.__getattribute__(exp, "__dict__")
  reads = d.pop("_hparam_reads", None)
  try:
    yield
  finally:
    if reads is not None:
      d["_hparam_reads"] = reads


def start_read_tracking(exp: BaseExperiment) -> None:
  """From here on, reads of UPPERCASE attributes are recorded (check_all_read)."""
  exp.__dict__["_hparam_reads"] = set()
  exp.__dict__["_hparam_unused"] = {}  # name -> (reason, config path or None): not_used


def hparams_read(exp: BaseExperiment) -> set[str]:
  return set(exp.__dict__.get("_hparam_reads", ()))


# Knobs no template reads, in Pax either: a Pax file's task() gives them to praxis's tree.
PAX_TASK_KNOBS = {
    "NUM_EXPERTS": ("mixture-of-experts layers", "stacked_p.num_experts, with "
                    "stacked_p.moe_layers and model_params.maybe_setup_moe_params(stacked_p)"),
    "NUM_GROUPS": ("the routing groups of mixture-of-experts layers", "stacked_p.num_groups"),
}

# Pipeline hyperparameters: read by the pipelined templates only.
PAX_PIPELINE = ("NUM_STAGES", "MICROBATCH_SIZE", "CIRCULAR_REPEAT", "STREAM_IO",
                "PIPELINE_BROADCAST_INPUTS", "EMB_W_DATA_DIMS", "MESH_AXIS_NAMES")


def _describe_unread(name: str, known: list[str]) -> str:
  if name in PAX_PIPELINE:
    return ("only a pipelined experiment reads it: subclass TransformerLmSpmdPipelineAdafactor, "
            "TransformerLmSpmdPipelineAdam or LlamaSpmdPipelineAdam (a 4-axis [stage, replica, "
            "data, mdl] mesh)")
  if name in PAX_RENAMED:
    return f"paxlike calls it {PAX_RENAMED[name]} (Pax's name)"
  if name in PAX_UNMODELED:
    return f"paxlike does not model it yet (Pax uses it for {PAX_UNMODELED[name]})"
  if name in PAX_UNREAD:
    return PAX_UNREAD[name]
  if name in PAX_TASK_KNOBS:
    what, where = PAX_TASK_KNOBS[name]
    return (f"no template reads it, in Pax either: for {what}, task() sets {where}, as "
            "nvidia.py's MoELarge does")
  close = difflib.get_close_matches(name, [k for k in known if k != name], n=2, cutoff=0.75)
  if close:
    return f"did you mean {' or '.join(close)}?"
  return "no template or mixin of this experiment uses it; drop it or read it in task()/datasets()"


def unread_hparams(exp: BaseExperiment) -> list[str]:
  """One line for each hyperparameter the user wrote that nothing read.

  Checked: every UPPERCASE attribute set on a class outside the paxlike
  package (the user's classes and mixins, the shipped experiments) and
  every `--set` key. paxlike's own templates and BaseExperiment's run-level
  attributes are not: a template legitimately leaves some of its defaults
  unread in some modes.

  Known but inactive is not unknown: a class attribute that a template reads
  on another branch than the one this run takes (declared with not_used, or
  found in the source of the experiment's classes by paxlike.knob_branches)
  is a warning naming the setting that decides it, not a line here. A --set
  of one is still refused: the user asked for something with no effect.
  """
  reads = hparams_read(exp)
  unused = _UnusedReasons(exp)
  defined = class_hparams(type(exp))
  known = sorted(reads | set(defined))
  base = set(class_hparams(BaseExperiment))
  lines = []
  overrides = exp.__dict__.get("_overrides", {})
  inactive: dict[tuple[type, str], list[str]] = {}  # (class, reason) -> settings
  for name, klass in sorted(defined.items()):
    if name in overrides or name in base or _is_paxlike_class(klass):
      continue
    if name in reads or knob_branches.class_body_uses(
        name, [k for k in type(exp).__mro__ if k is not object]):
      continue
    setting = f"{name} = {_show(_untracked_get(exp, name))}"
    reason = unused.get(name) or _inactive_reason(exp, name)
    if reason:
      inactive.setdefault((klass, reason), []).append(setting)
      continue
    lines.append(f"{setting} on {klass.__name__}: nothing reads it; "
                 f"{_sentence(_describe_unread(name, known))}")
  for (klass, reason), settings in inactive.items():
    if len(settings) > 1:
      reason = re.sub(r"\bread(s?) it\b", r"read\1 them", reason)
    are = "is" if len(settings) == 1 else "are"
    line = f"{', '.join(settings)} on {klass.__name__} {are} not used: {reason}."
    if (klass.__module__ or "").startswith(registry.SHIPPED_PACKAGE + "."):
      logging.info("%s", line)  # a shipped experiment's own, deliberate choice
    else:
      warn(line)
  inherited = exp.__dict__.get("_inherited", set())  # a job's training --set (paxlike.main)
  for name, value in sorted(overrides.items()):
    if name in reads or (name in base and name not in unused) or name in inherited:
      continue
    reason = unused.get(name) or _inactive_reason(exp, name) or _describe_unread(name, known)
    lines.append(f"--set {name}={_show(value)}: nothing reads it; {_sentence(reason)}")
  return lines


class _UnusedReasons:
  """The reasons templates gave with not_used, by name (get), where a reason about a
  sub-config the user's task() replaced with another class's says so instead: the
  template's OPTIMIZER='adafactor' is not what leaves ADAM_EPSILON unread when task()
  calls Pax's set_default_adam."""

  def __init__(self, exp: BaseExperiment) -> None:
    self._exp = exp
    # A copy: rebuilding the template (_replacements) declares knobs of its own.
    self._declared = dict(exp.__dict__.get("_hparam_unused", {}))
    self._replaced: dict[str, str] | None = None

  def __contains__(self, name: str) -> bool:
    return name in self._declared

  def get(self, name: str) -> str | None:
    if name not in self._declared:
      return None
    reason, config = self._declared[name]
    parts = config.split(".") if config else []
    for path in (".".join(parts[:n]) for n in range(1, len(parts) + 1)):
      replacement = self._replacements().get(path)
      if replacement:
        return (f"{method_owner(self._exp, 'task')}() replaces task.{path} with its own "
                f"{replacement}, which does not read it")
    return reason

  def _replacements(self) -> dict[str, str]:
    """Sub-config path -> the user's replacement, where task() put another class's."""
    if self._replaced is None:
      self._replaced = {}
      user = self._exp.__dict__.get("_task_config")
      base = _template_flat(self._exp) if user is not None else None
      if base:
        flat = _flatten(user)
        self._replaced = {path: str(flat[path]) for path, was in base.items()
                          if isinstance(was, _Callable) and isinstance(flat.get(path), _Callable)
                          and flat[path] != was}
    return self._replaced


def _inactive_reason(exp: BaseExperiment, name: str) -> str | None:
  """Where the experiment's source reads `name` on a branch this run did not take, or None."""
  if any(name in known for known in (PAX_RENAMED, PAX_UNMODELED, PAX_UNREAD, PAX_PIPELINE,
                                      PAX_TASK_KNOBS, PAX_CLAIMS)):
    return None
  classes = [k for k in type(exp).__mro__ if k is not object]
  return knob_branches.inactive_reason(name, classes, lambda n: _untracked_get(exp, n))


def warn(line: str) -> None:
  """A warning the user sees whatever the logging setup: absl's log and a printed line."""
  logging.warning("%s", line)
  print(f"warning: {line}", flush=True)


def _untracked_get(exp: BaseExperiment, name: str) -> Any:
  with untracked(exp):
    return getattr(exp, name)


def check_all_read(exp: BaseExperiment) -> None:
  """Raises UserError, one line per hyperparameter, when something the user set went unread."""
  lines = unread_hparams(exp)
  if lines:
    raise UserError("\n".join(lines))


# ------------------------------------------------- building the user's configs


@contextlib.contextmanager
def user_config_errors(what: str) -> Iterator[None]:
  """Turns a fiddle/attribute/key error while building the user's config into a UserError."""
  try:
    yield
  except UserError:
    raise
  except (AttributeError, KeyError, TypeError, ValueError, IndexError) as e:
    first = (str(e).splitlines() or [""])[0].strip().rstrip(".")
    if isinstance(e, AttributeError) and "No parameter named" in first:
      first = (f"{first.split(';')[0]}: paxlike's config has no such field, so that edit "
               "cannot take effect")
    raise UserError(f"{what} failed{user_frame(e.__traceback__)}: "
                    f"{type(e).__name__}: {first}.") from None


def method_owner(exp: BaseExperiment, method: str) -> str:
  """`Class.method` of the class on exp's chain that defines the method exp runs."""
  owner = next((k for k in type(exp).__mro__ if method in vars(k)), type(exp))
  return f"{owner.__name__}.{method}"


def call_user(exp: BaseExperiment, method: str) -> Any:
  """exp.METHOD(), with errors in the user's config as one-sentence UserErrors."""
  with user_config_errors(f"{method_owner(exp, method)}()"):
    return getattr(exp, method)()


def is_task_path(key: str) -> bool:
  """`train.num_train_steps`: a dotted lowercase path into the built task config."""
  return "." in key and key[:1].islower()


def _get_path(cfg: Any, parts: list[str]) -> Any:
  node = cfg
  for part in parts:
    node = node[int(part)] if part.isdigit() else getattr(node, part)
  return node


def apply_path_overrides(exp: BaseExperiment, task_cfg: Any) -> None:
  """Applies `--set a.b=VALUE` to the built task config (after task(), so it wins)."""
  for key, raw in exp.__dict__.get("_path_overrides", {}).items():
    *parents, leaf = key.split(".")
    try:
      parent = _get_path(task_cfg, parents)
      current = getattr(parent, leaf)
    except (AttributeError, IndexError, ValueError, TypeError):
      raise UserError(f"--set {key}: the task config has no {key}; see model_params.txt "
                      "(task.<path>) for the paths.") from None
    if isinstance(current, fdl.Buildable):
      raise UserError(f"--set {key}: {key} is a sub-config, not a value; set one of its "
                      "fields.")
    value = _convert(key, raw, current)
    with user_config_errors(f"--set {key}={raw}"):
      setattr(parent, leaf, value)


def _flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
  """Every leaf of cfg by its dotted path; a sub-config's own path holds its callable, so
  that a --set that picks another class (LR_SCHEDULE, OPTIMIZER) feeds that path."""
  if isinstance(cfg, fdl.Buildable):
    out = {prefix: _Callable(fdl.get_callable(cfg))}
    for name, value in cfg.__arguments__.items():
      out.update(_flatten(value, f"{prefix}.{name}" if prefix else name))
    return out
  if isinstance(cfg, list | tuple) and any(isinstance(v, fdl.Buildable) for v in cfg):
    out = {}
    for i, value in enumerate(cfg):
      out.update(_flatten(value, f"{prefix}.{i}"))
    return out
  return {prefix: cfg}


def _same(a: Any, b: Any) -> bool:
  if a is b:
    return True
  try:
    return type(a) is type(b) and bool(np.all(a == b))
  except Exception:  # noqa: BLE001  (values that do not compare are different)
    return False


@dataclass(frozen=True)
class _Callable:
  """A sub-config's callable in _flatten: equal for the same class or function."""

  fn: Any

  def __str__(self) -> str:
    return f"{getattr(self.fn, '__qualname__', self.fn)} config"


def _string_choices(key: str) -> tuple[str, ...]:
  """The values a string hyperparameter with a fixed set takes (any template's), or ()."""
  from paxlike import learners
  from paxlike.layers import embedding, linear, t5, transformer

  return {
      "LR_SCHEDULE": learners.SCHEDULES,
      "OPTIMIZER": learners.OPTIMIZERS,
      "ACTIVATION": (*linear.ACTIVATIONS, *t5.FFN_ACTIVATIONS),
      "CHECKPOINT_POLICY": tuple(transformer.CHECKPOINT_POLICIES),
      "NORM_POLICY": transformer.NORM_POLICIES,
      "EMBEDDING_LOOKUP_STYLE": embedding.LOOKUP_STYLES,
      "LORA_TARGET_LAYERS": linear.LORA_TARGETS,
  }.get(key, ())


def _perturbations(key: str, value: Any) -> list[Any]:
  """Other values of the same kind as `value`, to see which config fields a --set of `key`
  feeds: the first one the template takes is used. A string with a fixed set of values
  (LR_SCHEDULE, OPTIMIZER, ...) and an enum member, an activation class or a dtype get the
  others of their set; another string, itself with a suffix."""
  import enum

  from paxlike.layers import activations

  if isinstance(value, bool):
    return [not value]
  if isinstance(value, int) and not isinstance(value, enum.Enum):
    return [value + 1]
  if isinstance(value, float):
    return [value * 2 + 1]
  if isinstance(value, enum.Enum):
    return [m for m in type(value) if m is not value]
  if isinstance(value, str):
    choices = [c for c in _string_choices(key) if c != value]
    return choices or [value + "_"]
  if isinstance(value, type) and issubclass(value, activations.BaseActivation):
    return [c for c in vars(activations).values()
            if isinstance(c, type) and issubclass(c, activations.BaseActivation)
            and c not in (value, activations.BaseActivation)]
  if _is_dtype_like(value):
    import ml_dtypes

    return [t for t in (np.float32, ml_dtypes.bfloat16) if np.dtype(t) != np.dtype(value)]
  return []


def _template_task(exp: BaseExperiment) -> Callable[[], Any] | None:
  """paxlike's own task() under the user's override, or None when task() is not overridden."""
  own = type(exp).task
  for klass in type(exp).__mro__:
    if "task" in vars(klass) and _is_paxlike_class(klass):
      template = vars(klass)["task"]
      return None if template is own else functools.partial(template, exp)
  return None


def overwritten_overrides(exp: BaseExperiment, task_cfg: Any) -> list[str]:
  """Lines for each `--set KEY` whose value the user's task() overwrote.

  The fields a --set key feeds are found by building paxlike's own task()
  twice, with the key's value and with another one the template takes
  (_perturbations: another of LR_SCHEDULE's schedules, not a misspelt one);
  a field the user's task() sets to something else, whatever the key's
  value, overwrote the --set. A sub-config the user's task() replaces with
  another class's (set_default_adam's schedule) is one line.
  """
  template = _template_task(exp)
  overrides = exp.__dict__.get("_overrides", {})
  if template is None or not overrides:
    return []
  base = _template_flat(exp)
  if base is None:
    return []
  lines = []
  user = _flatten(task_cfg)
  with _template_builds(exp):
    for key, value in overrides.items():
      lines += _overwritten(exp, template, key, value, base, user)
  return lines


@contextlib.contextmanager
def _template_builds(exp: BaseExperiment) -> Iterator[None]:
  """Builds of paxlike's own task() that are not the run's: no reads are recorded, and
  the knobs they declare not used (for other values) are forgotten after."""
  d = exp.__dict__
  unused = dict(d.get("_hparam_unused", {}))
  with untracked(exp):
    try:
      yield
    finally:
      if "_hparam_unused" in d:
        d["_hparam_unused"] = unused


def _template_flat(exp: BaseExperiment) -> dict[str, Any] | None:
  """_flatten of paxlike's own task() under the user's override, or None (not overridden,
  or the template fails where the user's task() does not)."""
  template = _template_task(exp)
  if template is None:
    return None
  with _template_builds(exp):
    try:
      return _flatten(template())
    except Exception:  # noqa: BLE001  (the user's task() works without this template)
      return None


def _overwritten(exp: BaseExperiment, template: Callable[[], Any], key: str, value: Any,
                 base: dict[str, Any], user: dict[str, Any]) -> list[str]:
  """overwritten_overrides' lines for one --set key."""
  d = exp.__dict__
  fed: set[str] = set()
  responds: dict[str, Any] = {}
  for other in _perturbations(key, value):
    d[key] = other
    try:
      other_cfg = _flatten(template())
      fed = {p for p in other_cfg.keys() | base.keys()
             if not _same(other_cfg.get(p, _MISSING), base.get(p, _MISSING))}
      # The user's task() may derive the field from the key itself (3 x MODEL_DIMS):
      # then the --set reaches it and nothing was overwritten.
      responds = exp.task()
      resolve_pax_tree(responds)
      responds = _flatten(responds)
    except Exception:  # noqa: BLE001  (a value the template rejects: try the next one)
      fed, responds = set(), {}
    finally:
      d[key] = value
    if fed:
      break
  lines = []
  replaced: list[str] = []  # sub-configs task() replaced with another class's
  for path in sorted(fed):
    if any(path.startswith(f"{r}.") for r in replaced):
      continue
    if not (path in user and not _same(user[path], base.get(path, _MISSING))
            and _same(responds.get(path, _MISSING), user[path])):
      continue
    where = f"--set {key}={_setting(value)} is overwritten by {method_owner(exp, 'task')}()"
    if isinstance(user[path], _Callable):
      replaced.append(path)
      lines.append(f"{where}, which replaces task.{path} with its own {user[path]}; stop "
                   "task() from replacing it.")
      continue
    sets = f"{where}, which sets task.{path} = {_setting(user[path], repr)}"
    if path in base and not isinstance(base[path], _Callable):
      lines.append(f"{sets}; use --set {path}={_setting(base[path])} to set the field after "
                   "task(), or stop task() from setting it.")
    else:
      lines.append(f"{sets}; stop task() from setting it.")
  return lines


_MISSING = object()


def _setting(value: Any, show: Callable[[Any], str] = _show) -> str:
  """A value as --set writes it: an enum member (Pax's AutodiffCheckpointType) by its name."""
  import enum

  if isinstance(value, enum.Enum):
    return f"{type(value).__name__}.{value.name}"
  return show(value)


def resolve_pax_tree(task_cfg: Any) -> list[str]:
  """Writes the task's praxis config-tree edits (`task_p.model.lm_tpl...`) onto its model.

  Returns the notes to show (sharding hints that are not applied). See
  paxlike.pax.config_tree.
  """
  from paxlike.pax import config_tree

  with user_config_errors("task()"):
    return config_tree.resolve(task_cfg)


def task_config(exp: BaseExperiment) -> Any:
  """exp.task() with `--set a.b=V` applied; refuses a --set that task() overwrote."""
  task_cfg = call_user(exp, "task")
  for note in resolve_pax_tree(task_cfg):
    logging.warning("%s", note)
  exp.__dict__["_task_config"] = task_cfg  # for check_all_read's reasons (_UnusedReasons)
  lines = overwritten_overrides(exp, task_cfg)
  if lines:
    raise UserError("\n".join(lines))
  apply_path_overrides(exp, task_cfg)
  from paxlike import learners

  learners.refuse_unread_fields(getattr(getattr(task_cfg, "train", None), "learner", None))
  return task_cfg


@dataclass
class Configs:
  """What main builds from an experiment before anything is written."""

  task: Any
  datasets: list[Any]
  decode_datasets: list[Any]
  # get_input_specs_provider_params(): a provider config, or None (the training input's).
  input_specs_provider: Any = None


def input_config(cfg: Any) -> Any:
  """An input config as the run reads it.

  The config of a wrapper class (Pax's base_input.LingvoInputAdaptor) becomes
  the config of the input it wraps, through the class's `unwrap_config`;
  any other config comes back as it is.
  """
  if isinstance(cfg, fdl.Buildable):
    unwrap = getattr(fdl.get_callable(cfg), "unwrap_config", None)
    if callable(unwrap):
      return unwrap(cfg)
  return cfg


def input_configs(exp: BaseExperiment, method: str) -> list[Any]:
  """exp.datasets() or exp.decode_datasets(), each config as the run reads it (input_config)."""
  cfgs = call_user(exp, method)
  with user_config_errors(f"{method_owner(exp, method)}()"):
    return [input_config(c) for c in cfgs]


def build_checked(exp: BaseExperiment, device_count: int | None = None) -> Configs:
  """task(), datasets() and decode_datasets(), then the check that every hyperparameter was read.

  device_count: jax.device_count() where the backend has started (check_pax_claims).

  Raises:
    UserError: an error in the user's config, a --set task() overwrote, or
      (one line each) hyperparameters nothing read.
  """
  start_read_tracking(exp)
  if not (_untracked_get(exp, "INIT_FROM") or getattr(exp, "CHECKPOINT_RESTORE_PATH", None)):
    exp.not_used("INIT_FROM_RULES", "INIT_FROM_STRICT", "INIT_FROM_OPTIMIZER",
                 reason="INIT_FROM is None (and no --init_from): no initial weights to take")
  configs = Configs(task_config(exp), input_configs(exp, "datasets"),
                    input_configs(exp, "decode_datasets"),
                    call_user(exp, "get_input_specs_provider_params"))
  check_pax_claims(exp, device_count)
  check_all_read(exp)
  return configs
