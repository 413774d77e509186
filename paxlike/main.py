"""paxlike's entry point: `python -m paxlike.main --exp=NAME --job_log_dir=DIR`.

Flags -> experiment -> mesh and partitioner -> trainer -> job_log_dir.
Every UserError becomes `error: <sentence>` on stderr and exit status 2.
JAX's own options are flags too (--jax_debug_nans, --jax_compilation_cache_dir,
...), as in Pax's main.py; --helpfull lists them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sys
from typing import Any

if __package__ in (None, ""):
  # `python paxlike/main.py`: import the package, not sibling modules by bare name.
  sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from absl import app, flags  # noqa: E402

from paxlike import checkpoint_folders  # noqa: E402
from paxlike.command_line import (  # noqa: E402
  FLAGS,
  FOLLOWING_MODES,
  MODES,
  SEVERAL_STEP_MODES,
  fail,
  parse_flags,
)
from paxlike.errors import UserError, counted  # noqa: E402


def _job_log_dir_path(path: str | None) -> str:
  """The absolute --job_log_dir, checked but not created (a refused run leaves none)."""
  if not path:
    raise UserError("--job_log_dir is required; pass a directory for this run's outputs.")
  path = os.path.abspath(os.path.expanduser(path))
  if os.path.exists(path) and not os.path.isdir(path):
    raise UserError(f"--job_log_dir {path} exists and is not a directory; pick another path.")
  return path


def _prepare_job_log_dir(path: str | None) -> str:
  path = _job_log_dir_path(path)
  probe = os.path.join(path, f".write_probe_{os.getpid()}")
  try:
    os.makedirs(path, exist_ok=True)
    with open(probe, "w") as f:
      f.write("ok")
  except OSError as e:
    raise UserError(f"--job_log_dir {path} is not writable ({e.strerror}); "
                    "pick a directory you can write to, with free space.") from None
  finally:
    if os.path.exists(probe):  # also when the write failed (a full disk)
      os.remove(probe)
  return path


@dataclasses.dataclass
class _Built:
  """The experiment's configs built: the task and its inputs, bound to this host."""

  task_cfg: Any
  dataset_cfgs: list[Any]
  task: Any
  inputs: list[Any]
  decode_inputs: list[Any]
  # A run with no training input: the input whose shapes initialise the model (a
  # SpecsInput of the experiment's input specs provider, or its first eval or decode input).
  init_input: Any = None

  @property
  def train_input(self) -> Any:
    """The training input, else init_input."""
    return next((i for i in self.inputs if i.is_training), None) or self.init_input

  @property
  def eval_inputs(self) -> list[Any]:
    return [i for i in self.inputs if not i.is_training]


def run(argv_flags: flags.FlagValues) -> int:
  """Everything main() does, raising UserError for bad input.

  The path of one run: registry -> experiment -> flags -> (dry run) -> backend
  -> mesh and partitioner -> built task and inputs -> job_log_dir -> preflight
  -> records -> trainer, or evaluator / infer / export on a restored state.
  """
  from paxlike import jax_flags, log, profiler, registry, xla_flags

  if (shadowing := registry.shadowing_module(argv_flags.exp)) is not None:
    raise UserError(shadowing)  # before anything imports JAX, which would run that file
  log.setup(quiet_libraries=not argv_flags["verbosity"].present)
  if argv_flags.list_experiments:
    return _list_experiments(argv_flags.exp)
  _refuse_remote_paths(argv_flags)
  jax_flags.check(argv_flags)
  exp = _experiment(argv_flags)
  profile_plan = profiler.make_plan(argv_flags.profile_steps, argv_flags.profile_start_step, exp)
  # Nothing is created in job_log_dir until the experiment's configs are built and
  # every hyperparameter the user wrote was read (experiment.build_checked).
  job_log_dir = _job_log_dir_path(argv_flags.job_log_dir)
  if (argv_flags.mode in ("export", "infer") and not checkpoint_folders.step_folders(job_log_dir)
      and not (argv_flags.restore_checkpoint_dir or argv_flags.init_from or exp.INIT_FROM)):
    raise _no_checkpoint(job_log_dir, argv_flags.mode)  # before a vocabulary is looked for
  _use_job_vocabulary(exp, job_log_dir, argv_flags)
  if taken := exp.__dict__.get("_inherited_text"):
    log.info("--mode=%s takes the training settings of %s: --set %s (its run_env.json; a "
             "--set of the key changes it)", argv_flags.mode, taken[0], " --set ".join(taken[1]))
  if argv_flags.mode == "dry_run":
    return _dry_run(exp, job_log_dir, argv_flags)
  layout = _tuned_layout(exp, job_log_dir) if argv_flags.mode == "train" else None
  run_timer, flag_plan = _start_backend(
      exp, job_log_dir, argv_flags, profiling=profile_plan is not None
      and argv_flags.mode == "train")
  if argv_flags.mode == "tune":
    return _tune(exp, job_log_dir, argv_flags)
  cache = jax_flags.CacheReport()
  partitioner, mesh_desc = _partitioner(exp)
  built = _build(exp, argv_flags, job_log_dir)
  created = _new_job_log_dir(job_log_dir)
  lock = _claim_job_log_dir(job_log_dir, argv_flags.mode)
  try:
    init_from, source, export_job, restore = _preflight(exp, built, job_log_dir, argv_flags,
                                                        partitioner)
  except UserError:
    _unclaim_job_log_dir(job_log_dir, lock, created)  # a refused run leaves no directory
    raise
  before = _JobFiles(job_log_dir) if argv_flags.mode == "train" and _chief() else None
  try:
    _write_run_records(exp, built, job_log_dir, argv_flags, partitioner, mesh_desc, flag_plan,
                       restore)
    if layout is not None and _chief():
      xla_flags.update_run_env(job_log_dir, {"layout": layout})
    options = _train_options(built, partitioner, job_log_dir, argv_flags, init_from,
                             run_timer, flag_plan, profile_plan, restore)
    if argv_flags.mode != "train":
      code = _run_on_restored(built, partitioner, job_log_dir, argv_flags, options, export_job)
    else:
      code = _train(built, partitioner, job_log_dir, options)
  except UserError:
    if before is not None and run_timer.steps == 0:  # refused before its first step
      before.put_back()
      _unclaim_job_log_dir(job_log_dir, lock, created)
    raise
  if (line := cache.line()) is not None:
    import jax

    log.info("%s", line)
    if jax.process_index() == 0:
      xla_flags.update_run_env(job_log_dir, {"compilation_cache": cache.summary()})
  return code


