"""paxml's imagenet_resnets.py: praxis's ResNets and ClassificationModel, run from Pax's file.

The file is read from $PAXLIKE_PAXREF (default /work/paxref), as the other Pax files
are, with its import lines rewritten; its test is skipped where it is absent. Its
ImageNet inputs are lingvo's, which paxlike does not read: they give the batch's
shapes, so the file plans as written, and a subclass trains it on images of its own,
as a Pax user would. Three of its hyperparameters are read by nothing, in Pax either;
paxlike names them, and the runs below drop those three lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import REPO_ROOT, describe, parse_trained_line, read_scalars, subprocess_env

PAXREF = Path(os.environ.get("PAXLIKE_PAXREF", "/work/paxref"))
IMPORT_FIX = ("from paxml", "from paxlike.pax"), ("from praxis", "from paxlike.pax")
DEAD = ("  IMAGE_SIZE = 224\n", "  NUM_EPOCHS = 90\n", "  EVAL_INTERVAL_STEPS = 1_000\n")

pytestmark = pytest.mark.skipif(
    not (PAXREF / "imagenet_resnets.py").is_file(),
    reason=f"paxml's imagenet_resnets.py is not in {PAXREF} (set PAXLIKE_PAXREF)")

# A subclass that trains the file's model on its own images: a small ResNet (praxis's
# ResNet5 with a 3x3 entry), four classes (the bright quadrant of a 16x16 image), a short
# schedule of the file's kind, 40 steps on a [1, 2, 1] mesh.
TINY = textwrap.dedent("""\
    import numpy as np

    from paxlike.pax import base_input, experiment_registry, layers, pax_fiddle, py_utils
    from paxlike.pax import schedules

    import pax_imagenet_resnets as base


    class Quadrants(base_input.BaseInput):
      def __post_init__(self):
        super().__post_init__()
        self.reset()

      def get_next(self):
        n = self.batch_size
        labels = self._rng.integers(0, 4, n)
        image = self._rng.normal(0.0, 1.0, (n, 16, 16, 3)).astype(np.float32)
        for i, k in enumerate(labels):
          image[i, 8 * (k // 2):8 * (k // 2) + 8, 8 * (k % 2):8 * (k % 2) + 8] += 2.0
        return py_utils.NestedMap(image=image, label_probs=np.eye(4, dtype=np.float32)[labels],
                                  weight=np.ones((n,), np.float32))

      def reset(self):
        self._rng = np.random.default_rng(0 if self.is_training else 1)


    @experiment_registry.register
    class TinyResNet(base.ResNet50Pjit):
      TRAIN_BATCH_SIZE = 16
      EVAL_BATCH_SIZE = 16
      MESH_SHAPE = [1, 2, 1]

      def _network(self):
        net = super()._network()
        net.set(strides=[1], channels=[16], blocks=[1], kernels=[1],
                entryflow_conv_kernel=(3, 3, 3))
        return net

      def _lr_schedule(self):
        return pax_fiddle.Config(schedules.LinearRampupPiecewiseConstant,
                                 boundaries=[5, 30], values=[1.0, 0.1])

      def task(self):
        task_p = super().task()
        task_p.model.softmax_tpl.num_classes = 4
        task_p.train.num_train_steps = 40
        return task_p

      def datasets(self):
        return [pax_fiddle.Config(Quadrants, batch_size=16, is_training=True),
                pax_fiddle.Config(Quadrants, batch_size=16, is_training=False,
                                  eval_loop_num_batches=4)]
    """)


def _write(tmp_path: Path, dead_lines: bool = False, devices: int = 8) -> dict[str, str]:
  src = (PAXREF / "imagenet_resnets.py").read_text()
  for old, new in (*IMPORT_FIX, *(() if dead_lines else ((line, "") for line in DEAD))):
    assert old in src, old
    src = src.replace(old, new)
  (tmp_path / "pax_imagenet_resnets.py").write_text(src)
  (tmp_path / "tiny_resnet.py").write_text(TINY)
  env = subprocess_env(devices)
  env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO_ROOT), env.get("PYTHONPATH", "")])
  return env


def _main(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "paxlike.main", *args], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=600)


@pytest.mark.one_python("3.12")
def test_resnet50_is_praxis_model_and_the_file_names_its_dead_knobs(tmp_path):
  """ResNet50Pjit's model as written: praxis's ResNet-50 (25,557,032 trainable parameters,
  torchvision's count too, and 53,120 batch-norm statistics), on the [1, 8, 1] mesh its
  model sets; the file's three unread hyperparameters are named."""
  import flax

  sys.path.insert(0, str(tmp_path))
  try:
    _write(tmp_path)
    import pax_imagenet_resnets as m

    from paxlike import config, experiment

    exp = experiment.instantiate(m.ResNet50Pjit)
    assert exp.ICI_MESH_SHAPE == [1, 8, 1]  # Pax runs SPMD on the model's mesh
    task = config.build(experiment.task_config(exp))
    # The shapes the file's input specs provider gives (what an eval-only run starts from).
    given = config.build(exp.get_input_specs_provider_params()).get_input_specs()
    assert given["image"].shape == (exp.TRAIN_BATCH_SIZE, 224, 224, 3)
    assert given["label_probs"].shape == (exp.TRAIN_BATCH_SIZE, 1000)
    specs = {k: np.zeros((1, *v.shape[1:]), v.dtype) for k, v in given.items()}
    params = jax.eval_shape(lambda: task.model.init(jax.random.key(0), specs,
                                                    method="fprop"))["params"]
  finally:
    sys.path.remove(str(tmp_path))
    sys.modules.pop("pax_imagenet_resnets", None)
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  moving = sum(int(np.prod(v.shape)) for k, v in flat.items() if "/moving_" in k)
  total = sum(int(np.prod(v.shape)) for v in flat.values())
  assert (total - moving, moving) == (25_557_032, 53_120)
  assert flat["softmax/logits_ffn/linear/w"].shape == (2048, 1000)
  assert flat["network/stage_3_block_2/body_2/w"].shape == (1, 1, 512, 2048)
  assert task.train.learner.loss_name == "avg_xent"

  env = _write(tmp_path, dead_lines=True)
  proc = _main(tmp_path, env, "--exp=pax_imagenet_resnets.ResNet50Pjit",
               f"--job_log_dir={tmp_path / 'as_written'}", "--mode=dry_run")
  assert proc.returncode == 2, describe(proc)
  for name in ("IMAGE_SIZE = 224", "NUM_EPOCHS = 90", "EVAL_INTERVAL_STEPS = 1000"):
    assert f"{name} on ResNet50Pjit: nothing reads it" in proc.stderr, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr


@pytest.mark.one_python("3.12")
def test_a_subclass_trains_the_file_on_its_own_images(tmp_path):
  """The file's learner (nesterov SGD, L2 1e-4 skipping vectors, a linear ramp then piecewise
  constant), batch norm, variable norm summaries and eval, on a small ResNet."""
  env = _write(tmp_path, devices=2)
  job = tmp_path / "job"
  proc = _main(tmp_path, env, "--exp=tiny_resnet.TinyResNet", f"--job_log_dir={job}")
  assert proc.returncode == 0, describe(proc)
  trained = parse_trained_line(proc.stdout)
  assert trained["final_step"] == 40
  assert trained["last_loss"] < 0.5 * trained["first_loss"], proc.stdout
  train = read_scalars(job / "summaries" / "train")
  # variable_norm_summary = True in the file: each parameter's root mean square.
  assert "vars/network/entryflow_conv/w" in train and "vars/softmax/logits_ffn/bias/b" in train
  assert train["learning_rate"][-1][1] == pytest.approx(0.1 * m_lr(), rel=1e-4)
  evals = read_scalars(job / "summaries" / "eval_test_input")  # praxis's unnamed eval input
  assert evals["num_examples"][-1][1] == 64
  assert evals["accuracy"][-1][1] > 0.5, evals  # chance is 0.25
  assert "avg_xent" in evals and "error" in evals and "acc5" not in evals  # 4 classes


READER = textwrap.dedent("""\
    from paxlike.pax import experiment_registry
    from paxlike.pax.tasks.vision import input_generator

    import pax_imagenet_resnets as base
    import tiny_resnet

    input_generator.IMAGENET_DATA_DIR = {data_dir!r}


    @experiment_registry.register
    class ReadsRecords(tiny_resnet.TinyResNet):
      \"\"\"TinyResNet on the file's own inputs (its _dataset_train / _dataset_test), at 4
      classes and 32x32 pixels.\"\"\"

      def _dataset_train(self):
        p = base.ResNet50Pjit._dataset_train(self)
        p.input.set(num_classes=4, data_shape=(32, 32, 3), shuffle_buffer_size=64)
        return p

      def _dataset_test(self):
        p = base.ResNet50Pjit._dataset_test(self)
        p.input.set(num_classes=4, data_shape=(32, 32, 3))
        return p

      def datasets(self):
        return base.ResNet50Pjit.datasets(self)
    """)


def _records(data_dir: Path) -> None:
  """ImageNet's TFRecord layout: JPEGs of noise tinted by their class (1-based), of varied
  sizes, two train files and one validation file."""
  tf = pytest.importorskip("tensorflow")
  rng = np.random.default_rng(0)
  data_dir.mkdir()

  def example(label: int) -> bytes:
    h, w = rng.integers(40, 64, 2)
    image = rng.integers(0, 80, (h, w, 3))
    image[..., :] += (np.array([[160, 0, 0], [0, 160, 0], [0, 0, 160], [160, 160, 160]])
                      [label - 1])  # a class's tint survives any crop and flip
    image = image.astype(np.uint8)
    jpeg = tf.io.encode_jpeg(image).numpy()
    return tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    })).SerializeToString()

  for name, n in (("train-00000-of-00002", 96), ("train-00001-of-00002", 96),
                  ("validation-00000-of-00001", 64)):
    with tf.io.TFRecordWriter(str(data_dir / name)) as writer:
      for _ in range(n):
        writer.write(example(int(rng.integers(1, 5))))


