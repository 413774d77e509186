"""Initial weights: what a run with no checkpoint of its own starts from.

T5X's initial checkpoint and RestoreCheckpointConfig, Pax's
`init_from_checkpoint_rules`. An experiment names a source and, optionally,
rules (the flag --init_from overrides the source):

    INIT_FROM = "paxlike:jobs/flan_add"        # a paxlike job_log_dir or its checkpoints/
    INIT_FROM = "paxlike:jobs/flan_add@2000"   # ... at a step (default: the latest)
    INIT_FROM = "hf:/path/to/flan-t5-base"     # a Hugging Face save_pretrained directory
    INIT_FROM = "t5x:gs_copy/flan_t5_base"     # a T5X checkpoint_<step> folder or model_dir
                                               #   (@STEP as for paxlike; paxlike.interop.t5x)
    INIT_FROM = "pax:pax_job/checkpoints"      # a Pax checkpoint of Pax's LM or LLaMA (@STEP;
                                               #   paxlike.interop.pax); Pax's own
                                               #   CHECKPOINT_RESTORE_PATH names the same
    INIT_FROM_RULES = [                        # target name regex -> source name, or None
        (r"decoder/logits_dense/.*", None),    #   None: keep this one freshly initialised
        (r"(.*)", r"\\1"),                      #   the rest under the same names
    ]
    INIT_FROM_STRICT = True       # a parameter no rule covers, or missing from the source: error
    INIT_FROM_OPTIMIZER = False   # True: also take the optimizer state (paxlike sources)

Parameter names are paths like `encoder/layers_0/attention/query/kernel`
(model_analysis.txt lists them). A paxlike source whose layers are stored in
another layout (NUM_STAGES, CIRCULAR_REPEAT, USE_REPEATED_LAYER) is restacked
into this run's first (paxlike.relayout), so the rules see this run's names.
For each parameter of this run's model the first rule whose pattern matches
the whole name decides: its replacement (`re.Match.expand`, so groups carry
over) names the source parameter, or None leaves the parameter as
initialised. No rules means the identity. A
shape that differs is always an error naming both shapes; with
INIT_FROM_STRICT=False a parameter no rule covers, or one the source lacks,
starts fresh instead (T5X's fallback_to_scratch).

A train run whose job_log_dir holds no checkpoint applies it and starts at
step 0 with a fresh optimizer (unless INIT_FROM_OPTIMIZER); a rerun resumes
from its own checkpoints; eval, decode, infer and export with no checkpoint
use the weights as they are. `check()` runs in the preflight, before
anything is written, on metadata only (shapes from the source's checkpoint
metadata; for Hugging Face, config.json, whose checked fields fix every
shape).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from paxlike.errors import UserError
from paxlike.interop.hf_files import flat_names

KINDS = ("hf", "paxlike", "t5x", "pax")
STEPPED = ("paxlike", "t5x", "pax")  # kinds that take DIR@STEP
STREAMED = ("hf", "t5x", "pax")  # kinds read tensor by tensor onto the devices (start_state)
IDENTITY = ((r"(.*)", r"\1"),)


@dataclasses.dataclass(frozen=True)
class InitFrom:
  """A source of initial weights and how its parameters map onto this run's."""

  spec: str
  rules: tuple[tuple[str, str | None], ...] = IDENTITY
  strict: bool = True
  optimizer: bool = False

  @classmethod
  def of(cls, exp: Any, flag: str | None) -> InitFrom | None:
    """The experiment's INIT_FROM* hyperparameters, the source overridden by --init_from."""
    spec = flag or exp.INIT_FROM
    restore = getattr(exp, "CHECKPOINT_RESTORE_PATH", None)  # Pax's GPU CheckpointRestoreMixin
    if restore:
      if exp.INIT_FROM:
        raise UserError(f"both INIT_FROM={exp.INIT_FROM!r} and CHECKPOINT_RESTORE_PATH="
                        f"{restore!r} name initial weights; keep one.")
      if getattr(exp, "CHECKPOINT_IGNORE_RULES", None):
        raise UserError("CHECKPOINT_IGNORE_RULES names Pax variables to leave fresh; paxlike "
                        "keeps parameters fresh with INIT_FROM_RULES on its own names, e.g. "
                        "[(r'lm_head/.*', None), (r'(.*)', r'\\1')] (model_analysis.txt lists "
                        "them).")
      spec = flag or f"pax:{restore}"
    if not spec:
      return None
    rules = exp.INIT_FROM_RULES
    rules = IDENTITY if rules is None else tuple(_check_rule(r) for r in rules)
    out = cls(spec, rules, bool(exp.INIT_FROM_STRICT), bool(exp.INIT_FROM_OPTIMIZER))
    out.source()  # a malformed spec fails here
    return out

  def check_exists(self) -> None:
    """A Hugging Face or paxlike source is there (checked before its tokenizer is looked for
    in it; a Pax or T5X source, which holds no tokenizer, is checked where it is read).

    Raises:
      UserError: naming the path.
    """
    kind, path, _ = self.source()
    if kind in ("hf", "paxlike") and not os.path.exists(path):
      raise UserError(f"INIT_FROM / --init_from {self.spec!r}: {path} does not exist; pass the "
                      f"{'Hugging Face directory' if kind == 'hf' else 'checkpoint folder'} "
                      "itself.")

  def source(self) -> tuple[str, str, int | None]:
    """(kind, absolute path, step or None)."""
    kind, sep, rest = self.spec.partition(":")
    if not sep or kind not in KINDS or not rest:
      raise UserError(f"INIT_FROM / --init_from {self.spec!r} is not one of hf:DIR, "
                      "paxlike:DIR[@STEP], t5x:DIR[@STEP] or pax:DIR[@STEP]; e.g. "
                      "hf:/path/to/flan-t5-base.")
    if re.match(r"^[a-z][a-z0-9+.-]*://", rest):
      raise UserError(f"INIT_FROM / --init_from {self.spec!r}: remote paths are not read; copy "
                      f"the checkpoint to a local folder (e.g. gsutil -m cp -r {rest} .) or "
                      "mount the bucket (gcsfuse).")
    step = None
    if kind in STEPPED and "@" in rest:
      rest, _, step_text = rest.rpartition("@")
      if not step_text.isdigit():
        raise UserError(f"INIT_FROM {self.spec!r}: the step after '@' must be a number.")
      step = int(step_text)
    if kind != "paxlike" and self.optimizer:
      raise UserError("INIT_FROM_OPTIMIZER=True needs a paxlike source; a Hugging Face "
                      "directory holds no optimizer state, and a T5X or Pax one's is not read.")
    return kind, os.path.abspath(os.path.expanduser(rest)), step

  def vocabulary_dir(self) -> str | None:
    """Where the source's tokenizer lies: the Hugging Face directory, or the paxlike job's
    recorded vocabulary (paxlike.inputs.vocabulary.JOB_DIR); None for a T5X checkpoint,
    which holds none (the experiment's VOCABULARY names it)."""
    from paxlike.inputs.vocabulary import JOB_DIR

    kind, path, _ = self.source()
    if kind in ("t5x", "pax"):
      return None
    if kind == "hf":
      return path
    job = os.path.dirname(path) if os.path.basename(path) == "checkpoints" else path
    return os.path.join(job, JOB_DIR)