def _tuned_layout(exp: Any, job_log_dir: str) -> dict[str, Any] | None:
  """A train run in a tuned job takes the winning layout for the knobs the user left free."""
  from paxlike import tune

  layout = tune.apply_winner(exp, job_log_dir)
  if layout:
    log_line = ", ".join(f"{k}={v!r}" for k, v in layout["applied"].items()) or "nothing"
    print(f"layout from --mode=tune: {log_line} ({layout['why']})", file=sys.stderr)
  return layout


def _tune(exp: Any, job_log_dir: str, argv_flags: flags.FlagValues) -> int:
  """--mode=tune: compile and time the candidate layouts; the table goes to job_log_dir/tune."""
  from paxlike import experiment, tune

  if experiment.is_pmap(exp):
    raise UserError(f"--mode=tune compiles SPMD steps; {type(exp).__name__} sets no "
                    "ICI_MESH_SHAPE (a pmap experiment): set one, e.g. [1, 1, 1].")
  if argv_flags.device_memory_gib is not None and argv_flags.device_memory_gib <= 0:
    raise UserError(f"--device_memory_gib={argv_flags.device_memory_gib} must be positive.")
  tune.tune(exp, _set_flags(argv_flags.set), job_log_dir, argv_flags.device_memory_gib,
            lambda e: _partitioner(e)[0])
  return 0


def _list_experiments(module: str | None) -> int:
  """Every registered experiment, or with --exp=MODULE that module's."""
  from paxlike import registry

  if module:
    names, unregistered = registry.module_names(module)
    if not names:
      which = f" ({', '.join(unregistered)} not registered)" if unregistered else ""
      print(f"module {module} registers no experiments{which}; decorate a class with "
            f"{registry.DECORATOR} to list and run it.", file=sys.stderr)
  else:
    registry.import_shipped()
    names = registry.list_names()
  for name in names:
    print(name)
  return 0


# `gs://bucket/x`, `s3://...`: any URL scheme.
_REMOTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _refuse_remote_paths(argv_flags: flags.FlagValues) -> None:
  """Remote directories would be written as a local folder named `gs:`: refused up front."""
  for flag in ("job_log_dir", "restore_checkpoint_dir", "export_dir"):
    value = argv_flags[flag].value
    if value and _REMOTE.match(value):
      raise UserError(f"--{flag}={value}: remote directories are not supported yet; use a "
                      "local path or a mounted bucket (e.g. gcsfuse).")


def _set_flags(values: list[str]) -> list[str]:
  """--set values, with model_params.txt's `task.` prefix dropped from a task path."""
  out = []
  for text in values:
    key, sep, value = text.partition("=")
    if key.strip().startswith("task.") and sep:
      text = f"{key.strip()[len('task.'):]}={value}"
    out.append(text)
  return out


# Flags only some modes read: given to another, they are refused (not ignored).
_DECODING = ("train", "decode", "decode_once", "infer", "export")
MODE_FLAGS = {
    "target": ("dry_run",), "dry_run_layouts": ("dry_run",),
    "export_format": ("export",), "export_dir": ("export",), "export_overwrite": ("export",),
    "export_platforms": ("export",), "device_memory_gib": ("train", "tune"),
    "skip_nonfinite_steps": ("train",), "profile_steps": ("train",),
    **{f"decode_{k}": _DECODING
       for k in ("temperature", "top_k", "top_p", "num_beams", "alpha", "max_length")},
    # An export samples with the seed its caller passes (run.generate(..., seed=)).
    "decode_seed": ("train", "decode", "decode_once", "infer"),
    "infer_input": ("infer",), "decode_during_train": ("train",), "eval_on_test": ("train",),
    "checkpoint_todelete_subdir": ("train",), "eval_during_decode": ("decode", "decode_once"),
    "enable_checkpoint_saving": ("train",), "jax_fully_async_checkpoint": ("train",),
    "pmap_use_tensorstore": ("train",),
}
# What to do instead, where dropping the flag is not the whole answer.
_ONLY_TRAINING_SAVES = "drop it (only --mode=train writes checkpoints)"
_MODE_FLAG_HINTS = {"infer_input": "add --mode=infer or drop --infer_input",
                    "eval_on_test": "drop it (--mode=eval runs the eval datasets)",
                    "enable_checkpoint_saving": _ONLY_TRAINING_SAVES,
                    "jax_fully_async_checkpoint": _ONLY_TRAINING_SAVES,
                    "decode_seed": "drop it (an export's caller passes its own seed: "
                                   "run.py --seed, generate(seed=...))",
                    "pmap_use_tensorstore": "drop it (a run reads a checkpoint in whichever "
                                            "format it was saved, msgpack or tensorstore)"}


def _experiment(argv_flags: flags.FlagValues) -> Any:
  """--exp and --set -> the experiment instance; flags that do not fit the mode are refused."""
  from paxlike import experiment, registry

  if not argv_flags.exp:
    raise UserError("--exp is required; pass an experiment name (see --list_experiments).")
  cls = registry.get(argv_flags.exp)
  given = _set_flags(argv_flags.set)
  job, kept, cwd = _training_overrides(cls, argv_flags, given)
  exp = experiment.instantiate(cls, kept + given)
  # What this mode does not read of them is no refusal: the training run read it.
  exp.__dict__["_inherited"] = {experiment.parse_override(text)[0] for text in kept}
  _job_files(exp, job, cwd)
  if kept:  # logged once the run is past its first checks
    exp.__dict__["_inherited_text"] = (job, kept)
  if argv_flags.init_from:
    # What the experiment derives from its initial weights (the tokenizer, a chat
    # template, the Llama family's special ids) follows the flag too.
    exp.INIT_FROM = argv_flags.init_from
  for name, modes in MODE_FLAGS.items():
    if argv_flags[name].present and argv_flags.mode not in modes:
      raise UserError(f"--{name} is read only by --mode={' and '.join(modes)}, not "
                      f"--mode={argv_flags.mode}; {_MODE_FLAG_HINTS.get(name, 'drop it')}.")
  if argv_flags.export_format == "hf" and argv_flags["export_platforms"].present:
    raise UserError("--export_platforms is read by --export_format=stablehlo and savedmodel, "
                    "not hf (a Hugging Face directory holds weights, not a program compiled "
                    "for platforms); drop it.")
  subdir = argv_flags.checkpoint_todelete_subdir
  if subdir is not None and (not subdir or subdir in (".", "..") or "/" in subdir
                             or os.sep in subdir or subdir.startswith("checkpoint_")):
    raise UserError(f"--checkpoint_todelete_subdir={subdir!r} must be a plain folder name "
                    "(checkpoints/<name>/ holds the old checkpoints), not a path or a step's "
                    "name.")
  asked = argv_flags.restore_checkpoint_step or []
  if len(asked) > 1 and argv_flags.mode not in SEVERAL_STEP_MODES:
    raise UserError(f"--restore_checkpoint_step is given {len(asked)} times "
                    f"({', '.join(map(str, asked))}); only --mode=eval, decode and decode_once "
                    f"run on several steps, --mode={argv_flags.mode} on one: pass one.")
  return exp