@pytest.mark.one_python("3.12")
def test_the_file_trains_on_imagenet_records_and_resumes(tmp_path):
  """The file's ImageNetTrain / ImageNetValidation (through its LingvoInputAdaptor) read
  ImageNet's TFRecord layout with paxml's preprocessing; a resumed run reads on where the
  first stopped, so 10 + 10 steps end where 20 do."""
  _records(tmp_path / "imagenet")
  env = _write(tmp_path, devices=2)
  (tmp_path / "reads_records.py").write_text(
      READER.format(data_dir=str(tmp_path / "imagenet")))
  runs = {}
  for name, steps in (("whole", [20]), ("resumed", [10, 20])):
    for n in steps:
      proc = _main(tmp_path, env, "--exp=reads_records.ReadsRecords",
                   f"--job_log_dir={tmp_path / name}", "--set",
                   f"train.num_train_steps={n}")
      assert proc.returncode == 0, describe(proc)
    runs[name] = parse_trained_line(proc.stdout)
  assert runs["whole"]["last_loss"] < 0.5 * runs["whole"]["first_loss"], runs
  assert runs["resumed"]["last_loss"] == pytest.approx(runs["whole"]["last_loss"], rel=1e-4)
  evals = read_scalars(tmp_path / "whole" / "summaries" / "eval_test_eval")
  assert evals["accuracy"][-1][1] > 0.5, evals  # chance is 0.25


def m_lr() -> float:
  """The file's LEARNING_RATE: (TRAIN_BATCH_SIZE / 256) x 0.1 with its batch of 512."""
  return 512 / 256 * 0.1
