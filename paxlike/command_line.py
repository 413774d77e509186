"""main's command line: its flags, Pax's flags it answers for, and their parsing.

`python -m paxlike.main --help` lists these flags in HELP_GROUPS. Pax's Fiddle
flags (--fdl_config, --fdl.KEY=VALUE, --fdl_set) become --exp and --set; Pax's
main.py flags and modes paxlike does not take (PAX_FLAGS_NOT_HERE,
PAX_MODES_NOT_HERE) are refused in one line saying what paxlike does
instead; JAX's own options (--jax_*) are defined when named
(paxlike.jax_flags).
"""

from __future__ import annotations

import sys

from absl import flags, logging

FLAGS = flags.FLAGS
MODES = ("train", "eval", "decode", "decode_once", "infer", "export", "dry_run", "tune")
FOLLOWING_MODES = ("eval", "decode")  # beside a running trainer: each new checkpoint (follow.py)
SEVERAL_STEP_MODES = ("eval", "decode", "decode_once")  # take several --restore_checkpoint_step
EXPORT_FORMATS = ("hf", "stablehlo", "savedmodel")  # paxlike.export.EXPORTERS

flags.DEFINE_string("exp", None, "Experiment: module.Class (looked up in that module; "
                    "see paxlike/registry.py) or a unique suffix of a shipped one; with "
                    "--list_experiments, a module to list.")
flags.DEFINE_string("job_log_dir", None, "Where checkpoints, summaries and dumps go.")
flags.DEFINE_enum("mode", "train", MODES, "What to run.")
flags.DEFINE_multi_string("set", [], "Override a hyperparameter: --set KEY=VALUE (repeatable).")
flags.DEFINE_bool("list_experiments", False, "Print every registered experiment and exit.")
flags.DEFINE_bool("enable_checkpoint_saving", True, "Write checkpoints.")
flags.DEFINE_bool("jax_fully_async_checkpoint", True, "Save checkpoints in the background.")
flags.DEFINE_bool("enable_summary_writer", True, "Write TensorBoard summaries.")
flags.DEFINE_string("restore_checkpoint_dir", None,
                    "A checkpoints/ folder to initialise from when job_log_dir has none.")
flags.DEFINE_multi_integer("restore_checkpoint_step", None, "Restore this step, not the "
                           "latest; --mode=eval, decode and decode_once take several (the "
                           "flag repeated) and run on each in turn. --mode=train without "
                           "--restore_checkpoint_dir rolls the job back to it; the same "
                           "command run again continues from the job's newest step.")
flags.DEFINE_string("checkpoint_todelete_subdir", None, "--mode=train: checkpoints past "
                    "CHECKPOINT_MAX_TO_KEEP move into checkpoints/<this>/ instead of being "
                    "deleted (Pax's flag).")
flags.DEFINE_bool("restore_fallback", False,
                  "If the checkpoint to restore is damaged, move it aside (checkpoint_N.damaged) "
                  "and restore the newest older step.")
flags.DEFINE_bool("skip_nonfinite_steps", False,
                  "Skip updates whose loss or gradient is NaN/Inf instead of stopping the run.")
flags.DEFINE_bool("decode_during_train", False,
                  "Decode the decode datasets at every eval interval (always at the end).")
flags.DEFINE_bool("eval_on_test", True, "--mode=train: run the eval datasets every "
                  "EVAL_INTERVAL_STEPS and at the end (Pax's flag; paxlike's default is on, "
                  "--noeval_on_test turns it off).")
flags.DEFINE_bool("eval_during_decode", False, "--mode=decode / decode_once: also run the "
                  "eval datasets on each checkpoint decoded.")
flags.DEFINE_float("decode_temperature", 0.0, "Sampling temperature; 0 decodes greedily.")
flags.DEFINE_integer("decode_top_k", 0, "Sample among the k most likely tokens (0: all).")
flags.DEFINE_float("decode_top_p", 1.0, "Sample from the smallest set of most likely tokens "
                   "whose probability reaches p (1.0: all).")
flags.DEFINE_integer("decode_num_beams", 1, "Beam search with this many beams (1: no beam "
                     "search).")
flags.DEFINE_integer("decode_seed", 0, "Sampling: the seed of the draws. The same seed, "
                     "settings and checkpoint draw the same samples; another seed, others.")
flags.DEFINE_float("decode_alpha", 0.6, "Beam search brevity penalty ((5 + length) / 6) ** alpha.")
flags.DEFINE_integer("decode_max_length", None, "Generate at most this many tokens (default: "
                     "the rest of the LM's row, or T5's MAX_TARGET_LEN).")
