"""End to end through the CLI: `python -m paxlike.main` in a subprocess."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
import types

import pytest
from conftest import (
    TINY,
    TINY_KEY,
    describe,
    expected_param_count,
    parse_cls_vars,
    parse_model_analysis,
    parse_trained_line,
    read_scalars,
    run_cli,
)

from paxlike import experiment, main, registry

TINY_SETS = ["--set", "NUM_TRAIN_STEPS=40", "--set", "SUMMARY_INTERVAL_STEPS=10",
             "--set", "CHECKPOINT_EVERY_N_STEPS=20"]


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory):
  """One 40-step LmCloudSpmdTiny run on 1 device, shared by the tests below."""
  cwd = tmp_path_factory.mktemp("tiny_cwd")
  job = cwd / "jobs" / "tiny"
  proc = run_cli([f"--exp={TINY}", "--job_log_dir=jobs/tiny", *TINY_SETS], cwd=cwd)
  assert proc.returncode == 0, describe(proc)
  return proc, job


def test_tiny_run_trains_and_the_loss_drops(tiny_job):
  proc, job = tiny_job
  trained = parse_trained_line(proc.stdout)
  assert (trained["start_step"], trained["final_step"]) == (0, 40)
  assert (trained["first_step"], trained["last_step"]) == (1, 40)
  # ln(256) = 5.5 at the start; the synthetic stream is learnable.
  assert trained["first_loss"] > 5.0
  assert trained["last_loss"] < 0.6 * trained["first_loss"], proc.stdout
  assert str(job) in proc.stdout
  assert "Traceback" not in proc.stderr


def test_tiny_run_writes_checkpoints_at_the_requested_steps(tiny_job):
  _, job = tiny_job
  steps = sorted(p.name for p in (job / "checkpoints").iterdir())
  assert steps == ["checkpoint_00000020", "checkpoint_00000040"]
  for step in steps:
    assert (job / "checkpoints" / step / "state").is_dir()


def test_tiny_run_writes_train_summaries(tiny_job):
  _, job = tiny_job
  train_dir = job / "summaries" / "train"
  assert list(train_dir.glob("events.out.tfevents.*"))
  scalars = read_scalars(train_dir)
  for tag in ("loss", "learning_rate", "grad_norm", "steps_per_sec", "tokens_per_sec"):
    assert tag in scalars, sorted(scalars)
  loss = dict(scalars["loss"])
  assert sorted(loss) == [1, 10, 20, 30, 40]
  assert loss[40] < 0.6 * loss[1]
  # The learning rate warms up over LR_COS_WARMUP=20 steps.
  lr = dict(scalars["learning_rate"])
  assert lr[1] < lr[10] < lr[20]


def test_tiny_run_dumps_hyperparameters_with_provenance(tiny_job):
  _, job = tiny_job
  text = (job / "experiment_cls_vars.txt").read_text()
  assert "NUM_LAYERS : 2" in text.splitlines()
  sections = parse_cls_vars(text)
  assert sections[TINY_KEY]["NUM_LAYERS"] == "2"
  assert sections["--set"] == {"NUM_TRAIN_STEPS": "40", "SUMMARY_INTERVAL_STEPS": "10",
                               "CHECKPOINT_EVERY_N_STEPS": "20"}


def test_tiny_run_dumps_model_params(tiny_job):
  _, job = tiny_job
  text = (job / "model_params.txt").read_text()
  assert re.search(r"^task\.model\.model_dims\b.*\b64$", text, re.M), text
  assert re.search(r"^task\.model\.num_layers\b.*\b2$", text, re.M), text
  assert re.search(r"^task\.train\.num_train_steps\b.*\b40$", text, re.M), text
  assert re.search(r"^datasets\[0\]\.batch_size\b.*\b16$", text, re.M), text


def test_tiny_run_dumps_model_analysis(tiny_job):
  _, job = tiny_job
  rows, total = parse_model_analysis((job / "model_analysis.txt").read_text())
  assert total == expected_param_count(num_layers=2, model_dims=64, hidden_dims=256,
                                       vocab_size=256, dims_per_head=16)
  assert total == sum(int(r["count"].replace(",", "")) for r in rows.values())
  assert rows["softmax/embedding"]["shape"] == "(256, 64)"
  assert rows["softmax/embedding"]["dtype"] == "float32"


def test_tiny_run_writes_the_input_specs_as_pax_does(tiny_job):
  _, job = tiny_job
  specs = json.loads((job / "input_specs.json").read_text())
  # A host's batch (16 rows of MAX_SEQ_LEN 64) in Pax's layout.
  assert specs["ids"] == {"_array": {"shape": [16, 64], "dtype": "int32"}}
  assert set(specs) >= {"ids", "labels", "weights"}


def test_tiny_run_records_the_environment(tiny_job):
  _, job = tiny_job
  env = json.loads((job / "run_env.json").read_text())
  assert env["device_count"] == 1
  assert env["experiment"] == TINY_KEY
  assert "--xla_force_host_platform_device_count=1" in env["XLA_FLAGS"]


def test_eval_intervals_also_evaluate_the_next_training_batch_as_pax_does(tmp_path):
  """task.train.eval_skip_train = False, Pax's default: every eval interval also evaluates
  the next training batch, into summaries/eval_train; True skips it."""
  sets = ["--set", "NUM_TRAIN_STEPS=4", "--set", "EVAL_INTERVAL_STEPS=2", "--set",
          "PERCORE_BATCH_SIZE=4", "--enable_checkpoint_saving=false"]
  proc = run_cli([f"--exp={TINY}", "--job_log_dir=job", *sets], cwd=tmp_path)
  assert proc.returncode == 0, describe(proc)
  train_evals = read_scalars(tmp_path / "job" / "summaries" / "eval_train")
  assert sorted(dict(train_evals["loss"])) == [2], train_evals  # the intervals before the end
  assert 0 < dict(train_evals["loss"])[2] < 10.0  # about ln(256) this early
  assert sorted(dict(read_scalars(tmp_path / "job" / "summaries" / "eval_test_eval")["loss"])) \
      == [2, 4]  # the synthetic stream's eval input: the intervals and the end
  skip = run_cli([f"--exp={TINY}", "--job_log_dir=skip", *sets, "--set",
                  "train.eval_skip_train=True"], cwd=tmp_path)
  assert skip.returncode == 0, describe(skip)
  assert not (tmp_path / "skip" / "summaries" / "eval_train").exists()


def test_an_eval_run_keeps_the_record_of_how_the_job_was_trained(tiny_job, tmp_path):
  """Another mode writes its records with its name in front, as Pax does: the training
  run's experiment_cls_vars.txt (its --set section), model_params.txt and run_env.json
  stay as they were. It takes the training run's --set values, but for those it sets."""
  _, job = tiny_job
  copy = tmp_path / "tiny_copy"
  shutil.copytree(job, copy)
  names = ("experiment_cls_vars.txt", "model_params.txt", "run_env.json", "input_specs.json")
  before = {n: (copy / n).read_bytes() for n in names}
  # EVAL_INTERVAL_STEPS > 0 gives the synthetic stream's eval input.
  proc = run_cli([f"--exp={TINY}", f"--job_log_dir={copy}", "--mode=eval", "--set",
                  "EVAL_INTERVAL_STEPS=20", "--set", "SUMMARY_INTERVAL_STEPS=5"], cwd=tmp_path)
  assert proc.returncode == 0, describe(proc)
  assert {n: (copy / n).read_bytes() for n in names} == before
  assert json.loads((copy / "eval_run_env.json").read_text())["mode"] == "eval"
  assert (f"--mode=eval takes the training settings of {copy}: --set NUM_TRAIN_STEPS=40 "
          "--set CHECKPOINT_EVERY_N_STEPS=20 (its run_env.json") in proc.stderr, describe(proc)
  records = parse_cls_vars((copy / "eval_experiment_cls_vars.txt").read_text())
  assert records["--set"] == {"EVAL_INTERVAL_STEPS": "20", "SUMMARY_INTERVAL_STEPS": "5"}
  assert records[experiment.JOB_SOURCE] == {"NUM_TRAIN_STEPS": "40",
                                            "CHECKPOINT_EVERY_N_STEPS": "20"}
  assert json.loads((copy / "eval_run_env.json").read_text())["job_overrides"] == [
      "NUM_TRAIN_STEPS=40", "CHECKPOINT_EVERY_N_STEPS=20"]