def _check_rule(rule: Any) -> tuple[str, str | None]:
  if (not isinstance(rule, list | tuple) or len(rule) != 2 or not isinstance(rule[0], str)
      or not (rule[1] is None or isinstance(rule[1], str))):
    raise UserError(f"INIT_FROM_RULES entry {rule!r} is not a (pattern, replacement or None) "
                    "pair.")
  try:
    re.compile(rule[0])
  except re.error as e:
    raise UserError(f"INIT_FROM_RULES pattern {rule[0]!r} is not a regular expression ({e}).") \
        from None
  return rule[0], rule[1]


@dataclasses.dataclass
class Plan:
  """Where each of this run's parameters comes from."""

  mapping: dict[str, str | None]  # target name -> source name, None: fresh
  renamed: int

  def counts(self) -> dict[str, int]:
    taken = sum(1 for s in self.mapping.values() if s is not None)
    return {"from_source": taken, "renamed": self.renamed,
            "fresh": len(self.mapping) - taken}


def plan(init: InitFrom, target: dict[str, Any], source: dict[str, Any]) -> Plan:
  """Applies the rules to this run's parameters (name -> leaf with .shape) and the source's.

  Raises:
    UserError: (strict) a parameter no rule covers or that the source lacks; a shape
      that differs (always).
  """
  from paxlike.layers.linear import LORA_NAMES

  mapping: dict[str, str | None] = {}
  renamed = 0
  for name, leaf in target.items():
    match = next(((m, repl) for pattern, repl in init.rules
                  if (m := re.fullmatch(pattern, name))), None)
    if match is None:
      if init.strict:
        raise UserError(f"parameter {name} is covered by no INIT_FROM_RULES rule; add one "
                        f"(a (pattern, None) rule keeps it freshly initialised) or set "
                        "INIT_FROM_STRICT=False.")
      mapping[name] = None
      continue
    m, repl = match
    if repl is None:
      mapping[name] = None
      continue
    src = m.expand(repl)
    if src not in source:
      if init.strict and not re.fullmatch(LORA_NAMES, name):
        # A LoRA adapter the source lacks starts fresh (Pax's CHECKPOINT_IGNORE_RULES
        # for LoRA): its zero lora_b leaves the source's function as it was.
        raise UserError(f"parameter {name} maps to {src}, which {init.spec} does not have; "
                        "fix INIT_FROM_RULES or set INIT_FROM_STRICT=False to initialise it "
                        "fresh.")
      mapping[name] = None
      continue
    if tuple(source[src].shape) != tuple(leaf.shape):
      raise UserError(f"parameter {name} has shape {tuple(leaf.shape)} in this run but "
                      f"{src} has shape {tuple(source[src].shape)} in {init.spec}; map it "
                      "elsewhere or leave it fresh with a (pattern, None) rule.")
    mapping[name] = src
    renamed += src != name
  return Plan(mapping, renamed)


