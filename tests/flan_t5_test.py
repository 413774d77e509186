"""Flan-T5 through main.py: train, export to Hugging Face, start from the export, fail clearly."""

from __future__ import annotations

import json

import pytest
import t5x_files
from conftest import describe, parse_trained_line, run_cli

EXP = "FlanT5ArithmeticTiny"
STEPS = 100
# Every training run here has one learning-rate schedule: it is compiled into the train
# step, so runs that share it share one compiled program (a compile of the optimised
# backend costs ~10 s; the pretraining, the fine-tune and its rerun compile it once). It is
# FlanT5SubtractionFromAddition's warmup ending at flan_t5_arithmetic_test's 100 steps, whose
# program that file has compiled earlier in a run of the suite.
SCHEDULE = ["--set", "LR_COS_WARMUP=50", "--set", "LR_COS_DECAY_START=50",
            "--set", f"LR_COS_DECAY_END={STEPS}"]


def short(steps: int) -> list[str]:
  """A run of `steps` steps on the file's schedule."""
  return ["--set", f"NUM_TRAIN_STEPS={steps}", "--set", "EVAL_INTERVAL_STEPS=0", *SCHEDULE,
          "--set", f"SUMMARY_INTERVAL_STEPS={steps}"]


SHORT = short(STEPS)
FINETUNE_STEPS = 60
# Every run that compiles uses the optimised backend, as the training runs do, so that each
# reads the eval, decode and import programs an earlier run compiled; the eval losses
# compared here all come from that one backend.


def listing(root):
  """Every path under root with its size and mtime: what 'unchanged' means."""
  return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
          for p in sorted(root.rglob("*"))}


def eval_loss(stdout: str, prefix: str = "eval test at step") -> float:
  """The loss of stdout's eval line (--mode=eval's; a training run's final eval of its
  test set prints "eval_test_test at step")."""
  line = next(x for x in stdout.splitlines() if x.startswith(prefix))
  return float(line.split("loss ")[1].split()[0])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """A short training run of the CPU-sized Flan-T5, exported as a Hugging Face directory,
  and the eval loss of its final weights (the eval that ends the run)."""
  root = tmp_path_factory.mktemp("flan")
  job = root / "pretrain"
  proc = run_cli([f"--exp={EXP}", f"--job_log_dir={job}", *SHORT], root, timeout=600,
                 optimized=True)
  assert proc.returncode == 0, describe(proc)
  trained_loss = eval_loss(proc.stdout, f"eval_test_test at step {STEPS}:")
  hf_dir = root / "hf"
  proc = run_cli([f"--exp={EXP}", f"--job_log_dir={job}", "--mode=export",
                  "--export_format=hf", f"--export_dir={hf_dir}"], root, optimized=True)
  assert proc.returncode == 0, describe(proc)
  assert {p.name for p in hf_dir.iterdir()} >= {"config.json", "model.safetensors"}
  return root, hf_dir, trained_loss


def test_eval_of_the_imported_weights_equals_the_run_they_came_from(exported):
  root, hf_dir, trained_loss = exported
  proc = run_cli([f"--exp={EXP}", f"--job_log_dir={root / 'score'}", "--mode=eval",
                  f"--init_from=hf:{hf_dir}"], root, optimized=True)
  assert proc.returncode == 0, describe(proc)
  assert eval_loss(proc.stdout) == pytest.approx(trained_loss, rel=1e-5)