flags.DEFINE_string("tfds_data_dir", None, "The TFDS directory every SeqIO TFDS source of the "
                    "experiment reads, whatever data dir its task names (Pax's flag; needs the "
                    "seqio extra).")
flags.DEFINE_string("infer_input", None, "--mode=infer: a .jsonl file of inputs to predict "
                    "on, one {\"inputs\": ...} object a line (the field is the decode "
                    "dataset's input_key); default: the experiment's decode datasets.")
flags.DEFINE_string("init_from", None, "With no checkpoint in job_log_dir, start from these "
                    "weights (overrides the experiment's INIT_FROM; its INIT_FROM_RULES apply): "
                    "hf:DIR (a Hugging Face save_pretrained directory), paxlike:DIR[@STEP] "
                    "(a paxlike job_log_dir or checkpoints/ folder), t5x:DIR[@STEP] (a T5X "
                    "checkpoint folder or model_dir) or pax:DIR[@STEP] (a Pax LM or "
                    "LLaMA checkpoint: its checkpoint_<step> or checkpoints/ folder).")
flags.DEFINE_enum("export_format", "hf", EXPORT_FORMATS, "--mode=export: what to write (hf: a "
                  "Hugging Face directory that from_pretrained loads; stablehlo: the decode "
                  "(--decode_* flags) as jax.export StableHLO + weights + run.py; savedmodel: a "
                  "TF SavedModel of it for TF Serving, needs the [export] extra).")
flags.DEFINE_string("export_dir", None, "--mode=export: where (default job_log_dir/export/"
                    "<step>/<format>); never overwritten without --export_overwrite.")
flags.DEFINE_bool("export_overwrite", False, "--mode=export: replace an earlier export in the "
                  "export directory.")
flags.DEFINE_string("export_platforms", "cpu,cuda,tpu", "--mode=export (stablehlo, "
                    "savedmodel): the platforms the decode is lowered for, in one artifact.")
flags.DEFINE_bool("pmap_use_tensorstore", False,
                  "pmap runs: save checkpoints through orbax/tensorstore instead of msgpack.")
flags.DEFINE_string("coordinator_address", None, "Multi-host: HOST:PORT of process 0.")
flags.DEFINE_integer("num_processes", None, "Multi-host: how many processes (one per host).")
flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")
flags.DEFINE_integer("distributed_timeout_s", 300,
                     "Multi-host: seconds to wait for the coordinator and the other processes.")
flags.DEFINE_bool("multiprocess_gpu", False, "Pax compatibility; multi-host needs only the "
                  "three flags above.")
PAX_ALIASES = {"server_addr": "coordinator_address", "num_hosts": "num_processes",
               "host_idx": "process_id"}  # Pax's names for the multi-host flags
for _alias, _target in PAX_ALIASES.items():
  flags.DEFINE_alias(_alias, _target)
_FIDDLE = "paxlike builds the experiment from --exp (or Pax's --fdl_config); --set KEY=VALUE " \
          "(or Pax's --fdl.KEY=VALUE) overrides a hyperparameter or a model_params.txt path"
_TUNING = "Pax's automated tuning (Vizier) is not in paxlike; --mode=tune times step layouts"
_TF_DATA = "Pax's tf.data service is not in paxlike (each process reads its own rows of the " \
           "global batch)"