def _paxlike_checkpointer(path: str):
  from paxlike import checkpoints as ckpt_lib

  return ckpt_lib.Checkpointer(ckpt_lib.resolve_restore_dir(path), read_only=True)


def _paxlike_step(ckpt: Any, step: int | None, spec: str) -> int:
  steps = ckpt.all_steps()
  if not steps:
    raise UserError(f"INIT_FROM {spec}: {ckpt.directory} holds no complete checkpoint.")
  if step is None:
    return max(steps)
  if step not in steps:
    raise UserError(f"INIT_FROM {spec}: no checkpoint for step {step}; available: "
                    f"{sorted(steps)}.")
  return step


def _source_metadata(init: InitFrom, model: Any, abstract: Any) -> tuple[dict[str, Any], Any]:
  """(source parameter name -> ShapeDtypeStruct, the source's stored opt_state or None)."""
  from paxlike.interop import hf

  kind, path, step = init.source()
  if kind in ("t5x", "pax"):
    return flat_names(_lazy_source(init, model, abstract)), None
  if kind == "hf":
    model.hf_config()  # a family with no Hugging Face layout says so first
    hf.check_config(hf.read_config(path), model)
    # The checked config fixes every shape: the import is this model's own tree.
    return flat_names(abstract.params), None
  ckpt = _paxlike_checkpointer(path)
  stored = ckpt.state_metadata(_paxlike_step(ckpt, step, init.spec))
  restack = _restack(stored, model)
  if restack is not None:
    stored = restack.abstract_of(stored, abstract)
  return flat_names(_field(stored, "params")), _field(stored, "opt_state")


def _lazy_source(init: InitFrom, model: Any, abstract: Any) -> dict[str, Any]:
  """A Hugging Face, T5X or Pax source as the model's tree of LazyParams (checked, unread)."""
  from paxlike.interop import hf, pax, t5x

  kind, path, step = init.source()
  if kind == "t5x":
    return t5x.lazy_params(path, step, model)
  if kind == "pax":
    return pax.lazy_params(path, step, model, flat_names(abstract.params))
  return hf.lazy_params(path, model)


def _restack(stored: Any, model: Any) -> Any:
  """The paxlike.relayout.Restack that puts the source's layers in model's layout, or None
  (the same layout, or a source whose layer count differs: the rules decide then)."""
  from paxlike import relayout

  change = relayout.change(stored, model)
  return change if isinstance(change, relayout.Restack) else None


def _field(state: Any, name: str) -> Any:
  return state[name] if isinstance(state, dict) else getattr(state, name)


