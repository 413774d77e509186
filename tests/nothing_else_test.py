"""Nothing runs but what was asked: the CLI refuses, in one line and before it writes
anything, an --exp it would resolve elsewhere, a mode or flag with nothing to do, a
remote job_log_dir and a user module that shadows JAX's CUDA packages."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from conftest import TINY, describe, parse_trained_line, run_cli

# A user's own c4.py: one class that shadows a shipped name but was never registered,
# and one registered experiment.
USER_C4 = """\
    from experiments.lm.c4 import C4SpmdGpt3AdamOrgHP as ShippedGpt3
    from experiments.lm.lm_cloud import LmCloudSpmdTiny
    from paxlike import experiment_registry


    class C4SpmdGpt3AdamOrgHP(ShippedGpt3):
      NUM_LAYERS = 2


    @experiment_registry.register
    class MyC4Tiny(LmCloudSpmdTiny):
      NUM_LAYERS = 1
    """

USER_NVIDIA = """\
    from experiments.lm.lm_cloud import LmCloudSpmdTiny
    from paxlike import experiment_registry


    @experiment_registry.register
    class X(LmCloudSpmdTiny):
      NUM_LAYERS = 1
    """


def _module(tmp_path: Path, name: str, source: str) -> Path:
  """A directory holding name.py, to put on PYTHONPATH."""
  src = tmp_path / "src"
  src.mkdir(exist_ok=True)
  (src / f"{name}.py").write_text(textwrap.dedent(source))
  return src


def _refused(proc, *needles: str) -> str:
  """The one `error:` line of a run that exited 2 without a traceback."""
  assert proc.returncode == 2, describe(proc)
  assert "Traceback" not in proc.stderr, describe(proc)
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, describe(proc)
  assert proc.stderr.rstrip().endswith(errors[0]), describe(proc)
  for needle in needles:
    assert needle in errors[0], describe(proc)
  assert "?." not in errors[0]
  return errors[0]


def test_an_unregistered_class_in_the_users_module_is_refused_not_the_shipped_one_run(
    tmp_path):
  src = _module(tmp_path, "c4", USER_C4)
  job = tmp_path / "job"
  proc = run_cli(["--exp=c4.C4SpmdGpt3AdamOrgHP", f"--job_log_dir={job}", "--mode=dry_run"],
                 cwd=tmp_path, pythonpath=[src])
  line = _refused(proc, "c4.C4SpmdGpt3AdamOrgHP", "not a registered experiment",
                  "@experiment_registry.register", str(src / "c4.py"))
  assert "experiments.lm.c4" not in line
  assert not job.exists()


def test_list_experiments_of_a_module_lists_that_modules_experiments(tmp_path):
  src = _module(tmp_path, "c4", USER_C4)
  proc = run_cli(["--list_experiments", "--exp=c4"], cwd=tmp_path, pythonpath=[src])
  assert proc.returncode == 0, describe(proc)
  assert proc.stdout.split() == ["c4.MyC4Tiny"], describe(proc)
  # The shipped module of that name is `lm.c4`, the shipped experiments' path.
  proc = run_cli(["--list_experiments", "--exp=lm.c4"], cwd=tmp_path, pythonpath=[src])
  assert proc.returncode == 0, describe(proc)
  names = proc.stdout.split()
  assert "experiments.lm.c4.C4SpmdGpt3AdamOrgHP" in names, describe(proc)
  assert all(n.startswith("experiments.lm.c4.") for n in names), describe(proc)


def test_list_experiments_of_a_module_that_does_not_exist_is_refused(tmp_path):
  proc = run_cli(["--list_experiments", "--exp=no_such_module_xyz"], cwd=tmp_path)
  _refused(proc, "no_such_module_xyz", "drop --exp")


@pytest.mark.parametrize("args, needles", [
    (["--mode=eval"], [TINY, "no eval datasets", "--mode=eval has nothing to evaluate"]),
    (["--mode=decode"], [TINY, "no decode datasets", "--mode=decode has nothing to decode"]),
    (["--decode_during_train"], [TINY, "--decode_during_train", "no decode datasets"]),
    (["--mode=eval", "--decode_during_train"], ["--decode_during_train",
                                                "read only by --mode=train"]),
], ids=["eval", "decode", "decode_during_train", "decode_during_train_in_eval"])
def test_a_mode_or_flag_with_nothing_to_do_is_refused_before_the_job_exists(
    tmp_path, args, needles):
  # LmCloudSpmdTiny has a training input only: nothing to evaluate or decode.
  job = tmp_path / "job"
  proc = run_cli([f"--exp={TINY}", f"--job_log_dir={job}", *args], cwd=tmp_path)
  _refused(proc, *needles)
  assert not job.exists()


@pytest.mark.parametrize("flag", ["--job_log_dir=gs://bucket/x", "--job_log_dir=s3://b/x"])
def test_a_remote_job_log_dir_is_refused_before_anything_starts(tmp_path, flag):
  proc = run_cli([f"--exp={TINY}", flag], cwd=tmp_path)
  _refused(proc, flag.split("=", 1)[1], "remote directories are not supported yet",
           "mounted bucket")
  assert list(tmp_path.iterdir()) == []  # no local `gs:` folder


def test_a_user_module_named_nvidia_is_refused_in_one_line(tmp_path):
  src = _module(tmp_path, "nvidia", USER_NVIDIA)
  job = tmp_path / "job"
  proc = run_cli(["--exp=nvidia.X", f"--job_log_dir={job}", "--mode=dry_run"], cwd=tmp_path,
                 pythonpath=[src])
  _refused(proc, str(src / "nvidia.py"), "shadows the nvidia CUDA packages", "rename it",
           "--exp=nvidia_experiments.X")
  assert not job.exists()


def test_set_accepts_the_task_paths_model_params_txt_prints(tmp_path):
  job = tmp_path / "job"
  proc = run_cli([f"--exp={TINY}", f"--job_log_dir={job}", "--set",
                  "task.train.num_train_steps=1", "--set", "PERCORE_BATCH_SIZE=2",
                  "--enable_checkpoint_saving=false"], cwd=tmp_path)
  assert proc.returncode == 0, describe(proc)
  assert parse_trained_line(proc.stdout)["final_step"] == 1
  printed = (job / "model_params.txt").read_text()
  assert "task.train.num_train_steps: int = 1" in printed