def test_a_run_on_another_jobs_checkpoint_reads_that_jobs_records(tmp_path):
  """--restore_checkpoint_dir=<job>/checkpoints (or a checkpoint in it): the tokenizer and
  the training --set values are those of <job>, whose weights these are, even when
  job_log_dir has records of its own."""
  cls = registry.get(TINY)
  trained, new = tmp_path / "trained", tmp_path / "new"
  for job, layers in ((trained, 1), (new, 2)):
    (job / "vocabulary").mkdir(parents=True)
    (job / "vocabulary" / "tokenizer.json").write_text("{}")
    (job / "run_env.json").write_text(json.dumps({
        "mode": "train", "experiment": f"{cls.__module__}.{cls.__qualname__}",
        "overrides": [f"NUM_LAYERS={layers}", "MAX_SEQ_LEN=32", "MAX_CKPT_TO_KEEP=3"]}))
  for restore in (trained / "checkpoints", trained / "checkpoints" / "checkpoint_00000020"):
    assert main._vocabulary_job(str(new), str(restore)) == str(trained)
    flags = types.SimpleNamespace(mode="infer", job_log_dir=str(new),
                                  restore_checkpoint_dir=str(restore))
    # A name this paxlike no longer takes (Pax's MAX_CKPT_TO_KEEP) is left out.
    assert main._training_overrides(cls, flags, ["MAX_SEQ_LEN=64"]) == (
        str(trained), ["NUM_LAYERS=1"], None)
  assert main._vocabulary_job(str(new), None) == str(new)
  flags = types.SimpleNamespace(mode="train", job_log_dir=str(new),
                                restore_checkpoint_dir=str(trained / "checkpoints"))
  assert main._training_overrides(cls, flags, []) == (None, [], None)  # its own only