def _training_overrides(cls: type, argv_flags: flags.FlagValues, given: list[str]
                        ) -> tuple[str | None, list[str], str | None]:
  """The job's training `--set`s, for a run of another mode on it (the settings a
  fine-tune needed: its lengths, dtype, RoPE, files), but for the keys it sets itself.

  They come from the run_env.json of the job whose checkpoint --restore_checkpoint_dir
  gives, else of job_log_dir, when its training run was of this class. One this paxlike
  cannot apply (a name it no longer takes) is left out with a warning.

  Returns:
    (that job or None, its KEY=VALUE texts, the directory its training started in).
  """
  from paxlike import experiment, log, xla_flags
  from paxlike.inputs import vocabulary

  if argv_flags.mode == "train" or not argv_flags.job_log_dir:
    return None, [], None
  for job in _weights_jobs(os.path.abspath(os.path.expanduser(argv_flags.job_log_dir)),
                           argv_flags.restore_checkpoint_dir):
    if (record := xla_flags.training_run_env(job)) is not None:
      break
  else:
    return None, [], None
  if not isinstance(record, dict) or record.get("mode") != "train" \
      or record.get("experiment") != f"{cls.__module__}.{cls.__qualname__}":
    return None, [], None
  # VOCABULARY: the tokenizer the job recorded is read (_use_job_vocabulary) wherever
  # the training run's setting pointed.
  mine = {experiment.parse_override(text)[0] for text in given} | (
      {"VOCABULARY"} if vocabulary.recorded(job) else set())
  kept = []
  for text in _set_flags([t for t in record.get("overrides") or [] if isinstance(t, str)]):
    if experiment.parse_override(text)[0] in mine:
      continue
    try:
      experiment.apply_overrides(cls(), [text])
    except UserError as e:
      log.warning("the job's training setting --set %s is left out: %s", text, e)
      continue
    kept.append(text)
  cwd = record.get("cwd")
  return job, kept, cwd if isinstance(cwd, str) else None


def _job_files(exp: Any, job: str | None, cwd: str | None) -> None:
  """The data files a later run takes from its job's training run, as that run read them:
  relative paths from the directory it started in.

  Raises:
    UserError: one of them matches no file now (the run would read other data, or none).
  """
  import glob

  from paxlike.file_data import FILE_LISTS, file_list

  for key in sorted(exp.__dict__.get("_inherited", set()) & set(FILE_LISTS)):
    value = getattr(exp, key)
    if value is None:
      continue
    where = [p if os.path.isabs(p) else os.path.join(cwd or os.getcwd(), p)
             for p in file_list(value, key) if p]
    if gone := next((p for p in where if not glob.glob(p)), None):
      raise UserError(f"this run takes {key}={value!r} from the training run of {job}, and "
                      f"{gone} matches no file now; pass --set {key}=... to this run (None: "
                      "the experiment's own data).")
    setattr(exp, key, where)
    exp._overrides[key] = where


def _weights_jobs(job_log_dir: str, restore_dir: str | None) -> list[str]:
  """Where a run looks for the records of how its weights were trained: the job whose
  checkpoint --restore_checkpoint_dir gives (its checkpoints/ folder or one checkpoint in
  it), then job_log_dir."""
  if not restore_dir:
    return [job_log_dir]
  folder = os.path.abspath(os.path.expanduser(restore_dir)).rstrip(os.sep)
  return [os.path.dirname(folder), os.path.dirname(os.path.dirname(folder)), job_log_dir]


def _vocabulary_job(job_log_dir: str, restore_dir: str | None) -> str:
  """The job whose recorded tokenizer this run reads: that of the job whose checkpoint
  --restore_checkpoint_dir gives (the tokenizer its weights learnt), else job_log_dir's."""
  from paxlike.inputs import vocabulary

  return next((job for job in _weights_jobs(job_log_dir, restore_dir)
               if vocabulary.recorded(job)), job_log_dir)


def _use_job_vocabulary(exp: Any, job_log_dir: str, argv_flags: flags.FlagValues) -> None:
  """A later run of a job reads the tokenizer the job recorded (or the job of
  --restore_checkpoint_dir): it becomes VOCABULARY (so the inputs, chat template and the
  Llama family's special ids follow it), and a VOCABULARY or INIT_FROM tokenizer that is
  another one is refused (vocabulary.for_job)."""
  from paxlike import initial
  from paxlike.inputs import vocabulary

  mode = argv_flags.mode
  if mode != "train" and argv_flags.init_from and argv_flags.restore_checkpoint_dir:
    raise UserError(f"--mode={mode} takes its weights from --restore_checkpoint_dir, so "
                    f"--init_from={argv_flags.init_from} gives neither them nor a tokenizer; "
                    "drop --init_from (the tokenizer is that of the checkpoint's job).")
  init_from = initial.InitFrom.of(exp, None)  # exp.INIT_FROM holds --init_from already
  # A dry run needs only the shapes, and a job with checkpoints starts from its own.
  if init_from and mode != "dry_run" and not checkpoint_folders.step_folders(job_log_dir):
    init_from.check_exists()
  setting = getattr(exp, "VOCABULARY", None)
  spec = vocabulary.for_job(setting, init_from.vocabulary_dir() if init_from else None,
                            _vocabulary_job(job_log_dir, argv_flags.restore_checkpoint_dir))
  if spec != setting and hasattr(type(exp), "VOCABULARY"):
    exp.VOCABULARY = spec


def _dry_run(exp: Any, job_log_dir: str, argv_flags: flags.FlagValues) -> int:
  from paxlike import dry_run, experiment

  dry_run.ensure_fake_devices(dry_run.mesh_size(exp)[1])  # may restart this process
  experiment.build_checked(exp)
  created = _new_job_log_dir(job_log_dir)
  try:
    return dry_run.run(exp, _prepare_job_log_dir(job_log_dir), argv_flags.target,
                       layouts=argv_flags.dry_run_layouts, overrides=_set_flags(argv_flags.set))
  except UserError:
    _unclaim_job_log_dir(job_log_dir, None, created)  # a refused run leaves no directory
    raise