def test_eval_from_a_t5x_checkpoint_equals_the_run_it_came_from(exported):
  """A T5X user's checkpoint (T5X's msgpack + TensorStore format, some arrays inline, some
  copied down from GCS) of the same weights scores as the run that trained them; T5X's
  Orbax format is read through the same checks."""
  root, hf_dir, trained_loss = exported
  model_dir = root / "t5x_model"
  t5x_files.write_from_hf(str(hf_dir), str(model_dir), step=1000)
  args = [f"--exp={EXP}", f"--job_log_dir={root / 't5x_score'}", "--mode=eval",
          f"--init_from=t5x:{model_dir}"]
  # A T5X checkpoint holds no tokenizer: the inputs must name theirs.
  proc = run_cli(args, root)
  assert proc.returncode == 2, describe(proc)
  assert "holds none; set VOCABULARY" in proc.stderr.strip().splitlines()[-1], describe(proc)
  proc = run_cli([*args, "--set", "VOCABULARY=byte"], root, optimized=True)  # the job's own
  assert proc.returncode == 0, describe(proc)
  assert "using the weights of t5x:" in proc.stderr, describe(proc)
  assert eval_loss(proc.stdout) == pytest.approx(trained_loss, rel=1e-5)
  # The same weights in T5X's Orbax format, read into a model of another shape: one line,
  # nothing written.
  orbax_dir = root / "t5x_orbax"
  t5x_files.write_orbax_from_hf(str(hf_dir), str(orbax_dir), step=1000)
  job = root / "t5x_wrong_shape"
  proc = run_cli([f"--exp={EXP}", f"--job_log_dir={job}", "--mode=eval", "--set",
                  "HIDDEN_DIMS=96", "--set", "VOCABULARY=byte",
                  f"--init_from=t5x:{orbax_dir}@1000"], root)
  assert proc.returncode == 2, describe(proc)
  error = proc.stderr.strip().splitlines()[-1]
  assert "has encoder/layers_0/mlp/wi_0/kernel of shape [64, 128]" in error, error
  assert "needs [64, 96]" in error, error
  assert not job.exists()


def test_training_from_an_import_starts_at_its_loss_and_lowers_it(exported):
  root, hf_dir, trained_loss = exported
  job = root / "finetune"
  args = [f"--exp={EXP}", f"--job_log_dir={job}", f"--init_from=hf:{hf_dir}",
          *short(FINETUNE_STEPS)]
  proc = run_cli(args, root, timeout=600, optimized=True)
  assert proc.returncode == 0, describe(proc)
  assert "starting from the parameters of hf:" in proc.stderr
  trained = parse_trained_line(proc.stdout)
  # A random model starts near ln(264) = 5.6; the imported one where its run ended.
  assert trained["first_loss"] < 0.5 * 5.6, trained
  assert trained["first_loss"] == pytest.approx(trained_loss, rel=0.25), (trained, trained_loss)
  assert trained["last_loss"] < trained["first_loss"], trained
  # A rerun resumes from the job's own checkpoint, not from the import.
  proc = run_cli([*args[:3], *short(FINETUNE_STEPS + 10)], root, timeout=600, optimized=True)
  assert proc.returncode == 0, describe(proc)
  assert parse_trained_line(proc.stdout)["start_step"] == FINETUNE_STEPS
  assert "starting from the parameters" not in proc.stderr


def test_a_config_that_does_not_fit_fails_before_writing_anything(exported, tmp_path):
  root, hf_dir, _ = exported
  bad = tmp_path / "bad_hf"
  bad.mkdir()
  config = json.loads((hf_dir / "config.json").read_text())
  d_model = config["d_model"]
  config["d_model"] = 2 * d_model
  (bad / "config.json").write_text(json.dumps(config))
  (bad / "model.safetensors").write_bytes((hf_dir / "model.safetensors").read_bytes())
  job = tmp_path / "job"
  job.mkdir()
  (job / "notes.txt").write_text("mine")
  before = listing(job)
  proc = run_cli([f"--exp={EXP}", f"--job_log_dir={job}", f"--init_from=hf:{bad}", *SHORT],
                 tmp_path)
  assert proc.returncode == 2, describe(proc)
  assert "Traceback" not in proc.stderr
  message = proc.stderr.strip().splitlines()[-1]
  assert "d_model" in message and "MODEL_DIMS" in message, message
  assert f"d_model={2 * d_model}" in message and f"MODEL_DIMS={d_model}" in message, message
  assert listing(job) == before


def test_the_lm_cannot_start_from_a_hugging_face_t5(exported, tmp_path):
  _, hf_dir, _ = exported
  proc = run_cli(["--exp=ArithmeticAdditionTiny", f"--job_log_dir={tmp_path / 'lm'}",
                  f"--init_from=hf:{hf_dir}"], tmp_path)
  assert proc.returncode == 2, describe(proc)
  assert "Hugging Face" in proc.stderr and "Traceback" not in proc.stderr