def test_a_later_run_reads_the_training_runs_files_from_where_it_started(tmp_path):
  """Relative TRAIN_FILES / EVAL_FILES of the training run are read from where it started,
  in each way they can be written; one that is gone is refused, not looked for here."""
  (tmp_path / "data").mkdir()
  for name in ("a.jsonl", "b.jsonl"):
    (tmp_path / "data" / name).write_text("{}\n")
  data = tmp_path / "data"
  cls = registry.get("LlamaTiny")
  for written, expected in (
      ("data/a.jsonl", [str(data / "a.jsonl")]),
      ('["data/a.jsonl", "data/*.jsonl"]', [str(data / "a.jsonl"), str(data / "*.jsonl")]),
      ("[data/a.jsonl,data/b.jsonl]", [str(data / "a.jsonl"), str(data / "b.jsonl")]),
      (str(data / "b.jsonl"), [str(data / "b.jsonl")])):
    exp = experiment.instantiate(cls, [f"TRAIN_FILES={written}", "INPUT_KEY=output"])
    exp.__dict__["_inherited"] = {"TRAIN_FILES", "INPUT_KEY"}
    main._job_files(exp, "job", str(tmp_path))
    assert exp.TRAIN_FILES == expected and exp.INPUT_KEY == "output"  # a field, not a path
  exp = experiment.instantiate(cls, ["EVAL_FILES=data/gone.jsonl"])
  exp.__dict__["_inherited"] = {"EVAL_FILES"}
  with pytest.raises(main.UserError, match=r"this run takes EVAL_FILES='data/gone.jsonl' from "
                                           r"the training run of job, and .*gone\.jsonl "
                                           r"matches no file now; pass --set EVAL_FILES="):
    main._job_files(exp, "job", str(tmp_path))