def _start_backend(exp: Any, job_log_dir: str, argv_flags: flags.FlagValues,
                   profiling: bool = False) -> tuple[Any, Any]:
  """XLA flags (before any backend starts), the distributed runtime, logging, attention.

  Returns:
    (the run's goodput recorder, started at the process start; the XLA flag plan).
  """
  from paxlike import distributed, goodput, log, xla_flags

  run_timer = goodput.Recorder(start=goodput.process_start_time())
  flag_plan = xla_flags.configure(  # before anything starts a JAX backend
      exp, argv_flags.pgle, job_log_dir, argv_flags.pgle_profile_path,
      argv_flags.pgle_profiling_runs, argv_flags.pgle_aggregation_percentile,
      profiling=profiling)  # a traced GPU run names ops: no command buffers
  distributed.initialize(argv_flags.coordinator_address, argv_flags.num_processes,
                         argv_flags.process_id, argv_flags.distributed_timeout_s)
  import jax

  from paxlike.layers import attention_policy

  try:
    jax.devices()
  except (RuntimeError, AssertionError) as e:  # JAX asserts when no listed platform starts
    wanted = jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS") or "the default"
    raise UserError(f"JAX starts no backend for platforms {wanted!r} on this machine"
                    f"{': ' + str(e).splitlines()[0] if str(e) else ''}; drop --jax_platforms "
                    "(and JAX_PLATFORMS), or install that platform's JAX (a CUDA GPU: pip "
                    "install -e '.[cuda]').") from None
  log.setup(jax.process_index(), jax.process_count(),
            quiet_libraries=not argv_flags["verbosity"].present)
  # Pax's switches -> the attention policy every program of this run is lowered with.
  attention_policy.start_run(attention_policy.policy_from_flags(
      getattr(exp, "USE_CUDNN_FLASH_ATTENTION", None), getattr(exp, "USE_FLASH_ATTENTION", None)),
      log=log.info)
  if (warning := attention_policy.policy_warning()) is not None:
    log.warning("%s", warning)
  if argv_flags.jax_profiler_port is not None:
    _start_profiler_server(argv_flags.jax_profiler_port)
  return run_timer, flag_plan


def _start_profiler_server(port: int) -> None:
  """--jax_profiler_port: jax.profiler's server, for traces captured while the job runs."""
  import socket

  import jax

  from paxlike import log

  if not 0 < port < 65536:
    raise UserError(f"--jax_profiler_port={port} is not a port; pass one in 1..65535.")
  # The server only logs a port it cannot bind, and runs on without one: try it first.
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
    try:
      probe.bind(("", port))
    except OSError as e:
      raise UserError(f"--jax_profiler_port={port}: the port cannot be used ({e.strerror}); "
                      "pick a free one.") from None
  jax.profiler.start_server(port)
  log.info("jax.profiler server on port %d: TensorBoard's profile tab captures a trace from "
           "localhost:%d", port, port)


def _partitioner(exp: Any) -> tuple[Any, dict[str, int]]:
  """The pmap partitioner (no ICI_MESH_SHAPE, as in Pax) or SPMD on the named mesh."""
  import jax

  from paxlike import experiment, mesh
  from paxlike.partitioning import PmapPartitioner, SpmdPartitioner

  if experiment.is_pmap(exp):
    return PmapPartitioner(), {"pmap": jax.local_device_count(), "processes": jax.process_count()}
  device_mesh = mesh.build(exp.ICI_MESH_SHAPE, exp.DCN_MESH_SHAPE, names=mesh.axis_names(exp),
                           ici_name=experiment.user_name(exp, "ICI_MESH_SHAPE"))
  partitioner = SpmdPartitioner(
      device_mesh, rules=mesh.rules_for(exp))
  return partitioner, dict(device_mesh.shape)


def _build(exp: Any, argv_flags: flags.FlagValues, job_log_dir: str) -> _Built:
  """Builds the task and inputs (refusing hyperparameters nothing read), bound to this host.

  A text input's vocabulary 'hf' (or unset) becomes the tokenizer this job recorded, or
  INIT_FROM's; one that does not fit the model is refused here, before anything is written.
  """
  import jax

  from paxlike import config, evaluator, experiment, initial
  from paxlike import export as export_lib
  from paxlike.inputs import text, vocabulary

  name = type(exp).__name__
  # Refuses hyperparameters nothing read (the backend has started: the device count is known).
  configs = experiment.build_checked(exp, jax.device_count())
  if argv_flags.tfds_data_dir:  # before any SeqIO input is built
    _use_tfds_data_dir(name, [*configs.datasets, *configs.decode_datasets], argv_flags)
  init_from = initial.InitFrom.of(exp, argv_flags.init_from)
  init_dir = init_from.vocabulary_dir() if init_from else None
  vocab_job = _vocabulary_job(job_log_dir, argv_flags.restore_checkpoint_dir)
  text.resolve_vocabularies(
      [*configs.datasets, *configs.decode_datasets], init_dir, vocab_job,
      init_from.spec if init_from and init_dir is None else None)
  decode_cfgs = configs.decode_datasets
  with experiment.user_config_errors(f"building {name}'s task"):
    task = config.build(configs.task)
  task.model.check_mesh(exp.ICI_MESH_SHAPE, exp.DCN_MESH_SHAPE)
  with experiment.user_config_errors(f"building {name}'s datasets"):
    inputs = [config.build(c) for c in configs.datasets]
  if argv_flags.mode == "infer":  # a bad --infer_input fails here, before anything is written
    decode_cfgs = evaluator.infer_datasets(name, decode_cfgs, argv_flags.infer_input,
                                           getattr(exp, "infer_input", None))
    text.resolve_vocabularies(decode_cfgs, init_dir, vocab_job)  # a new config too
  elif argv_flags.mode == "export" and not decode_cfgs:
    decode_cfgs = export_lib.text_source(getattr(exp, "infer_input", None), init_dir,
                                         vocab_job)
  with experiment.user_config_errors(f"building {name}'s decode datasets"):
    decode_inputs = [config.build(c) for c in decode_cfgs]
  for inp in inputs + decode_inputs:
    inp.bind_host(jax.process_count(), jax.process_index())
    if getattr(inp, "vocab", None) is not None:
      vocabulary.check_fits(inp.vocab, task.model)
    inp.check_model(task.model)
  init_input = None
  if not any(i.is_training for i in inputs):
    init_input = _init_input(exp, argv_flags, configs.input_specs_provider, task, inputs,
                             decode_inputs)
  _check_work(exp, argv_flags, inputs, decode_inputs)
  if argv_flags.mode in ("train", "tune") and not task.train.num_train_steps:
    raise UserError(f"{name} trains 0 steps (task.train.num_train_steps = 0, as Pax's LLaMA "
                    "classes with MAX_STEPS = 0); run it with --mode=eval, or set the steps "
                    "to train (MAX_STEPS / NUM_TRAIN_STEPS).")
  target = getattr(getattr(task, "train", None), "target_log_pplx", None)
  if target is not None and argv_flags.mode == "train" and not (
      task.train.eval_interval_steps and any(not i.is_training for i in inputs)
      and argv_flags.eval_on_test):
    raise UserError(f"TARGET_LOG_PPLX={target} stops training when an eval reaches it, but "
                    f"{name} runs no evals while training (it needs "
                    "EVAL_INTERVAL_STEPS > 0, an eval input in datasets() and no "
                    "--noeval_on_test).")
  if (getattr(task, "early_stopping_fn", None) is not None and argv_flags.mode == "train"
      and not argv_flags.eval_on_test):
    raise UserError(f"{name}'s early_stopping_fn is called after each eval while training, "
                    "and --noeval_on_test runs none; drop --noeval_on_test.")
  return _Built(configs.task, configs.datasets, task, inputs, decode_inputs, init_input)