# The flags of Pax's main.py (and of the modules it imports: tf_data_service_lib,
# summary_utils) paxlike does not define: what a Pax launch script gets instead of absl's
# "Unknown command line flag".
PAX_FLAGS_NOT_HERE = {
    "fdl": _FIDDLE, "fdl_config_file": _FIDDLE,
    "enable_auto_sharding": "paxlike shards by the experiment's mesh and its logical-axis "
                            "rules; XLA's auto-sharding is not wired in",
    "enforce_restore_shape_check": "paxlike always checks restored shapes (a changed model is "
                                   "refused before anything is written)",
    "exit_after_ondemand_checkpoint": "paxlike always exits (status 42) after the checkpoint "
                                      "a SIGTERM asks for",
    "tensorstore_use_ocdbt": "paxlike saves in orbax's default tensorstore format",
    "maybe_use_persistence_checkpointing": "paxlike saves with orbax",
    "decode_output_pickle": "paxlike writes decoder_out/<name>/decode_<step>.jsonl, no pickle",
    "globally_use_hardware_rng": "paxlike uses JAX's default PRNG",
    "study": _TUNING, "controller_mode": _TUNING, "tuner_group": _TUNING,
    "metrics_from": _TUNING, "num_trials": _TUNING, "pythia_port": _TUNING,
    "async_timeout_secs": "paxlike's background checkpoint saves take orbax's default "
                          "timeout (--nojax_fully_async_checkpoint saves in the foreground)",
    "startup_random_jitter_max_secs": "paxlike starts every process at once, with no random "
                                      "delay",
    "jax_traceback_filtering_option": "pass JAX's own --jax_traceback_filtering (off, auto, "
                                      "tracebackhide or remove_frames) instead",
    "pax_only_aggregate_summaries": "paxlike writes scalar summaries only",
    **{f"tf_data_service_{name}": _TF_DATA for name in (
        "port", "dispatcher_address", "worker_address", "data_transfer_protocol",
        "data_transfer_address", "work_dir", "fault_tolerant_mode", "worker_addresses",
        "address")},
    # Flags of older Pax releases, still in launch scripts.
    "use_orbax": "paxlike saves with orbax", "jax_array_in_pax": "paxlike uses jax.Array",
    "should_log_compiles": "pass JAX's own --jax_log_compiles instead",
}
# Pax's --mode values paxlike does not take.
PAX_MODES_NOT_HERE = {"tf_data_service_dispatcher": _TF_DATA,
                      "tf_data_service_worker": _TF_DATA}
flags.DEFINE_float("peak_tflops_per_device", None,
                   "Peak TFLOP/s of one device for MFU (default: the device table; on a "
                   "CPU, a matmul calibration).")
flags.DEFINE_enum("pgle", "off", ("off", "auto", "collect", "use"),
                  "Profile-guided latency estimation (GPU only; see paxlike/pgle.py).")
flags.DEFINE_string("pgle_profile_path", None, "--pgle=use: the profile to read; collect: "
                    "where to write it (default job_log_dir/pgle/profile.pb).")
flags.DEFINE_integer("pgle_profiling_runs", None, "Steps PGLE profiles (default: the "
                     "experiment's PGLE_PROFILING_RUNS).")
flags.DEFINE_integer("pgle_aggregation_percentile", None, "Percentile of the profiled "
                     "latencies auto PGLE uses (default: PGLE_AGGREGATION_PERCENTILE).")
flags.DEFINE_integer("profile_steps", None, "Trace this many training steps with jax.profiler "
                     "into job_log_dir/profile/ and summarise them (GEMM, attention, other ops, "
                     "collectives, host gaps) in the log and profile/summary.json (default: the "
                     "experiment's PROFILER_NUM_STEPS; 0: off).")
flags.DEFINE_integer("profile_start_step", None, "The first traced step (default: "
                     "PROFILER_CAPTURE_STEP, else 3: after compilation and warm-up).")
flags.DEFINE_string("target", "tpu_v5p", "--mode=dry_run: the device kind whose memory the "
                    "step must fit (tpu_v4, tpu_v5e, tpu_v5p, tpu_v6e, a100, h100, h200).")
flags.DEFINE_bool("dry_run_layouts", False, "--mode=dry_run: also compile every layout "
                  "--mode=tune would try (scanned or unrolled, each remat policy) and table "
                  "their memory per device and whether it fits --target, untimed; slower.")
flags.DEFINE_integer("jax_profiler_port", None, "Start jax.profiler's server on this port, so "
                     "TensorBoard's profile tab can capture a trace of the running job.")
flags.DEFINE_float("device_memory_gib", None, "--mode=train: the memory a device may use; the "
                   "compiled step is checked against it before step 1 and a step that needs "
                   "more is refused (a GPU shared with others, or a budget to test against).")