def check(init: InitFrom, model: Any, abstract: Any) -> Plan:
  """The plan, from metadata only; raises UserError for anything load() would refuse.

  Args:
    init: the source and rules.
    model: this run's model.
    abstract: this run's abstract TrainState.
  """
  from paxlike import checkpoints as ckpt_lib

  source, opt_state = _source_metadata(init, model, abstract)
  out = plan(init, flat_names(abstract.params), source)
  if init.optimizer:
    problem = ckpt_lib.first_mismatch(abstract.opt_state, opt_state)
    if problem:
      raise UserError(f"INIT_FROM_OPTIMIZER=True but the optimizer state of {init.spec} does "
                      f"not fit this run's: {problem}; set INIT_FROM_OPTIMIZER=False.")
  return out


def load(init: InitFrom, model: Any, abstract: Any, fresh: Any) -> tuple[Any, Plan]:
  """The initial TrainState (host arrays) from a paxlike source: fresh's values where the
  plan says fresh. (Hugging Face and T5X sources stream onto the devices: start_state.)

  Args:
    init: the source and rules.
    model: this run's model.
    abstract: this run's abstract TrainState.
    fresh: a freshly initialised TrainState of this run (host arrays), for the
      parameters the rules leave fresh and for the optimizer state.

  Returns:
    (the state at step 0, the plan it followed).
  """
  import jax
  import numpy as np

  from paxlike import checkpoints as ckpt_lib

  out = check(init, model, abstract)
  kind, path, step = init.source()
  if kind != "paxlike":
    raise ValueError(f"load() reads paxlike sources, not {init.spec!r} (start_state streams "
                     "Hugging Face and T5X ones).")
  opt_state = fresh.opt_state
  ckpt = _paxlike_checkpointer(path)
  step = _paxlike_step(ckpt, step, init.spec)
  state, _ = ckpt.restore_host(step)
  ckpt.close()
  restack = _restack(state, model)
  if restack is not None:
    state, zeroed = restack.apply(state, abstract)
    restack.log(f"INIT_FROM {init.spec}", zeroed if init.optimizer else [])
  source = flat_names(_field(state, "params"))
  if init.optimizer:  # matched by name: a stored namedtuple is a dict of sorted keys
    stored_slots = ckpt_lib.flat(_field(state, "opt_state"))
    opt_state = jax.tree.unflatten(jax.tree.structure(fresh.opt_state),
                                   [stored_slots[n] for n in ckpt_lib.flat(fresh.opt_state)])
  names = list(flat_names(abstract.params))
  fresh_leaves = jax.tree.leaves(fresh.params)
  leaves = [np.asarray(source[out.mapping[n]], np.asarray(f).dtype)
            if out.mapping[n] is not None else f for n, f in zip(names, fresh_leaves, strict=True)]
  params = jax.tree.unflatten(jax.tree.structure(fresh.params), leaves)
  return fresh.replace(params=params, opt_state=opt_state), out


def start_state(init: InitFrom, model: Any, abstract: Any, partitioner: Any,
                fresh: Any) -> tuple[Any, Plan]:
  """The step-0 state in the partitioner's layout, from INIT_FROM and a fresh state.

  A Hugging Face, T5X or Pax source streams: each parameter is read from the
  safetensors files (T5X, Pax: its TensorStore arrays) and placed on its devices
  on its own (block by block, in its sharding), and the fresh parameter it
  replaces is freed at once,
  so the host never holds the model, only one tensor and one block. A
  paxlike source is read through load().

  Args:
    init: the source and rules.
    model: this run's model.
    abstract: this run's abstract TrainState.
    partitioner: the run's partitioner (place_param, shard_state, to_saveable).
    fresh: a freshly initialised TrainState in the partitioner's layout; its
      parameters that the plan takes from the source are deleted.
  """
  import jax

  kind, _, _ = init.source()
  if kind not in STREAMED:
    host = jax.device_get(partitioner.to_saveable(fresh))
    state, out = load(init, model, abstract, host)
    return partitioner.shard_state(state), out
  # The lazy source is checked against the model as it is made (names, shapes): the plan
  # needs nothing else, so the checkpoint's metadata is read once here, not again by check().
  source = flat_names(_lazy_source(init, model, abstract))
  target = flat_names(abstract.params)
  out = plan(init, target, source)
  names = list(target)
  leaves = []
  for name, like in zip(names, jax.tree.leaves(fresh.params), strict=True):
    if out.mapping[name] is None:
      leaves.append(like)
      continue
    leaves.append(partitioner.place_param(source[out.mapping[name]].read, like))
    like.delete()
  params = jax.tree.unflatten(jax.tree.structure(fresh.params), leaves)
  return fresh.replace(params=params), out