def _init_input(exp: Any, argv_flags: flags.FlagValues, provider_cfg: Any, task: Any,
                inputs: list[Any], decode_inputs: list[Any]) -> Any:
  """The input whose shapes initialise the model of an experiment with no training input,
  as Pax's: with task_p.train.always_use_train_for_model_init = False its first eval or
  decode input, else the SpecsInput of get_input_specs_provider_params().

  Raises:
    UserError: it has neither, or the mode trains.
  """
  import jax

  from paxlike import config, experiment
  from paxlike.inputs import base_input

  name = type(exp).__name__
  if argv_flags.mode in ("train", "tune", "dry_run"):
    kind, mode = ("an eval", "eval") if inputs else ("a decode", "decode")
    raise UserError(f"{name} is {kind}-only experiment (datasets() has no input with "
                    f"is_training=True): run it with --mode={mode} on a trained job's "
                    "--job_log_dir.")
  if not task.train.always_use_train_for_model_init and inputs + decode_inputs:
    return (inputs + decode_inputs)[0]
  if provider_cfg is not None:
    where = f"{experiment.method_owner(exp, 'get_input_specs_provider_params')}()"
    with experiment.user_config_errors(f"building {where}'s provider"):
      provider = config.build(provider_cfg)
      specs = provider.get_input_specs()
    per_process = getattr(provider, "paxlike_rows_per_process", False)
    rows_factor = 1 if not experiment.is_pmap(exp) or per_process else (
        jax.local_device_count())  # pmap: a provider gives a device's rows
    init = base_input.specs_input(specs, rows_factor, f"{type(provider).__name__}"
                                  ".get_input_specs()")
    init.bind_host(jax.process_count(), jax.process_index())
    return init
  raise UserError(f"{name}.datasets() has no input with is_training=True to initialise the "
                  "model from; override get_input_specs_provider_params() to give its batch "
                  "shapes (Pax's), or set task_p.train.always_use_train_for_model_init = False "
                  "to take them from the first eval or decode input.")


def _use_tfds_data_dir(name: str, dataset_cfgs: list[Any], argv_flags: flags.FlagValues) -> None:
  """--tfds_data_dir: refused for an experiment with no SeqIO input, else set for them all."""
  import fiddle as fdl

  from paxlike.inputs import seqio_input

  if not any(isinstance(fdl.get_callable(c), type)
             and issubclass(fdl.get_callable(c), seqio_input.SeqIOInput) for c in dataset_cfgs):
    raise UserError(f"--tfds_data_dir is read by SeqIO inputs, and {name} has none; drop it.")
  argv_flags.tfds_data_dir = seqio_input.set_tfds_data_dir(argv_flags.tfds_data_dir)


def _check_work(exp: Any, argv_flags: flags.FlagValues, inputs: list[Any],
                decode_inputs: list[Any]) -> None:
  """Refuses a mode or flag that would find nothing to do, before anything is restored."""
  name, mode = type(exp).__name__, argv_flags.mode
  files = hasattr(type(exp), "EVAL_FILES")  # FilesDataset: its eval and decode sets
  what = "--eval_during_decode" if mode != "eval" else "--mode=eval"
  if ((mode == "eval" or argv_flags.eval_during_decode)
      and not any(not i.is_training for i in inputs)):
    raise UserError(f"{name} has no eval datasets (no input in datasets() with "
                    f"is_training=False), so {what} has nothing to evaluate; add one" +
                    (" or set EVAL_FILES" if files else "") + ".")
  if decode_inputs:
    return
  add = "add one" + (" or set EVAL_FILES to rows with targets" if files else "")
  if mode in ("decode", "decode_once"):
    raise UserError(f"{name} has no decode datasets (decode_datasets() returns none), so "
                    f"--mode={mode} has nothing to decode; {add}.")
  if mode == "train" and argv_flags.decode_during_train:
    raise UserError(f"--decode_during_train: {name} has no decode datasets (decode_datasets() "
                    f"returns none), so there is nothing to decode; drop the flag, or {add}.")


def _claim_job_log_dir(job_log_dir: str, mode: str) -> Any:
  """Creates job_log_dir (checked writable) and, to train, takes its lock (returned)."""
  from paxlike import job_lock

  _prepare_job_log_dir(job_log_dir)
  if mode == "train":  # eval/decode may read a job while it trains (Pax's evaler)
    return job_lock.hold(job_log_dir)  # one training run per job_log_dir; released at exit
  return None


class _JobFiles:
  """What a training run writes into job_log_dir before its first step (its records, its
  summary files, a vocabulary copy), as it was: put back when the run is refused before
  step 1 (a damaged checkpoint, a step over --device_memory_gib), so the job is as it was.
  Checkpoints, and what another mode's run beside it writes, are not touched."""

  MAX_BYTES = 1 << 20  # record files are small; a larger one is left as it is
  # The folders whose files are the run's own ("" is job_log_dir's top level), deepest first.
  FOLDERS = (os.path.join("summaries", "train"), os.path.join("summaries", "eval_train"),
             "vocabulary", "")
  # The folders a training run makes before step 1 (removed again when it made them and
  # they are empty), deepest first.
  MADE = (*FOLDERS[:-1], "summaries", "checkpoints", "profile", "pgle")
  # Top-level files of other runs beside it: other modes' (eval_run_env.json, ...), a dry
  # run's report, and files being written (files.write_atomic's, main's write probe).
  NOT_OURS = (*(f"{mode}_" for mode in MODES if mode != "train"), "dry_run.json",
              ".write_probe_")

  def __init__(self, job_log_dir: str) -> None:
    self.root = job_log_dir
    self.kept = {path: self._read(path) for path in self._ours()}
    self.existed = {sub for sub in self.MADE if os.path.isdir(os.path.join(self.root, sub))}

  def _ours(self) -> list[str]:
    """The run's own files: top-level files (not another mode's), summaries/train,
    eval_train, vocabulary/."""
    out = []
    for sub in self.FOLDERS:
      folder = os.path.join(self.root, sub)
      if os.path.isdir(folder):
        out += [os.path.join(folder, n) for n in os.listdir(folder)
                if os.path.isfile(os.path.join(folder, n)) and n != "job.lock"
                and ".tmp-" not in n and not (sub == "" and n.startswith(self.NOT_OURS))]
    return out

  def _read(self, path: str) -> bytes | None:
    """The file's bytes; None when it is too large to keep, or gone meanwhile."""
    try:
      if os.path.getsize(path) > self.MAX_BYTES:
        return None
      with open(path, "rb") as f:
        return f.read()
    except FileNotFoundError:
      return None

  def put_back(self) -> None:
    """(Built on the chief only, which alone writes the records.)"""
    for path in self._ours():
      if path not in self.kept:
        with contextlib.suppress(FileNotFoundError):
          os.remove(path)
      elif self.kept[path] is not None and self._read(path) != self.kept[path]:
        with open(path, "wb") as f:
          f.write(self.kept[path])
    for sub in self.MADE:  # the ones this run made and left empty
      if sub not in self.existed:
        try:
          os.rmdir(os.path.join(self.root, sub))  # only ever an empty one
        except OSError:
          pass