# --help lists main's flags in these groups (paxlike.flag_help; a flag in none is listed
# under "Other").
HELP_GROUPS = (
    ("Run", ("exp", "job_log_dir", "mode", "set", "list_experiments", "tfds_data_dir")),
    ("Training, checkpoints and initial weights", (
        "init_from", "restore_checkpoint_dir", "restore_checkpoint_step", "restore_fallback",
        "enable_checkpoint_saving", "jax_fully_async_checkpoint", "checkpoint_todelete_subdir",
        "pmap_use_tensorstore", "enable_summary_writer", "skip_nonfinite_steps",
        "decode_during_train", "eval_on_test")),
    ("Decode and infer", (
        "decode_temperature", "decode_top_k", "decode_top_p", "decode_seed", "decode_num_beams",
        "decode_alpha", "decode_max_length", "eval_during_decode", "infer_input")),
    ("Export (--mode=export)", (
        "export_format", "export_dir", "export_overwrite", "export_platforms")),
    ("Performance: MFU, PGLE, profiles, dry run", (
        "peak_tflops_per_device", "pgle", "pgle_profile_path", "pgle_profiling_runs",
        "pgle_aggregation_percentile", "profile_steps", "profile_start_step",
        "jax_profiler_port", "target", "dry_run_layouts", "device_memory_gib")),
    ("Multi-host", (
        "coordinator_address", "num_processes", "process_id", "distributed_timeout_s",
        "multiprocess_gpu")),
)
HELP_ARGS = ("--help", "-help", "-h", "-?", "--helpshort")
USAGE = ("usage: python -m paxlike.main --exp=NAME --job_log_dir=DIR [--mode=MODE] "
         "[--set KEY=VALUE ...] [flags]")


def fail(message: str) -> None:
  """`error: <message>` on stderr, exit status 2 (every refusal's end)."""
  logging.flush()
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def pax_fiddle_flags(args: list[str]) -> list[str]:
  """Pax's Fiddle flags as paxlike's: --fdl_config=NAME is --exp=NAME, a class that need not
  be registered (registry.FDL_CONFIG), and --fdl.KEY=VALUE and --fdl_set=KEY=VALUE are
  --set KEY=VALUE (a Pax run script's overrides, verbatim)."""
  from paxlike import registry  # stdlib only: nothing imports JAX yet

  out, i = [], 0
  while i < len(args):
    arg = args[i]
    name, eq, value = arg.partition("=")
    if name in ("--fdl_config", "--fdl_set") and not eq and i + 1 < len(args):
      i, eq, value = i + 1, "=", args[i + 1]  # the value as the next argument
    if name == "--fdl_config" and eq:
      if any(a == "--exp" or a.startswith("--exp=") for a in args):
        fail("--fdl_config and --exp both name the experiment; pass one of them.")
      out.append(f"--exp={registry.FDL_CONFIG}{value}")
    elif name == "--fdl_set" and eq:
      out += ["--set", value]
    elif name.startswith("--fdl.") and len(name) > len("--fdl.") and eq:
      out += ["--set", f"{name[len('--fdl.'):]}={value}"]
    else:
      out.append(arg)
    i += 1
  return out


def parse_flags(argv: list[str], doc: str) -> list[str]:
  """absl's parse of main's argv, after Pax's Fiddle flags are made paxlike's; --help prints
  the grouped flags with the last paragraph of `doc` (main's), --helpfull JAX's too."""
  cut = argv.index("--") if "--" in argv else len(argv)
  argv = [argv[0], *pax_fiddle_flags(argv[1:cut]), *argv[cut:]]
  args = argv[1:argv.index("--")] if "--" in argv else argv[1:]
  if any(a in HELP_ARGS for a in args):  # absl's own --help exits 1, ungrouped
    from paxlike import flag_help

    print(flag_help.text(FLAGS.get_flags_for_module(sys.modules[__name__]), HELP_GROUPS,
                         PAX_ALIASES, [USAGE, "", doc.strip().split("\n\n")[-1]]))
    sys.exit(0)
  from paxlike import jax_flags

  if "--helpfull" in args:
    jax_flags.define(FLAGS)
    print(FLAGS.get_help())
    sys.exit(0)
  for i, arg in enumerate(args):
    name, _, value = arg.lstrip("-").partition("=") if arg.startswith("-") else ("", "", "")
    name = name[2:] if name.startswith("no") and name[2:] in PAX_FLAGS_NOT_HERE else name
    if name in PAX_FLAGS_NOT_HERE:
      fail(f"--{name} is a Pax flag paxlike does not take: {PAX_FLAGS_NOT_HERE[name]}; "
           "drop it (docs/flags.md lists the Pax flags paxlike takes).")
    if name == "mode" and not value and i + 1 < len(args):
      value = args[i + 1]  # --mode MODE
    if name == "mode" and value in PAX_MODES_NOT_HERE:
      fail(f"--mode={value} is a Pax mode paxlike does not take: {PAX_MODES_NOT_HERE[value]}; "
           f"pass one of {', '.join(MODES)}.")
  jax_flags.define_if_named(args, FLAGS)  # --jax_*: JAX's own options, as in Pax's main.py
  try:
    return FLAGS(argv)
  except flags.Error as e:
    fail(str(e).rstrip(" ?.") + ("?" if str(e).rstrip().endswith("?") else "."))
  return []