def test_rerun_in_the_same_dir_resumes_from_the_last_checkpoint(tiny_job, tmp_path):
  _, job = tiny_job
  copy = tmp_path / "tiny_copy"
  shutil.copytree(job, copy)
  sets = [s.replace("NUM_TRAIN_STEPS=40", "NUM_TRAIN_STEPS=50") for s in TINY_SETS]
  proc = run_cli([f"--exp={TINY}", f"--job_log_dir={copy}", *sets], cwd=tmp_path)
  assert proc.returncode == 0, describe(proc)
  trained = parse_trained_line(proc.stdout)
  assert (trained["start_step"], trained["final_step"]) == (40, 50)
  assert (copy / "checkpoints" / "checkpoint_00000050").is_dir()
  # Training continued from the trained model, not from scratch.
  first = parse_trained_line(tiny_job[0].stdout)
  assert trained["first_loss"] < 0.6 * first["first_loss"]


def test_script_form_runs(tmp_path):
  proc = run_cli([f"--exp={TINY}", "--job_log_dir=job", "--set", "NUM_TRAIN_STEPS=2",
                  "--set", "SUMMARY_INTERVAL_STEPS=1", "--enable_checkpoint_saving=false"],
                 cwd=tmp_path, script=True)
  assert proc.returncode == 0, describe(proc)
  trained = parse_trained_line(proc.stdout)
  assert (trained["start_step"], trained["final_step"]) == (0, 2)
  assert (tmp_path / "job" / "model_analysis.txt").is_file()
  assert not (tmp_path / "job" / "checkpoints").exists() or not any(
      (tmp_path / "job" / "checkpoints").iterdir())
  # No library warnings in the log (orbax's about its restore-only manager, for one).
  assert not re.findall(r"^[WE]\d{4} .*", proc.stderr, re.M), proc.stderr


# Every flag Pax's main.py defines (paxml HEAD, with those of tf_data_service_lib and
# summary_utils, which it imports, and of older releases), and its --mode values.
PAX_MAIN_FLAGS = (
    "exp", "job_log_dir", "mode", "eval_on_test", "decode_during_train", "eval_during_decode",
    "maybe_use_persistence_checkpointing", "jax_fully_async_checkpoint",
    "exit_after_ondemand_checkpoint", "tensorstore_use_ocdbt", "async_timeout_secs",
    "startup_random_jitter_max_secs", "jax_traceback_filtering_option", "decode_output_pickle",
    "checkpoint_todelete_subdir", "restore_checkpoint_dir", "restore_checkpoint_step",
    "globally_use_hardware_rng", "jax_profiler_port", "enable_auto_sharding",
    "enable_checkpoint_saving", "enforce_restore_shape_check", "study", "controller_mode",
    "tuner_group", "metrics_from", "num_trials", "pythia_port", "tfds_data_dir",
    "multiprocess_gpu", "server_addr", "num_hosts", "host_idx", "fdl", "enable_summary_writer",
    "pmap_use_tensorstore", "pax_only_aggregate_summaries", "tf_data_service_port",
    "tf_data_service_dispatcher_address", "tf_data_service_worker_address",
    "tf_data_service_data_transfer_protocol", "tf_data_service_data_transfer_address",
    "tf_data_service_work_dir", "tf_data_service_fault_tolerant_mode",
    "tf_data_service_worker_addresses", "tf_data_service_address", "use_orbax",
    "jax_array_in_pax", "should_log_compiles")
PAX_MODES = ("train", "eval", "decode", "decode_once", "infer", "tf_data_service_dispatcher",
             "tf_data_service_worker")