def _chief() -> bool:
  """Whether this is the process that writes the job's records (process 0)."""
  import jax

  return jax.process_index() == 0


def _new_job_log_dir(job_log_dir: str) -> bool:
  """Whether this run makes job_log_dir (a refused run removes it again): it is not there,
  or, in a multi-process run, it is there and empty (another process made it first)."""
  import jax

  if not os.path.exists(job_log_dir):
    return True
  return jax.process_count() > 1 and os.path.isdir(job_log_dir) and not os.listdir(job_log_dir)


def _unclaim_job_log_dir(job_log_dir: str, lock: Any, created: bool) -> None:
  """Undoes _claim_job_log_dir for a refused run: the lock, and the directory if this run
  created it and left it empty."""
  if lock is not None:
    lock.release()
  if created:
    try:
      os.rmdir(job_log_dir)  # only ever an empty directory
    except OSError:
      pass


def _no_checkpoint(job_log_dir: str, mode: str) -> UserError:
  what = "to export" if mode == "export" else "to predict with"
  return UserError(f"{job_log_dir} has no checkpoint {what}; train first, or pass "
                   "--restore_checkpoint_dir or --init_from.")


def _preflight(exp: Any, built: _Built, job_log_dir: str, argv_flags: flags.FlagValues,
               partitioner: Any) -> tuple[Any, Any, Any, Any]:
  """Everything a run can refuse, checked before it writes anything into job_log_dir.

  Returns:
    (INIT_FROM or None, the checkpoint source, (exporter, plan, export_dir) or None,
    a training run's resume.TrainRestore or None).
  """
  from paxlike import experiment, initial, log, resume
  from paxlike import export as export_lib

  mode, task = argv_flags.mode, built.task
  init_from = initial.InitFrom.of(exp, argv_flags.init_from)
  exporter = export_lib.get(argv_flags.export_format) if mode == "export" else None
  steps, restore = _restore_steps(argv_flags), None
  if mode == "train":  # a rerun of a command with restore flags continues the job
    restore = resume.train_restore(job_log_dir, argv_flags.restore_checkpoint_dir, steps[0])
    steps = [restore.step]
  with experiment.user_config_errors(f"initialising {type(exp).__name__}'s model"):
    source, *_ = [resume.preflight_task(  # every step asked for, before anything is read
        task, built.train_input, job_log_dir, mode, argv_flags.restore_checkpoint_dir,
        step, argv_flags.restore_fallback, will_save=argv_flags.enable_checkpoint_saving,
        init_from=init_from) for step in steps]
  if restore is not None and restore.note:
    log.info("%s", restore.note)
  if mode == "train":  # the batch divides as the step needs, before anything is written
    from paxlike import steps as steps_lib

    steps_lib.check_step_batch(task.model, partitioner, built.train_input.get_global_batch_size(),
                               task.train.num_microbatches)
  _check_eval_batches(built, partitioner, argv_flags)
  if mode in ("export", "infer") and source.step is None and not init_from:
    raise _no_checkpoint(job_log_dir, mode)
  export_job = None
  if exporter:
    export_dir = export_lib.out_dir(job_log_dir, source.step or 0, exporter.name,
                                    argv_flags.export_dir)
    export_lib.check_free(export_dir, argv_flags.export_overwrite)
    cls = type(exp)
    export_plan = exporter.check(export_lib.describe(
        f"{cls.__module__}.{cls.__qualname__}", task, built.train_input, built.decode_inputs,
        decode_settings(argv_flags, task.model),
        export_lib.parse_platforms(argv_flags.export_platforms), job_log_dir))
    export_job = (exporter, export_plan, export_dir)
  return init_from, source, export_job, restore


def _check_eval_batches(built: _Built, partitioner: Any, argv_flags: flags.FlagValues) -> None:
  """Refuses an eval or decode batch that does not split over the devices as this run
  will read it: found now, not in the eval after the last training step.

  Raises:
    UserError: naming the input and its batch.
  """
  mode = argv_flags.mode
  evals = (mode == "eval" or (mode == "train" and argv_flags.eval_on_test)
           or (mode in ("decode", "decode_once") and argv_flags.eval_during_decode))
  checks = [("eval", i, partitioner.check_global_batch) for i in built.eval_inputs if evals]
  if mode in ("train", "decode", "decode_once"):
    checks += [("decode", i, partitioner.check_decode_batch) for i in built.decode_inputs]
  for what, inp, check in checks:
    try:
      check(inp.get_global_batch_size())
    except UserError as e:
      raise UserError(f"the {what} input {inp.name!r}: {e}") from None


def _write_run_records(exp: Any, built: _Built, job_log_dir: str, argv_flags: flags.FlagValues,
                       partitioner: Any, mesh_desc: dict[str, int], flag_plan: Any,
                       restore: Any) -> None:
  """experiment_cls_vars.txt, model_params.txt, input_specs.json and run_env.json (the chief
  writes them). Another mode than train writes them with its name in front, as Pax does
  (eval_model_params.txt, infer_run_env.json, ...), so the record of how the job was
  trained stays."""
  import jax

  from paxlike import config, experiment, jax_flags, xla_flags
  from paxlike.inputs import vocabulary as vocab_lib
  from paxlike.layers import attention_policy

  prefix = "" if argv_flags.mode == "train" else f"{argv_flags.mode}_"
  xla_flags.set_run_env_name(f"{prefix}run_env.json")
  if jax.process_index() != 0:
    return
  cls = type(exp)
  with open(os.path.join(job_log_dir, f"{prefix}experiment_cls_vars.txt"), "w") as f:
    f.write(experiment.format_hparams(exp))
  with open(os.path.join(job_log_dir, f"{prefix}model_params.txt"), "w") as f:
    f.write(config.dump_model_params(built.task_cfg, built.dataset_cfgs))
  _write_input_specs(built.train_input, partitioner,
                     os.path.join(job_log_dir, f"{prefix}input_specs.json"))
  if argv_flags.mode == "train" and getattr(built.train_input, "vocab", None) is not None:
    vocab_lib.record(built.train_input.vocab, job_log_dir)  # what later runs of this job read
  vocab = next((i.vocab for i in (built.train_input, *built.inputs, *built.decode_inputs)
                if getattr(i, "vocab", None) is not None), None)
  xla_flags.write_run_env(job_log_dir, xla_flags.run_env({
      "experiment": f"{cls.__module__}.{cls.__qualname__}",
      "mode": argv_flags.mode, "partitioner": partitioner.kind,
      "mesh": mesh_desc, "overrides": argv_flags.set, "cwd": os.getcwd(),
      **({"job_overrides": exp.__dict__["_inherited_text"][1]}
         if "_inherited_text" in exp.__dict__ else {}),
      **flag_plan.record(),
      **jax_flags.record(argv_flags),
      **({"tfds_data_dir": argv_flags.tfds_data_dir} if argv_flags.tfds_data_dir else {}),
      **({"vocabulary": vocab.spec} if vocab is not None else {})}))
  if restore is not None:  # what a rerun of this command is recognised by
    from paxlike import resume

    resume.write_record(job_log_dir, restore)
  # Each new attention choice (logged once) is added as programs are lowered.
  attention_policy.on_choice(lambda rec: xla_flags.update_run_env(job_log_dir, {"attention": rec}))