def test_every_pax_main_flag_and_mode_is_taken_or_refused_in_one_line(capsys):
  """A Pax launch line's flag is either paxlike's too or refused saying what paxlike does
  instead, never absl's bare "Unknown command line flag"."""
  from paxlike import command_line as cl

  def refusal(args: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
      cl.parse_flags(["main", *args], main.__doc__)  # refused before absl parses anything
    assert e.value.code == 2
    return capsys.readouterr().err

  for name in PAX_MAIN_FLAGS:
    if name in cl.FLAGS:
      continue
    err = refusal([f"--{name}=1"])
    assert re.fullmatch(rf"error: --{name} is a Pax flag paxlike does not take: [^\n]+\n",
                        err), err
  assert "--jax_traceback_filtering (off" in refusal(["--jax_traceback_filtering_option=off"])
  for mode in PAX_MODES:
    if mode in cl.MODES:
      continue
    for args in ([f"--mode={mode}"], ["--mode", mode]):
      err = refusal(args)
      assert re.fullmatch(rf"error: --mode={mode} is a Pax mode paxlike does not take: "
                          r"Pax's tf\.data service is not in paxlike [^\n]+; pass one of "
                          r"train, eval, [^\n]+\.\n", err), err


@pytest.mark.parametrize("flag, why", [
    ("--enable_checkpoint_saving=false", "only --mode=train writes checkpoints"),
    ("--nojax_fully_async_checkpoint", "only --mode=train writes checkpoints"),
    ("--pmap_use_tensorstore", "a run reads a checkpoint in whichever format it was saved"),
])
def test_checkpoint_saving_flags_are_refused_outside_training(tmp_path, flag, why):
  """Only training saves checkpoints (and every mode reads either format): in --mode=eval
  these flags would do nothing, so they are refused like --eval_on_test."""
  import copy

  from paxlike.command_line import FLAGS
  from paxlike.errors import UserError

  values = copy.deepcopy(FLAGS)
  values.unparse_flags()
  values(["main", f"--exp={TINY}", f"--job_log_dir={tmp_path / 'job'}", "--mode=eval", flag])
  name = flag.lstrip("-").split("=")[0].removeprefix("no")
  with pytest.raises(UserError) as e:
    main._experiment(values)
  assert str(e.value).startswith(f"--{name} is read only by --mode=train, not --mode=eval; "
                                 f"drop it ({why}"), e.value


def test_a_pax_run_scripts_fiddle_flags_run_as_exp_and_set(tmp_path):
  """Pax's GPU scripts pass --fdl_config=CLASS and --fdl.KNOB=VALUE (strings quoted, as the
  shell leaves them): they are --exp and --set, values and all."""
  from paxlike.command_line import pax_fiddle_flags

  assert pax_fiddle_flags(["--fdl_config", "a.B", '--fdl.LR_SCHEDULE="constant"',
                           "--fdl_set=X=[1, 2]", "--mode=eval"]) == [
      "--exp=fdl_config:a.B", "--set", 'LR_SCHEDULE="constant"', "--set", "X=[1, 2]",
      "--mode=eval"]
  proc = run_cli([f"--fdl_config={TINY}", "--job_log_dir=job", "--fdl.NUM_TRAIN_STEPS=2",
                  "--fdl_set=SUMMARY_INTERVAL_STEPS=1", '--fdl.LR_SCHEDULE="constant"',
                  "--enable_checkpoint_saving=false"], cwd=tmp_path)
  assert proc.returncode == 0, describe(proc)
  assert parse_trained_line(proc.stdout)["final_step"] == 2
  sets = parse_cls_vars((tmp_path / "job" / "experiment_cls_vars.txt").read_text())["--set"]
  assert sets == {"LR_SCHEDULE": "'constant'", "NUM_TRAIN_STEPS": "2",
                  "SUMMARY_INTERVAL_STEPS": "1"}


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_exits_0_and_lists_every_flag_in_its_group(tmp_path, flag):
  from paxlike import command_line as cl

  proc = run_cli([flag], tmp_path)
  assert proc.returncode == 0, describe(proc)
  assert proc.stdout.startswith("usage: python -m paxlike.main --exp=NAME --job_log_dir=DIR")
  listed = re.findall(r"^  --(?:\[no\])?(\w+)", proc.stdout, re.M)
  grouped = [n for _, names in cl.HELP_GROUPS for n in names]
  assert listed == grouped  # each once, in its group, none left under "Other"
  defined = {f.name for f in cl.FLAGS.get_flags_for_module(cl)} - set(cl.PAX_ALIASES)
  assert set(grouped) == defined
  for title, _ in cl.HELP_GROUPS:
    assert f"\n{title}:\n" in proc.stdout
  modes = "|".join(cl.FLAGS["mode"].parser.enum_values)
  assert {"train", "eval", "decode", "infer", "export", "dry_run", "tune"} <= set(modes.split("|"))
  assert f"--mode (one of {modes}; default train)" in proc.stdout
  assert "--coordinator_address (Pax's --server_addr)" in proc.stdout


def test_user_experiment_in_its_own_module_runs_through_main(tmp_path):
  moddir = tmp_path / "src"
  moddir.mkdir()
  (moddir / "usermod.py").write_text(textwrap.dedent("""\
      from experiments.lm.lm_cloud import LmCloudSpmdTiny
      from paxlike import experiment_registry


      @experiment_registry.register
      class MyTiny(LmCloudSpmdTiny):
        MODEL_DIMS = 32
        NUM_LAYERS = 1
      """))
  proc = run_cli(["--exp=usermod.MyTiny", "--job_log_dir=job", "--set", "NUM_TRAIN_STEPS=3",
                  "--set", "SUMMARY_INTERVAL_STEPS=1"], cwd=tmp_path, pythonpath=[moddir])
  assert proc.returncode == 0, describe(proc)
  assert parse_trained_line(proc.stdout)["final_step"] == 3
  job = tmp_path / "job"

  rows, total = parse_model_analysis((job / "model_analysis.txt").read_text())
  assert rows["softmax/embedding"]["shape"] == "(256, 32)"
  layer_shapes = {r["shape"] for n, r in rows.items() if n.startswith("transformer/")}
  assert "(1, 32, 128)" in layer_shapes  # ffn1: 1 layer, 32 -> 4 x 32
  assert total == expected_param_count(num_layers=1, model_dims=32, hidden_dims=128,
                                       vocab_size=256, dims_per_head=8)

  sections = parse_cls_vars((job / "experiment_cls_vars.txt").read_text())
  assert sections["usermod.MyTiny"] == {"MODEL_DIMS": "32", "NUM_LAYERS": "1"}
  assert sections[TINY_KEY]["PERCORE_BATCH_SIZE"] == "16"
  assert sections["experiments.lm.lm_cloud.CpuSized"]["NUM_HEADS"] == "4"


def _error_line(proc) -> str:
  assert proc.returncode == 2, describe(proc)
  assert "Traceback" not in proc.stderr, describe(proc)
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, describe(proc)
  return errors[0]


@pytest.mark.parametrize("args, devices, expected", [
    pytest.param(["--exp=LmCloudSpmdTiyn"], 1, ["LmCloudSpmdTiny"], id="unknown_exp"),
    pytest.param([f"--exp={TINY}", "--set", "MODEL_DIM=128"], 1, ["MODEL_DIM", "MODEL_DIMS"],
                 id="unknown_set_key"),
    pytest.param([f"--exp={TINY}", "--set", "NUM_LAYERS=abc"], 1, ["NUM_LAYERS", "int"],
                 id="wrong_type_set"),
    pytest.param([f"--exp={TINY}", "--set", "ICI_MESH_SHAPE=[1, 3, 1]"], 8,
                 [r"\b3\b", r"\b8\b"], id="mesh_device_mismatch"),
    pytest.param([], 1, ["--exp"], id="missing_exp"),
    pytest.param([f"--exp={TINY}", "--no_such_flag=1"], 1, ["no_such_flag"], id="unknown_flag"),
    pytest.param([f"--exp={TINY}", "--fdl_config_file=exp.json"], 1,
                 ["--fdl_config_file is a Pax flag", "--fdl.KEY=VALUE"],
                 id="pax_fdl_config_file"),
    pytest.param([f"--exp={TINY}", f"--fdl_config={TINY}"], 1,
                 ["--fdl_config and --exp both name the experiment"], id="fdl_config_and_exp"),
    pytest.param([f"--fdl_config={TINY}", "--fdl.MODEL_DIM=128"], 1, ["MODEL_DIM", "MODEL_DIMS"],
                 id="fdl_override_typo"),
    pytest.param([f"--exp={TINY}", "--noenforce_restore_shape_check"], 1,
                 ["--enforce_restore_shape_check is a Pax flag", "always checks"],
                 id="pax_flag_with_no_prefix"),
    # Pax's flags, where the mode has nothing for them to do.
    pytest.param([f"--exp={TINY}", "--mode=decode_once"], 1,
                 ["--mode=decode_once has nothing to decode"], id="decode_once_nothing"),
    pytest.param([f"--exp={TINY}", "--mode=eval", "--eval_on_test"], 1,
                 ["--eval_on_test is read only by --mode=train"], id="eval_on_test_in_eval"),
    pytest.param([f"--exp={TINY}", "--mode=eval", "--eval_during_decode"], 1,
                 ["--eval_during_decode is read only by --mode=decode"],
                 id="eval_during_decode_in_eval"),
    pytest.param([f"--exp={TINY}", "--mode=eval", "--decode_num_beams=4"], 1,
                 [r"--decode_num_beams is read only by --mode=train and decode and decode_once "
                  r"and infer and export, not --mode=eval; drop it\.$"],
                 id="decode_flag_in_eval"),
    pytest.param([f"--exp={TINY}", "--infer_input=new.jsonl"], 1,
                 [r"--infer_input is read only by --mode=infer, not --mode=train; "
                  r"add --mode=infer or drop --infer_input\.$"], id="infer_input_in_train"),
    pytest.param([f"--exp={TINY}", "--mode=eval", "--nodecode_during_train"], 1,
                 [r"--decode_during_train is read only by --mode=train, not --mode=eval"],
                 id="decode_during_train_in_eval"),
    pytest.param([f"--exp={TINY}", "--decode_num_beams=4", "--decode_top_k=5"], 1,
                 [r"--decode_top_k cuts what sampling draws from, and beam search does not "
                  r"sample; set --decode_temperature above 0 \(with one beam\) or drop it\.$"],
                 id="top_k_with_beams"),
    pytest.param([f"--exp={TINY}", "--decode_top_p=0.5", "--decode_alpha=1.0"], 1,
                 [r"--decode_top_p cuts what sampling draws from, and greedy decoding"],
                 id="top_p_greedy"),
    pytest.param([f"--exp={TINY}", "--mode=export", "--export_format=hf",
                  "--export_platforms=cpu"], 1,
                 [r"--export_platforms is read by --export_format=stablehlo and savedmodel, "
                  r"not hf"], id="export_platforms_with_hf"),
    pytest.param(["--exp=LlamaTiny", "--mode=infer", "--infer_input=new.jsonl"], 1,
                 [r"job has no checkpoint to predict with; train first"],
                 id="infer_on_an_empty_job"),  # not its tokenizer's fit, looked for after
    pytest.param([f"--exp={TINY}", "--mode=infer", "--restore_checkpoint_dir=/x/checkpoints",
                  "--init_from=hf:/x"], 1,
                 [r"--mode=infer takes its weights from --restore_checkpoint_dir, so "
                  r"--init_from=hf:/x gives neither them nor a tokenizer"],
                 id="init_from_beside_restore_checkpoint_dir"),
    pytest.param([f"--exp={TINY}", "--decode_alpha=1.0"], 1,
                 [r"--decode_alpha is beam search's brevity penalty"], id="alpha_greedy"),
    pytest.param([f"--exp={TINY}", "--process_id=1"], 1,
                 [r"needs --coordinator_address, --num_processes and --process_id together"],
                 id="process_id_alone"),
    pytest.param([f"--exp={TINY}", "--profile_start_step=5"], 1,
                 [r"--profile_start_step=5 starts a trace that nothing asks for"],
                 id="profile_start_step_alone"),
    pytest.param([f"--exp={TINY}", "--target=h100"], 1,
                 [r"--target is read only by --mode=dry_run, not --mode=train"],
                 id="target_in_train"),
    pytest.param([f"--exp={TINY}", "--noeval_on_test", "--set", "TARGET_LOG_PPLX=1.0", "--set",
                  "EVAL_INTERVAL_STEPS=5"], 1, ["TARGET_LOG_PPLX=1.0", "--noeval_on_test"],
                 id="target_log_pplx_without_evals"),
    pytest.param([f"--exp={TINY}", "--restore_checkpoint_step=2",
                  "--restore_checkpoint_step=4"], 1, ["given 2 times", "--mode=train on one"],
                 id="several_steps_to_train_from"),
    pytest.param([f"--exp={TINY}", "--tfds_data_dir=/tmp"], 1,
                 ["--tfds_data_dir is read by SeqIO inputs", "LmCloudSpmdTiny has none"],
                 id="tfds_data_dir_without_seqio"),
    pytest.param([f"--exp={TINY}", "--checkpoint_todelete_subdir=../old"], 1,
                 ["--checkpoint_todelete_subdir='../old' must be a plain folder name"],
                 id="checkpoint_todelete_subdir_path"),
    pytest.param([f"--exp={TINY}", "--jax_profiler_port=0"], 1,
                 ["--jax_profiler_port=0 is not a port"], id="jax_profiler_port_0"),
    # JAX's own options, as Pax's main.py takes them.
    pytest.param([f"--exp={TINY}", "--jax_debug_nan"], 1,
                 ["'jax_debug_nan'", "Did you mean: jax_debug_nans\\?$"], id="jax_option_typo"),
    pytest.param([f"--exp={TINY}", "--jax_enable_pgle"], 1,
                 ["--jax_enable_pgle is JAX's option behind paxlike's --pgle=auto"],
                 id="jax_pgle_option"),
    pytest.param([f"--exp={TINY}", "--mode=dry_run", "--jax_platforms=cuda"], 1,
                 ["--jax_platforms=cuda with --mode=dry_run"], id="jax_platforms_in_dry_run"),
])
def test_cli_errors_exit_2_with_one_error_line(tmp_path, args, devices, expected):
  proc = run_cli([*args, "--job_log_dir=job"], cwd=tmp_path, devices=devices)
  line = _error_line(proc)
  for pattern in expected:
    assert re.search(pattern, line), line
  assert not list((tmp_path / "job").glob("checkpoints/*"))


def test_jax_options_as_flags_take_effect_and_are_recorded(tmp_path):
  """Pax's main.py takes JAX's options as flags: a compilation cache fills, a second run
  reads every compile from it, and run_env.json records the options."""
  cache = tmp_path / "jax_cache"
  args = [f"--exp={TINY}", "--set", "NUM_TRAIN_STEPS=2", f"--jax_compilation_cache_dir={cache}",
          "--jax_persistent_cache_min_compile_time_secs=0", "--nojax_debug_nans"]
  counts = []
  for job in ("first", "second"):
    proc = run_cli([*args, f"--job_log_dir={job}"], cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    found = re.search(rf"compilation cache {re.escape(str(cache))}: (\d+) of (\d+) compiles",
                      proc.stdout + proc.stderr)
    assert found, describe(proc)
    counts.append((int(found[1]), int(found[2])))
  assert any(cache.iterdir())
  (first_hits, requests), (second_hits, second_requests) = counts
  assert requests > 0 and first_hits < requests  # the first run compiled most programs
  assert second_hits == second_requests == requests  # the second compiled none
  env = json.loads((tmp_path / "second" / "run_env.json").read_text())
  assert env["jax_flags"] == {"jax_compilation_cache_dir": str(cache), "jax_debug_nans": False,
                              "jax_persistent_cache_min_compile_time_secs": 0.0}
  assert env["compilation_cache"] == {"dir": str(cache), "hits": requests,
                                      "requests": requests}
  assert env["jax_env"]["JAX_PLATFORMS"] == "cpu"  # JAX_* variables are recorded too


def test_cli_error_for_an_unwritable_job_log_dir(tmp_path):
  (tmp_path / "a_file").write_text("not a directory")
  proc = run_cli([f"--exp={TINY}", "--job_log_dir=a_file/job"], cwd=tmp_path)
  line = _error_line(proc)
  assert "a_file/job" in line and "job_log_dir" in line