def _write_input_specs(train_input: Any, partitioner: Any, path: str) -> None:
  """input_specs.json, as Pax writes it: the shape and dtype of each feature of the batch
  the model initialises from, a process's rows under SPMD and a device's under pmap."""
  import jax

  from paxlike.inputs.base_input import input_specs

  per_device = jax.local_device_count() if partitioner.kind == "pmap" else 1
  specs = {key: {"_array": {"shape": [spec.shape[0] // per_device, *spec.shape[1:]],
                            "dtype": str(spec.dtype)}}
           for key, spec in input_specs(train_input).items()}
  with open(path, "w") as f:
    json.dump(specs, f, indent=2, sort_keys=True)


def _train_options(built: _Built, partitioner: Any, job_log_dir: str,
                   argv_flags: flags.FlagValues, init_from: Any, run_timer: Any, flag_plan: Any,
                   profile_plan: Any, restore: Any) -> Any:
  """The trainer's options from the flags, with the evaluator and, for training, the peak."""
  import jax

  from paxlike import evaluator, flops, trainer, xla_flags

  model = built.task.model
  options = trainer.TrainOptions(
      enable_checkpoint_saving=argv_flags.enable_checkpoint_saving,
      async_checkpoint=argv_flags.jax_fully_async_checkpoint,
      enable_summary_writer=argv_flags.enable_summary_writer,
      restore_checkpoint_dir=argv_flags.restore_checkpoint_dir,
      restore_checkpoint_step=restore.step if restore else _restore_steps(argv_flags)[0],
      checkpoint_format="msgpack" if (partitioner.kind == "pmap"
                                      and not argv_flags.pmap_use_tensorstore) else "tensorstore")
  options.init_from = init_from
  options.goodput, options.pgle = run_timer, flag_plan.pgle
  if argv_flags.device_memory_gib is not None:
    if argv_flags.device_memory_gib <= 0:
      raise UserError(f"--device_memory_gib={argv_flags.device_memory_gib} must be positive.")
    options.device_memory_bytes = int(argv_flags.device_memory_gib * (1 << 30))
  if argv_flags.mode == "train":
    options.peak_flops_per_device, peak_source = flops.resolve_peak(
        jax.local_devices(), model.compute_dtype(), argv_flags.peak_tflops_per_device)
    # A pipeline's schedule and bubble: in run_env.json and the log (MFU includes the bubble).
    # (A batch the step cannot divide was refused in _preflight, before anything was written.)
    pipeline = flops.pipeline_schedule(model, built.train_input.get_global_batch_size()
                                       // built.task.train.num_microbatches)
    if pipeline is not None:
      from paxlike import log

      log.info("%s", flops.describe_pipeline(pipeline))
    if jax.process_index() == 0:
      xla_flags.update_run_env(job_log_dir, {"peak_flops_per_device":
                                             options.peak_flops_per_device,
                                             "peak_flops_source": peak_source,
                                             **({"pipeline": pipeline} if pipeline else {})})
  evals = built.eval_inputs if argv_flags.mode != "train" or argv_flags.eval_on_test else []
  options.evaluator = evaluator.Evaluator(
      model, partitioner, evals, built.decode_inputs,
      job_log_dir, enable_summary_writer=argv_flags.enable_summary_writer,
      settings=decode_settings(argv_flags, model))
  options.decode_during_train = argv_flags.decode_during_train
  options.restore_fallback = argv_flags.restore_fallback
  options.checkpoint_todelete_subdir = argv_flags.checkpoint_todelete_subdir
  options.skip_nonfinite_steps = argv_flags.skip_nonfinite_steps
  options.profile = profile_plan
  return options


def _run_on_restored(built: _Built, partitioner: Any, job_log_dir: str,
                     argv_flags: flags.FlagValues, options: Any, export_job: Any) -> int:
  """eval, decode, infer or export on the restored (or INIT_FROM) state; eval and decode
  beside a running trainer go on with each checkpoint it commits (follow.py)."""
  import functools

  from paxlike import decoding, evaluator, trainer
  from paxlike import export as export_lib

  mode = argv_flags.mode
  restore = functools.partial(
      evaluator.restore_for_eval, built.task, built.train_input, partitioner, job_log_dir,
      restore_dir=argv_flags.restore_checkpoint_dir, init_from=options.init_from,
      program=trainer.build_train_program(built.task, built.train_input, partitioner))
  if mode in SEVERAL_STEP_MODES:
    followed = (_followed_steps(job_log_dir, argv_flags, built.task.train.num_train_steps)
                if mode in FOLLOWING_MODES and not argv_flags.restore_checkpoint_step else None)
    for asked in followed or _restore_steps(argv_flags):
      try:
        state, step = restore(step=asked)
      except Exception:
        if followed is None or _still_there(job_log_dir, argv_flags, asked):
          raise
        from paxlike import log

        log.warning("checkpoint %d was deleted while it was read (the trainer keeps "
                    "CHECKPOINT_MAX_TO_KEEP); going on with the next one", asked)
        continue
      _report(options.evaluator, mode, state, step, argv_flags.eval_during_decode)
      del state
    return 0
  state, step = restore(step=_restore_steps(argv_flags)[0])
  if mode == "export":
    exporter, export_plan, export_dir = export_job
    params = decoding.decoding_model(  # a scanned or pipelined model exports its unrolled twin
        built.task.model, partitioner.to_saveable(state).params)[1]
    export_lib.publish(export_dir, lambda d: exporter.write(export_plan, params, step, d),
                       argv_flags.export_overwrite)
    print(f"exported step {step} as {exporter.name} to {export_dir}")
    return 0
  if mode == "infer":  # predictions only: no metrics, no summaries
    for name, (count, path) in options.evaluator.infer(state, step).items():
      print(f"infer {name} at step {step}: {counted(count, 'prediction')} -> {path}")
  return 0


def _restore_steps(argv_flags: flags.FlagValues) -> list[int | None]:
  """--restore_checkpoint_step's steps in the order given; [None]: the newest."""
  return list(argv_flags.restore_checkpoint_step or [None])


def _followed_steps(job_log_dir: str, argv_flags: flags.FlagValues, final_step: int) -> Any:
  """The steps an eval or decode run takes from a trainer that holds the job now, or None
  when none does and there is no checkpoint (the run then reads INIT_FROM, or says why not)."""
  from paxlike import checkpoints as ckpt_lib
  from paxlike import follow

  poll = follow.folder_poll(ckpt_lib.read_dir(job_log_dir, argv_flags.restore_checkpoint_dir))
  newest, trainer = poll()
  if newest is None and not trainer:
    return None
  return follow.steps(poll, final_step)


def _still_there(job_log_dir: str, argv_flags: flags.FlagValues, step: int) -> bool:
  from paxlike import checkpoints as ckpt_lib

  directory = ckpt_lib.read_dir(job_log_dir, argv_flags.restore_checkpoint_dir)
  return not os.path.isdir(directory) or step in ckpt_lib.Checkpointer(
      directory, read_only=True).all_steps()


def _report(evaluator: Any, mode: str, state: Any, step: int, eval_during_decode: bool) -> None:
  """Evaluates or decodes one restored step and prints a line per dataset."""
  runs = [("eval", evaluator.evaluate)] if mode == "eval" else [("decode", evaluator.decode)]
  if eval_during_decode:
    runs.append(("eval", evaluator.evaluate))
  for label, run_one in runs:
    for name, metrics in run_one(state, step).items():
      print(f"{label} {name} at step {step}: " +
            " ".join(f"{k} {v:.4f}" for k, v in metrics.items()), flush=True)


def _train(built: _Built, partitioner: Any, job_log_dir: str, options: Any) -> int:
  """Trains; prints the loss line and final evals; a preempted run exits EXIT_PREEMPTED."""
  from paxlike import preemption, trainer

  result = trainer.train(built.task, built.train_input, partitioner, job_log_dir, options)
  if result.history:
    first, last = result.history[0], result.history[-1]
    print(f"trained steps {result.start_step}..{result.final_step}: loss "
          f"{first['loss']:.4f} (step {first['step']}) -> {last['loss']:.4f} "
          f"(step {last['step']}); outputs in {job_log_dir}")
  for name, metrics in (result.eval_metrics or {}).items():
    print(f"{name} at step {result.final_step}: " +
          " ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
  if result.stopped_by:
    saved = ("checkpoint saved" if options.enable_checkpoint_saving else
             "not saved (--enable_checkpoint_saving=false)")
    print(f"stopped by {result.stopped_by} after step {result.final_step}, {saved}; "
          f"exit status {preemption.EXIT_PREEMPTED}: rerun the same command to continue",
          file=sys.stderr)
    return preemption.EXIT_PREEMPTED
  return 0


def decode_settings(argv_flags: flags.FlagValues, model: Any) -> Any:
  """The --decode_* flags as DecodeSettings (checked: bad values are UserErrors)."""
  from paxlike import decoding

  f = argv_flags
  if f.decode_num_beams < 1:
    raise UserError(f"--decode_num_beams must be at least 1, got {f.decode_num_beams}.")
  if not 0.0 < f.decode_top_p <= 1.0:
    raise UserError(f"--decode_top_p must be in (0, 1], got {f.decode_top_p}.")
  if f.decode_top_k < 0 or f.decode_temperature < 0:
    raise UserError("--decode_top_k and --decode_temperature must not be negative.")
  if f.decode_max_length is not None and f.decode_max_length < 1:
    raise UserError(f"--decode_max_length must be at least 1, got {f.decode_max_length}.")
  if f.decode_num_beams > 1 and f.decode_temperature > 0:
    raise UserError("beam search (--decode_num_beams > 1) does not sample; drop "
                    "--decode_temperature or use one beam.")
  cuts = [n for n in ("decode_top_k", "decode_top_p") if f[n].present]
  how = "beam search" if f.decode_num_beams > 1 else "greedy decoding"
  if cuts and f.decode_temperature == 0:
    raise UserError(f"--{' and --'.join(cuts)} cut{'s' if len(cuts) == 1 else ''} what sampling "
                    f"draws from, and {how} does not sample; set --decode_temperature above 0 "
                    f"(with one beam) or drop {'it' if len(cuts) == 1 else 'them'}.")
  if f["decode_seed"].present and f.decode_temperature == 0:
    raise UserError(f"--decode_seed seeds sampling's draws, and {how} draws nothing; set "
                    "--decode_temperature above 0 (with one beam) or drop it.")
  if f["decode_alpha"].present and f.decode_num_beams == 1:
    raise UserError("--decode_alpha is beam search's brevity penalty and one beam has none to "
                    "rank; set --decode_num_beams above 1 or drop --decode_alpha.")
  return decoding.DecodeSettings(
      max_decode_length=f.decode_max_length, temperature=f.decode_temperature,
      top_k=f.decode_top_k, top_p=f.decode_top_p, num_beams=f.decode_num_beams,
      alpha=f.decode_alpha, seed=f.decode_seed, **model.special_ids())


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    fail(f"unexpected positional arguments {argv[1:]}; every option is a --flag.")
  from paxlike import distributed

  try:
    code = run(FLAGS)
  except UserError as e:
    distributed.share_refusal(str(e))
    fail(str(e))
  except Exception:
    # Another process's refusal reaches this one as a failed collective: say that instead.
    if (peer := distributed.peer_refusal()) is not None:
      fail(peer)
    raise
  sys.exit(code)


def cli() -> None:
  app.run(main, flags_parser=lambda argv: parse_flags(argv, __doc__))


if __name__ == "__main__":
  cli()
