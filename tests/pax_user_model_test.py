"""A Pax user's own layers and model: praxis's BaseLayer / BaseModel on paxlike.

paxml's mnist.py (its CNN written with setup(), create_child, template fields and
compute_predictions / compute_loss) runs with only its import lines rewritten. It
is read from $PAXLIKE_PAXREF (default /work/paxref), as the other Pax files are, and
its test is skipped where it is absent; it reads MNIST through tfds, which the test
answers with a learnable stand-in (TFDS's mock_data: no download). The layer and
error tests below need no Pax file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import (
    REPO_ROOT,
    describe,
    parse_model_analysis,
    parse_trained_line,
    read_scalars,
    subprocess_env,
)

from paxlike import config
from paxlike.errors import UserError
from paxlike.learners import Learner
from paxlike.pax import base_input, base_layer, base_model, pax_fiddle
from paxlike.pax.layers import (
    activations,
    convolutions,
    linears,
    normalizations,
    poolings,
    stochastics,
)
from paxlike.pax.py_utils import NestedMap
from paxlike.task import Task, TrainSettings

PAXREF = Path(os.environ.get("PAXLIKE_PAXREF", "/work/paxref"))
IMPORT_FIX = ("from paxml import", "from paxlike.pax import"), ("from praxis", "from paxlike.pax")

# Runs paxlike.main with TFDS's mnist answered by 28x28 images whose label is the row of a
# bright band (so a few dozen steps learn it) and the real MNIST's features and splits.
DRIVER = textwrap.dedent("""\
    import sys

    import numpy as np
    import tensorflow as tf
    import tensorflow_datasets as tfds
    from absl import app

    from paxlike import main


    def as_dataset(self, split, *args, **kwargs):
      rng = np.random.default_rng(0 if str(split) == "train" else 1)
      n = 512 if str(split) == "train" else 256
      labels = rng.integers(0, 10, n)
      images = rng.integers(0, 60, (n, 28, 28, 1)).astype(np.uint8)
      for i, k in enumerate(labels):
        images[i, 2 * k + 4:2 * k + 7, :, 0] = 255
      return tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})


    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
      app.run(main.main, argv=["paxlike.main", *sys.argv[1:]])
    """)


def _run_mnist(tmp_path: Path, *args: str, edits: tuple[tuple[str, str], ...] = ()
               ) -> subprocess.CompletedProcess:
  src = (PAXREF / "mnist.py").read_text()
  for old, new in (*IMPORT_FIX, *edits):
    assert old in src, old
    src = src.replace(old, new)
  (tmp_path / "pax_mnist.py").write_text(src)
  (tmp_path / "drive.py").write_text(DRIVER)
  env = subprocess_env(1)
  env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO_ROOT), env.get("PYTHONPATH", "")])
  return subprocess.run([sys.executable, "drive.py", "--exp=pax_mnist.MnistExperiment", *args],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


# praxis's shapes of mnist.py's CNN: two 3x3 convolutions with biases, the dense layer from
# the 7x7x64 pooled maps, the linear layer and its bias.
MNIST_PARAMS = {"network/conv1/w": (3, 3, 1, 32), "network/conv1/b": (32,),
                "network/conv2/w": (3, 3, 32, 64), "network/conv2/b": (64,),
                "network/dense_0/linear/w": (3136, 256), "network/dense_0/bias/b": (256,),
                "network/dense_1/w": (256, 10), "network/dense_2/b": (10,)}


@pytest.mark.one_python("3.11")
@pytest.mark.skipif(not (PAXREF / "mnist.py").is_file(),
                    reason=f"paxml's mnist.py is not in {PAXREF} (set PAXLIKE_PAXREF)")
@pytest.mark.skipif(__import__("importlib").util.find_spec("tensorflow_datasets") is None,
                    reason="mnist.py reads MNIST with tensorflow_datasets (the seqio extra)")
def test_mnist_trains_and_evaluates_as_written(tmp_path):
  job = tmp_path / "job"
  proc = _run_mnist(tmp_path, f"--job_log_dir={job}", "--set", "BATCH_SIZE=32",
                    "--set", "TRAIN_STEPS=40", "--set", "LEARNING_RATE=0.1")
  assert proc.returncode == 0, describe(proc)
  trained = parse_trained_line(proc.stdout)
  assert trained["final_step"] == 40
  assert trained["last_loss"] < 0.5 * trained["first_loss"], proc.stdout
  rows, total = parse_model_analysis((job / "model_analysis.txt").read_text())
  assert {k: tuple(int(d) for d in v["shape"].strip("()").split(",") if d)
          for k, v in rows.items()} == MNIST_PARAMS
  assert total == sum(int(np.prod(s)) for s in MNIST_PARAMS.values()) == 824_458
  # compute_loss's metrics are the run's: the accuracy it returns, trained and evaluated
  # (praxis names an unnamed eval input 'input').
  train = read_scalars(job / "summaries" / "train")
  assert "accuracy" in train and "mfu" in train
  evals = read_scalars(job / "summaries" / "eval_test_input")
  assert evals["accuracy"][-1][1] > 0.6, evals  # chance is 0.1
  assert evals["num_examples"][-1][1] == 256

  # A dry run plans it without training: praxis's count, and the FLOPs said to be XLA's.
  plan = _run_mnist(tmp_path, f"--job_log_dir={tmp_path / 'plan'}", "--mode=dry_run")
  assert plan.returncode == 0, describe(plan)
  assert "824,458" in plan.stdout and "model FLOPs / step (XLA's count of the gradient)" \
      in plan.stdout, plan.stdout

  # The learner's loss_name must be one of compute_loss's metrics; a typo is one line.
  bad = _run_mnist(tmp_path, f"--job_log_dir={tmp_path / 'bad'}",
                   "--set", "train.learner.loss_name=los")
  assert bad.returncode == 2, describe(bad)
  assert bad.stderr.strip().splitlines()[-1].startswith(
      "error: learner.loss_name='los' is not among CNNModel.compute_loss's metrics "
      "(accuracy, loss)"), bad.stderr[-2000:]
  assert "Traceback" not in bad.stderr


@pytest.mark.one_python("3.11")
@pytest.mark.skipif(not (PAXREF / "mnist.py").is_file(),
                    reason=f"paxml's mnist.py is not in {PAXREF} (set PAXLIKE_PAXREF)")
@pytest.mark.skipif(__import__("importlib").util.find_spec("tensorflow_datasets") is None,
                    reason="mnist.py reads MNIST with tensorflow_datasets (the seqio extra)")
def test_mnist_with_praxis_default_batch_norm_trains_and_resumes(tmp_path):
  """mnist.py's convolutions with ConvBNAct's default batch norm (its two
  `batch_norm_tpl=None` lines dropped): trains, evaluates with the moving statistics,
  checkpoints them and resumes."""
  edits = (("        batch_norm_tpl=None,\n", ""),)
  job = tmp_path / "job"
  args = (f"--job_log_dir={job}", "--set", "BATCH_SIZE=32", "--set", "LEARNING_RATE=0.1")
  proc = _run_mnist(tmp_path, *args, "--set", "TRAIN_STEPS=30", edits=edits)
  assert proc.returncode == 0, describe(proc)
  trained = parse_trained_line(proc.stdout)
  assert trained["last_loss"] < 0.5 * trained["first_loss"], proc.stdout
  rows, _ = parse_model_analysis((job / "model_analysis.txt").read_text())
  assert {"network/conv1/bn/moving_mean", "network/conv2/bn/moving_variance",
          "network/conv2/bn/gamma"} <= set(rows)
  evals = read_scalars(job / "summaries" / "eval_test_input")
  # Chance is 0.1. Eval normalises with the moving statistics, which praxis's decay of
  # 0.999 has moved only 3% of the way in 30 steps: the loss is higher than in training.
  assert evals["accuracy"][-1][1] > 0.5, evals
  resumed = _run_mnist(tmp_path, *args, "--set", "TRAIN_STEPS=40", edits=edits)
  assert resumed.returncode == 0, describe(resumed)
  assert "trained steps 30..40" in resumed.stdout, resumed.stdout  # from step 30's checkpoint


# ------------------------------------------------------------- layers and model


class _Scaled(base_layer.BaseLayer):
  """A user layer: one weight, a summary, and the child's activation from a template."""

  dims: int = 4
  activation_tpl: pax_fiddle.Config[activations.BaseActivation] = base_layer.template_field(
      activations.ReLU)
  ff_tpl: pax_fiddle.Config[base_layer.BaseLayer] = base_layer.template_field(
      linears.FeedForward)

  def setup(self) -> None:
    self.create_variable("scale", base_layer.WeightHParams(  # praxis's idiom, mesh and all
        shape=[self.dims], init=base_layer.WeightInit.Constant(2.0), mesh_shape=self.mesh_shape,
        tensor_split_dims_mapping=self.weight_split_dims_mapping.wt))
    self.create_child("ff", self.ff_tpl.clone().set(input_dims=self.dims, output_dims=3))
    self.create_child("act", self.activation_tpl.clone())

  def __call__(self, x):
    self.add_summary("mean_input", jnp.mean(x))
    return self.act(self.ff(x.astype(self.fprop_dtype) * self.theta.scale))


class _Model(base_model.BaseModel):
  net_tpl: pax_fiddle.Config[base_layer.BaseLayer] = base_layer.template_field(_Scaled)

  def setup(self) -> None:
    self.create_child("net", self.net_tpl)

  def compute_predictions(self, input_batch):
    return self.net(input_batch.x)

  def compute_loss(self, predictions, input_batch):
    err = jnp.mean((predictions.astype(jnp.float32) - input_batch.y) ** 2)
    return NestedMap(mse=(err, 4.0)), NestedMap()


def _task(model_cfg, loss_name="mse", summary_verbosity=3):
  learner = pax_fiddle.Config(Learner, loss_name=loss_name)
  return config.build(pax_fiddle.Config(Task, model=model_cfg, summary_verbosity=summary_verbosity,
                                        train=pax_fiddle.Config(TrainSettings, learner=learner)))


BATCH = {"x": np.ones((2, 4), np.float32), "y": np.zeros((2, 3), np.float32)}


def test_model_trains_on_the_named_metric_with_its_summaries_and_templates():
  model_cfg = pax_fiddle.Config(_Model, net_tpl=pax_fiddle.Config(
      _Scaled, name="renamed", activation_tpl=pax_fiddle.Config(activations.Tanh)))
  model_cfg.fprop_dtype = jnp.bfloat16
  model = _task(model_cfg).model
  # The template field stayed a config through the task's build (praxis's DoNotBuild).
  assert isinstance(model.net_tpl, pax_fiddle.Config)
  params = model.init(jax.random.key(0), BATCH, method="fprop")["params"]
  # create_child names the child (not the template's name) and praxis's layout follows.
  assert jax.tree.map(jnp.shape, params) == {"net": {
      "scale": (4,), "ff": {"linear": {"w": (4, 3)}, "bias": {"b": (3,)}}}}
  assert np.all(params["net"]["scale"] == 2.0)
  limit = np.sqrt(6.0 / 7.0) * 1.000001  # praxis's default Xavier over fan 4 + 3
  assert 0 < np.abs(params["net"]["ff"]["linear"]["w"]).max() <= limit
  loss, metrics = model.apply({"params": params}, BATCH, method="fprop")
  x = np.ones((2, 4)) * 2.0 @ np.asarray(params["net"]["ff"]["linear"]["w"], np.float64)
  want = np.mean(np.tanh(np.maximum(x, 0.0)) ** 2)  # FeedForward's ReLU, then the Tanh given
  np.testing.assert_allclose(float(loss), want, rtol=2e-2)  # bfloat16 activations
  assert float(metrics["mse"]) == float(loss) and float(metrics["num_tokens"]) == 4.0
  assert float(metrics["mean_input"]) == 1.0 and float(metrics["num_examples"]) == 2.0
  # The model's fprop_dtype reached the grandchild FeedForward (its dtype was unset).
  out = model.apply({"params": params}, NestedMap(BATCH)["x"],
                    method=lambda m, x: m.net.ff(x.astype(m.net.ff.fprop_dtype)))
  assert out.dtype == jnp.bfloat16
  # add_summary's default verbosity (2) is above a task's summary_verbosity of 1.
  quiet = _task(model_cfg, summary_verbosity=1).model
  assert "mean_input" not in quiet.apply({"params": params}, BATCH, method="fprop")[1]


def test_a_child_keeps_the_dtype_it_sets():
  """praxis overwrote a child's float32 dtype with its parent's; paxlike keeps a set one."""
  ff = pax_fiddle.Config(linears.FeedForward, dtype=jnp.float32)
  model_cfg = pax_fiddle.Config(_Model, net_tpl=pax_fiddle.Config(_Scaled, ff_tpl=ff))
  model_cfg.dtype = jnp.bfloat16
  params = _task(model_cfg).model.init(jax.random.key(0), BATCH, method="fprop")["params"]
  assert params["net"]["scale"].dtype == jnp.bfloat16
  assert params["net"]["ff"]["linear"]["w"].dtype == jnp.float32


def test_refusals_name_what_paxlike_does_not_run():
  with pytest.raises(UserError, match=r"learner.loss_name='total_loss' is not among "
                     r"_Model.compute_loss's metrics \(mse\)"):
    model = _task(pax_fiddle.Config(_Model), loss_name="total_loss").model
    model.init(jax.random.key(0), BATCH, method="fprop")
  with pytest.raises(UserError, match=r"BatchNorm.get_var\('moving_men'\): no non-trainable "
                     "variable of that name"):
    bn = pax_fiddle.build(pax_fiddle.Config(normalizations.BatchNorm, dim=2))
    bn.init(jax.random.key(0), jnp.ones((1, 2)), method=lambda m, x: m.get_var("moving_men"))
  with pytest.raises(UserError, match=r"maybe_shard: split dims mapping \('data', 'model'\) "
                     r"names 'model', not an axis of the mesh \(replica, data, mdl\)"):
    lin = pax_fiddle.Config(linears.Linear, input_dims=2, output_dims=2,
                            mesh_axis_names=["replica", "data", "mdl"])
    lin.activation_split_dims_mapping.out = ("data", "model")
    with jax.set_mesh(jax.make_mesh((1, 1, 1), ("replica", "data", "mdl"),
                                    devices=jax.devices()[:1])):
      pax_fiddle.build(lin).init(jax.random.key(0), jnp.ones((1, 2)))
  with pytest.raises(UserError, match=r"Linear.create_variable\('w'\): tensor_split_dims_mapping "
                     r"\('data', 'model'\): split dims mapping names mesh axis 'model'"):
    lin = pax_fiddle.Config(linears.Linear, input_dims=2, output_dims=2)
    lin.weight_split_dims_mapping.wt = ("data", "model")
    pax_fiddle.build(lin).init(jax.random.key(0), jnp.ones((1, 2)))
  with pytest.raises(UserError, match="has no decoder paxlike runs .Pax's decode and "
                     "process_decode_out are not run.; run it with --mode=train, eval"):
    _task(pax_fiddle.Config(_Model)).model.decode_features()
  model = _task(pax_fiddle.Config(_Model, ici_mesh_shape=[1, 2, 1])).model
  with pytest.raises(UserError, match=r"task.model.ici_mesh_shape = \[1, 2, 1\] but the "
                     r"experiment's ICI_MESH_SHAPE = \[1, 1, 1\]"):
    model.check_mesh([1, 1, 1], None)


# ------------------------------------------------------------------ batch norm


class _BnModel(base_model.BaseModel):
  """Batch norm straight on the input features, then a linear head."""

  decay: float = 0.9

  def setup(self) -> None:
    self.create_child("bn", pax_fiddle.Config(normalizations.BatchNorm, dim=3, decay=self.decay))
    self.create_child("head", pax_fiddle.Config(linears.Linear, input_dims=3, output_dims=1))

  def compute_predictions(self, input_batch):
    return self.head(self.bn(input_batch.x))[:, 0]

  def compute_loss(self, predictions, input_batch):
    return NestedMap(mse=(jnp.mean((predictions - input_batch.y) ** 2), 1.0)), NestedMap()


def _bn_setup():
  import optax

  from paxlike import steps
  from paxlike.train_state import TrainState

  model = _task(pax_fiddle.Config(_BnModel)).model
  rng = np.random.default_rng(0)
  x = rng.normal(3.0, 2.0, (8, 3)).astype(np.float32)
  batch = {"x": x, "y": x @ np.array([1.0, -2.0, 0.5], np.float32)}
  params = model.init(jax.random.key(0), batch, method="fprop")["params"]
  tx = optax.adamw(0.05, weight_decay=0.5)  # weight decay must not touch the statistics
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

  def step(**kw):
    return steps.make_train_step(model, tx, lambda s: 0.05, **kw)
  return model, batch, state, step


def test_batch_norm_moves_its_statistics_and_evaluates_with_them():
  model, batch, state, step = _bn_setup()
  x = batch["x"].astype(np.float64)
  assert set(state.params["bn"]) == {"beta", "gamma", "moving_mean", "moving_variance"}
  new, metrics = jax.jit(step())(state, batch, jax.random.key(1))
  # praxis's update: moving = decay * moving + (1 - decay) * the batch's statistic.
  np.testing.assert_allclose(new.params["bn"]["moving_mean"], 0.1 * x.mean(0), rtol=1e-5)
  np.testing.assert_allclose(new.params["bn"]["moving_variance"], 0.9 + 0.1 * x.var(0),
                             rtol=1e-5)
  # The statistics took no share of the gradient's norm; beta and gamma trained.
  assert float(metrics["grad_norm"]) > 0
  assert not np.array_equal(new.params["bn"]["gamma"], state.params["bn"]["gamma"])
  # Two microbatches: the mean of the two halves' updates (strided rows, as split).
  micro, _ = jax.jit(step(num_microbatches=2))(state, batch, jax.random.key(1))
  halves = [x[0::2], x[1::2]]
  np.testing.assert_allclose(micro.params["bn"]["moving_mean"],
                             0.1 * np.mean([h.mean(0) for h in halves], 0), rtol=1e-5)
  # Training settles the statistics on the data's and lowers the loss.
  train = jax.jit(step())
  first = float(metrics["loss"])
  for _ in range(60):
    new, metrics = train(new, batch, jax.random.key(1))
  assert float(metrics["loss"]) < 0.1 * first
  np.testing.assert_allclose(new.params["bn"]["moving_mean"], x.mean(0), rtol=0.01)
  # Eval normalises with the moving statistics, whatever else is in the batch.
  p = jax.tree.map(lambda v: np.asarray(v, np.float64), new.params)
  bn = p["bn"]
  want = ((x[:1] - bn["moving_mean"]) * (1 + bn["gamma"]) / np.sqrt(bn["moving_variance"] + 1e-3)
          + bn["beta"]) @ p["head"]["w"]
  one = {k: v[:1] for k, v in batch.items()}
  got = model.apply({"params": new.params}, NestedMap(one),
                    method=lambda m, b: m.compute_predictions(b))
  np.testing.assert_allclose(np.asarray(got), want[:, 0], rtol=1e-4)


def test_batch_norm_under_pmap_uses_the_whole_batch_as_spmd_does():
  """praxis's sync batch norm: two pmap devices' statistics are the global batch's."""
  from paxlike import mesh as mesh_lib
  from paxlike.partitioning import PmapPartitioner, SpmdPartitioner

  model, batch, state, step = _bn_setup()
  devices = jax.devices()[:2]
  pmap = PmapPartitioner(devices)
  run = pmap.compile(step(reduce=pmap.reduce))
  new, _ = run(pmap.shard_state(state), pmap.shard_batch(batch), jax.random.key(1))
  pmapped = pmap.to_saveable(new).params["bn"]
  spmd = SpmdPartitioner(mesh_lib.build([1, 2, 1], devices=devices))
  with spmd.context():
    global_new, _ = jax.jit(step())(state, spmd.shard_batch(batch), jax.random.key(1))
  x = batch["x"].astype(np.float64)
  for stats in (pmapped, global_new.params["bn"]):
    np.testing.assert_allclose(stats["moving_mean"], 0.1 * x.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stats["moving_variance"], 0.9 + 0.1 * x.var(0), rtol=1e-5)
  np.testing.assert_allclose(pmapped["gamma"], global_new.params["bn"]["gamma"], rtol=1e-5)


def test_conv_bn_act_has_praxis_batch_norm_by_default():
  conv = pax_fiddle.Config(convolutions.ConvBNAct, filter_shape=(3, 3, 1, 2),
                           filter_stride=(1, 1))
  layer = pax_fiddle.build(conv)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 4, 4, 1)), jnp.float32)
  params = layer.init(jax.random.key(0), x)["params"]
  assert jax.tree.map(jnp.shape, params["bn"]) == {
      "beta": (2,), "gamma": (2,), "moving_mean": (2,), "moving_variance": (2,)}
  # Eval (no train key): the fresh moving statistics (0, 1) leave relu(conv / sqrt(1.001)).
  out = layer.apply({"params": params}, x)
  conv_only = pax_fiddle.build(conv.clone().set(batch_norm_tpl=None))
  bare = conv_only.apply({"params": {"w": params["w"]}}, x)
  np.testing.assert_allclose(np.asarray(out), np.asarray(bare) / np.sqrt(1.001), rtol=1e-5)


# ------------------------------------------------------------ Pax's decode


class _Decoding(_Model):
  """_Model with Pax's decode protocol: decode on the devices, process_decode_out on the host."""

  def decode(self, input_batch):
    out = self.compute_predictions(input_batch)
    return NestedMap(mean_out=(jnp.mean(out), 2.0)), NestedMap(out=out, y=input_batch.y), {}

  def process_decode_out(self, input_obj, decode_out):
    err = np.abs(decode_out.out - decode_out.y).sum(-1)
    lines = [(f"{input_obj.name}-{i}", {"err": e}) for i, e in enumerate(err)]
    return NestedMap(mean_err=(err.mean(), len(err))), lines, NestedMap()


class _Rows(base_input.BaseInput):
  """Three batches of x = row numbers, y = 0; then the epoch ends."""

  def get_next(self):
    self._n = getattr(self, "_n", 0) + 1
    if self._n > 3:
      raise StopIteration
    x = np.arange(self.batch_size * 4, dtype=np.float32).reshape(-1, 4) / 10 + self._n
    return NestedMap(x=x, y=np.zeros((self.batch_size, 3), np.float32))

  def reset(self):
    self._n = 0


def _evaluating(model_class, batch_size, tmp_path, decode=False):
  """(model, its fresh params, _Rows of batch_size as the eval or the decode input, the
  state, an Evaluator on a 2-device mesh)."""
  from paxlike import mesh as mesh_lib
  from paxlike.evaluator import Evaluator
  from paxlike.partitioning import SpmdPartitioner
  from paxlike.train_state import TrainState

  model = _task(pax_fiddle.Config(model_class)).model
  inp = config.build(pax_fiddle.Config(_Rows, name="rows", batch_size=batch_size,
                                       is_training=False, reset_for_eval=True))
  params = model.init(jax.random.key(0), BATCH, method="fprop")["params"]
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=())
  part = SpmdPartitioner(mesh_lib.build([1, 2, 1], devices=jax.devices()[:2]))
  inputs = ([], [inp]) if decode else ([inp], [])
  return model, params, inp, state, Evaluator(model, part, *inputs, str(tmp_path),
                                              enable_summary_writer=False)


def test_a_model_with_pax_decode_decodes_as_pax_does(tmp_path):
  import json

  model, params, inp, state, ev = _evaluating(_Decoding, 2, tmp_path, decode=True)
  metrics = ev.decode(state, 7)["rows"]
  # What the model computes, batch by batch, on the host.
  inp.reset()
  outs = [np.asarray(model.apply({"params": params}, NestedMap(inp.get_next()).x,
                                 method=lambda m, x: m.net(x))) for _ in range(3)]
  errs = np.concatenate([np.abs(o).sum(-1) for o in outs])
  np.testing.assert_allclose(metrics["mean_err"], errs.mean(), rtol=1e-5)
  np.testing.assert_allclose(metrics["mean_out"], np.mean([o.mean() for o in outs]), rtol=1e-5)
  assert metrics["num_examples"] == 6
  out_dir = tmp_path / "decoder_out" / "rows"
  lines = [json.loads(x) for x in (out_dir / "decode_00000007.jsonl").read_text().splitlines()]
  np.testing.assert_allclose([x["err"] for x in lines], errs, rtol=1e-5)
  assert json.loads((out_dir / "metrics_00000007.json").read_text()) == metrics
  # paxlike's own generation (infer, export) says it is not this model's in one line.
  with pytest.raises(UserError, match="_Decoding decodes with Pax's decode.input_batch. and "
                     "process_decode_out, which --mode=decode and decode_once run"):
    model.decode_features()


def test_pax_decode_interval_steps_decodes_while_training(tmp_path):
  """task_p.train.decode_interval_steps (Pax's): a decode every N steps, and the last one."""
  from paxlike import mesh as mesh_lib
  from paxlike import trainer
  from paxlike.evaluator import Evaluator
  from paxlike.partitioning import SpmdPartitioner

  class Endless(_Rows):
    def get_next(self):
      self._n = 0  # never runs out
      return super().get_next()

  learner = pax_fiddle.Config(Learner, loss_name="mse")
  task = config.build(pax_fiddle.Config(Task, model=pax_fiddle.Config(_Decoding),
                                        train=pax_fiddle.Config(
                                            TrainSettings, learner=learner, num_train_steps=5,
                                            decode_interval_steps=2)))
  train = config.build(pax_fiddle.Config(Endless, batch_size=2, is_training=True))
  train.bind_host(1, 0)
  rows = config.build(pax_fiddle.Config(_Rows, name="rows", batch_size=2, is_training=False,
                                        reset_for_eval=True))
  part = SpmdPartitioner(mesh_lib.build([1, 1, 1], devices=jax.devices()[:1]))
  ev = Evaluator(task.model, part, [], [rows], str(tmp_path), enable_summary_writer=False)
  trainer.train(task, train, part, str(tmp_path), trainer.TrainOptions(
      evaluator=ev, enable_summary_writer=False, async_checkpoint=False))
  written = sorted(p.name for p in (tmp_path / "decoder_out" / "rows").glob("decode_*.jsonl"))
  assert written == ["decode_00000002.jsonl", "decode_00000004.jsonl", "decode_00000005.jsonl"]


# ------------------------------------------- metrics as Pax aggregates them


class _Weighed(_Model):
  """_Model adding a metric with a weight of its own (the mean output of the rows whose
  first feature is above 2.5, weighted by their count) and two named as paxlike's own."""

  def compute_loss(self, predictions, input_batch):
    metrics, per_example = super().compute_loss(predictions, input_batch)
    out = jnp.sum(predictions.astype(jnp.float32), axis=-1)
    mask = (input_batch.x[:, 0] > 2.5).astype(jnp.float32)
    count = jnp.sum(mask)
    metrics.update(pos=(jnp.sum(out * mask) / jnp.maximum(count, 1.0), count),
                   num_tokens=(count, 1.0), loss=(2.0 * metrics.mse[0], 1.0))
    return metrics, per_example


def test_each_metric_is_averaged_by_its_own_weight_over_an_eval_set(tmp_path):
  """Pax's eval summary: sum(value x weight) / sum(weight) per metric, and the weights summed;
  a metric named as paxlike's own (num_tokens, loss) is kept under Pax's Metrics/ name."""
  model, params, inp, state, ev = _evaluating(_Weighed, 4, tmp_path)
  metrics = ev.evaluate(state, 3)["rows"]
  inp.reset()
  xs = [inp.get_next().x for _ in range(3)]  # first features 1.0-2.2, 2.0-3.2, 3.0-4.2
  outs = [np.asarray(model.apply({"params": params}, x, method=lambda m, x: m.net(x))).sum(-1)
          for x in xs]
  masks = [x[:, 0] > 2.5 for x in xs]
  assert [int(m.sum()) for m in masks] == [0, 2, 4]
  pos = np.concatenate([o[m] for o, m in zip(outs, masks, strict=True)])
  np.testing.assert_allclose(metrics["pos"], pos.mean(), rtol=1e-5)  # over the 6 rows
  assert metrics["pos-weight"] == 6.0
  # The model's own num_tokens, Pax's mean of its per-batch counts; paxlike's beside it
  # (the loss's weights: 4 a batch).
  assert metrics["Metrics/num_tokens"] == 2.0 and metrics["Metrics/num_tokens-weight"] == 3.0
  assert metrics["num_tokens"] == 12.0
  np.testing.assert_allclose(metrics["Metrics/loss"], 2.0 * metrics["mse"], rtol=1e-6)
  np.testing.assert_allclose(metrics["loss"], metrics["mse"], rtol=1e-6)


def test_a_train_step_averages_each_metric_by_its_own_weight():
  """A metric with its own weight reads the same whether the batch ran whole, in two
  microbatches or over two pmap devices (Pax's psum(value x weight) / psum(weight))."""
  import optax

  from paxlike import steps
  from paxlike.partitioning import PmapPartitioner
  from paxlike.train_state import TrainState

  model = _task(pax_fiddle.Config(_Weighed)).model
  # Rows 0-3 (pmap's first device) have one first feature above 2.5, rows 4-7 three.
  x = np.tile(np.array([[3.0], [1.0], [0.0], [2.0], [3.5], [4.0], [0.5], [5.0]], np.float32),
              (1, 4)) + np.arange(4, dtype=np.float32) / 10
  batch = {"x": x, "y": np.zeros((8, 3), np.float32)}
  params = model.init(jax.random.key(0), batch, method="fprop")["params"]
  tx = optax.sgd(0.0)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  _, whole = jax.jit(steps.make_train_step(model, tx, lambda s: 0.0))(
      state, batch, jax.random.key(1))
  _, micro = jax.jit(steps.make_train_step(model, tx, lambda s: 0.0, num_microbatches=2))(
      state, batch, jax.random.key(1))
  pmap = PmapPartitioner(jax.devices()[:2])
  run = pmap.compile(steps.make_train_step(model, tx, lambda s: 0.0, pmap.reduce,
                                           reduce_sum=pmap.reduce_sum))
  _, pmapped = run(pmap.shard_state(state), pmap.shard_batch(batch), jax.random.key(1))
  pmapped = pmap.unshard(pmapped)
  out = np.asarray(model.apply({"params": params}, x, method=lambda m, x: m.net(x))).sum(-1)
  want = out[x[:, 0] > 2.5].mean()
  for metrics in (whole, micro, pmapped):
    np.testing.assert_allclose(float(metrics["pos"]), want, rtol=1e-5)
    assert float(metrics["pos-weight"]) == 4.0
  # Counts add up over microbatches, as over the whole batch.
  assert float(whole["Metrics/num_tokens"]) == float(micro["Metrics/num_tokens"]) == 4.0


# ------------------------------------------------------ praxis's arithmetic


def _conv_numpy(x, w, stride, pad):
  """Cross-correlation in float64 with explicit (before, after) padding per spatial dim."""
  x = np.pad(x, ((0, 0), pad[0], pad[1], (0, 0)))
  kh, kw, _, co = w.shape
  oh = (x.shape[1] - kh) // stride[0] + 1
  ow = (x.shape[2] - kw) // stride[1] + 1
  out = np.zeros((x.shape[0], oh, ow, co))
  for i in range(oh):
    for j in range(ow):
      patch = x[:, i * stride[0]:i * stride[0] + kh, j * stride[1]:j * stride[1] + kw, :]
      out[:, i, j, :] = np.einsum("bhwc,hwco->bo", patch, w)
  return out


def test_conv2d_pads_as_praxis_and_pooling_averages_inside_the_input():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 6, 6, 3)).astype(np.float32)
  # An even kernel with stride 2: praxis pads (k - 1) = 3 as (1, 2) whatever the stride,
  # where XLA's SAME would pad (1, 1) here.
  conv = pax_fiddle.build(pax_fiddle.Config(convolutions.Conv2D, filter_shape=(4, 4, 3, 5),
                                            filter_stride=(2, 2), bias=True))
  params = conv.init(jax.random.key(1), jnp.asarray(x))
  w = np.asarray(params["params"]["w"], np.float64)
  b = np.asarray(params["params"]["b"], np.float64)
  want = _conv_numpy(x.astype(np.float64), w, (2, 2), ((1, 2), (1, 2))) + b
  np.testing.assert_allclose(np.asarray(conv.apply(params, jnp.asarray(x))), want,
                             rtol=1e-4, atol=1e-5)
  pool = pax_fiddle.build(pax_fiddle.Config(poolings.Pooling, window_shape=(3, 3),
                                            window_stride=(2, 2), pooling_type="AVG"))
  out, paddings = pool.apply({}, jnp.asarray(x))
  assert paddings is None and out.shape == (2, 3, 3, 3)
  # SAME with a 3-window at stride 2 over 6 cells pads (0, 1): the last window holds 2
  # input cells per dim, and the average is over those only.
  np.testing.assert_allclose(np.asarray(out[:, 2, 2]), x[:, 4:, 4:].mean(axis=(1, 2)),
                             rtol=1e-5)
  np.testing.assert_allclose(np.asarray(out[:, 0, 0]), x[:, :3, :3].mean(axis=(1, 2)),
                             rtol=1e-5)
  mx = pax_fiddle.build(pax_fiddle.Config(poolings.Pooling, window_shape=(2, 2),
                                          window_stride=(2, 2)))
  np.testing.assert_array_equal(np.asarray(mx.apply({}, jnp.asarray(x))[0]),
                                x.reshape(2, 3, 2, 3, 2, 3).max(axis=(2, 4)))


def test_norms_are_praxis_arithmetic():
  rng = np.random.default_rng(2)
  x = rng.normal(size=(3, 8)).astype(np.float32)
  ln = pax_fiddle.build(pax_fiddle.Config(normalizations.LayerNorm, dim=8))
  params = {"params": {"scale": jnp.asarray(rng.normal(size=8), jnp.float32),
                       "bias": jnp.asarray(rng.normal(size=8), jnp.float32)}}
  assert jax.tree.map(jnp.shape, ln.init(jax.random.key(0), x)) == {
      "params": {"scale": (8,), "bias": (8,)}}
  normed = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6)
  want = normed * (1 + np.asarray(params["params"]["scale"])) + np.asarray(
      params["params"]["bias"])  # praxis stores scale - 1
  np.testing.assert_allclose(np.asarray(ln.apply(params, x)), want, rtol=1e-5, atol=1e-5)
  rms = pax_fiddle.build(pax_fiddle.Config(normalizations.RmsNorm, dim=8))
  scale = {"params": {"scale": params["params"]["scale"]}}
  want = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * np.asarray(
      params["params"]["scale"])  # RmsNorm's scale is direct
  np.testing.assert_allclose(np.asarray(rms.apply(scale, x)), want, rtol=1e-5, atol=1e-5)


def test_dropout_drops_while_training_only():
  drop = pax_fiddle.build(pax_fiddle.Config(stochastics.Dropout, keep_prob=0.75))
  x = jnp.ones((64, 64))
  assert np.array_equal(np.asarray(drop.apply({}, x)), np.ones((64, 64)))  # eval: no key
  out = np.asarray(drop.apply({}, x, rngs={"dropout": jax.random.key(3)}))
  assert set(np.unique(out)) == {0.0, np.float32(1 / 0.75)}
  assert abs((out == 0).mean() - 0.25) < 0.03


def test_a_template_field_is_edited_in_place_as_in_pax():
  """`model_p.net_tpl.dims = 6` edits the default template (praxis's configs carry them)."""
  model_cfg = pax_fiddle.Config(_Model)
  model_cfg.net_tpl.dims = 6
  model_cfg.net_tpl.ff_tpl.activation_tpl = pax_fiddle.Config(activations.Identity)
  model = _task(model_cfg).model
  batch = {"x": -np.ones((2, 6), np.float32), "y": np.zeros((2, 3), np.float32)}
  params = model.init(jax.random.key(0), batch, method="fprop")["params"]
  assert params["net"]["ff"]["linear"]["w"].shape == (6, 3)
  out = model.apply({"params": params}, NestedMap(batch)["x"], method=lambda m, x: m.net.ff(x))
  assert np.any(np.asarray(out) < 0)  # the FeedForward's ReLU was replaced by the edit


def test_a_split_weight_is_placed_on_the_mesh_axes_it_names():
  """praxis's weight_split_dims_mapping.wt places the weight, as in Pax, on paxlike's mesh."""
  import flax.linen as nn
  from jax.sharding import PartitionSpec

  from paxlike import mesh as mesh_lib
  from paxlike.partitioning import SpmdPartitioner

  ff = pax_fiddle.Config(linears.FeedForward, input_dims=8, output_dims=16)
  ff.weight_split_dims_mapping.wt = ("data", "mdl")
  conv = pax_fiddle.Config(convolutions.Conv2D, filter_shape=(3, 3, 2, 4), filter_stride=(1, 1))
  conv.weight_split_dims_mapping.wt = (-1, None, None, 2)  # an index into the mesh's axes
  part = SpmdPartitioner(mesh_lib.build([1, 2, 2], devices=jax.devices()[:4]))
  for cfg, x, path, spec in ((ff, np.ones((4, 8), np.float32), ("linear", "w"),
                              PartitionSpec("data", "mdl")),
                             (conv, np.ones((2, 5, 5, 2), np.float32), ("w",),
                              PartitionSpec(None, None, None, "mdl"))):
    layer = pax_fiddle.build(cfg)
    boxed = layer.init(jax.random.key(0), x)["params"]
    shardings = part.state_shardings(nn.get_partition_spec(boxed))
    leaf = shardings
    for key in path:
      leaf = leaf[key]
    assert leaf.spec == spec
    params = jax.device_put(nn.meta.unbox(boxed), shardings)
    placed = params
    for key in path:
      placed = placed[key]
    assert len(placed.addressable_shards) == 4 and placed.sharding.spec == spec
    np.testing.assert_allclose(np.asarray(jax.jit(layer.apply)({"params": params}, x)),
                               np.asarray(layer.apply({"params": nn.meta.unbox(boxed)}, x)),
                               rtol=1e-6)


def test_an_activation_split_mapping_constrains_the_output_in_an_spmd_step():
  """praxis's activation_split_dims_mapping.out: the FeedForward's output is constrained to
  that split where a step traces over the mesh; its values are unchanged, and under no mesh
  (a pmap step, init) the mapping changes nothing."""
  from paxlike import mesh as mesh_lib
  from paxlike.partitioning import SpmdPartitioner

  ff = pax_fiddle.Config(linears.FeedForward, input_dims=8, output_dims=16,
                         mesh_axis_names=["replica", "data", "mdl"], ici_mesh_shape=[1, 2, 2])
  ff.activation_split_dims_mapping.out = ("data", "mdl")
  layer = pax_fiddle.build(ff)
  x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
  params = layer.init(jax.random.key(0), x)["params"]
  part = SpmdPartitioner(mesh_lib.build([1, 2, 2], devices=jax.devices()[:4]))

  def relu_sum(p, x):  # the constraint sits on the linear output, before the activation
    out = layer.apply({"params": p}, x, method=lambda m, x: m.linear(x))
    return out, jnp.sum(layer.apply({"params": p}, x))

  with part.context():
    lowered = jax.jit(relu_sum).lower(params, x)
    out, _ = jax.jit(relu_sum)(params, x)
  text = lowered.as_text()
  assert "sharding_constraint" in text or "@Sharding" in text, text[:2000]
  assert out.sharding.spec == jax.sharding.PartitionSpec("data", "mdl")
  assert len(out.addressable_shards) == 4
  plain = jax.jit(relu_sum)(params, x)[0]  # no mesh: left as it is
  assert "Sharding" not in jax.jit(relu_sum).lower(params, x).as_text()
  # The split output sums in another order: a value near 0 differs by 2e-8 on an EPYC.
  np.testing.assert_allclose(np.asarray(out), np.asarray(plain), rtol=1e-6, atol=1e-6)
  # The bias is split as the output's last dim (praxis does so where mesh_shape is set).
  import flax.linen as nn

  specs = nn.get_partition_spec(layer.init(jax.random.key(0), x)["params"])
  assert part.state_shardings(specs)["bias"]["b"].spec == jax.sharding.PartitionSpec("mdl")


def test_a_pax_input_takes_praxis_names_and_defaults():
  from paxlike.pax import base_input

  class Counting(base_input.BaseInput):
    def get_next(self):
      return {"x": np.full((self.batch_size, 1), self.seed, np.int32)}

  train = pax_fiddle.build(pax_fiddle.Config(Counting, batch_size=2, is_training=True,
                                             input_random_seed=7))
  evals = pax_fiddle.build(pax_fiddle.Config(Counting, batch_size=2, is_training=False,
                                             reset_for_eval=True))
  assert (train.name, train.seed, train.get_next()["x"][0, 0]) == ("train", 7, 7)
  # praxis names an unnamed eval input 'input'; its epoch ends itself, so it is not repeated.
  assert (evals.name, evals.repeat) == ("input", False)


def test_classifier_layers_are_praxis_arithmetic():
  """The softmax a classifier makes from layers.FullSoftmax (the LM tree's node, built as
  praxis's runnable softmax), top-k accuracy, global pooling over paddings, and the
  stochastic residual, against numpy."""
  from paxlike.pax import metric_utils, schedules
  from paxlike.pax.layers import FullSoftmax, GlobalPooling, StochasticResidual

  rng = np.random.default_rng(0)
  x = rng.normal(size=(5, 4)).astype(np.float32)
  ids = rng.integers(0, 3, (5, 1)).astype(np.int32)
  weights = rng.uniform(0.5, 1.5, (5, 1)).astype(np.float32)

  class Classifier(base_layer.BaseLayer):
    def setup(self):
      self.create_child("softmax", pax_fiddle.Config(
          FullSoftmax, input_dims=4, num_classes=3, label_smoothing_prob=0.3))

    def __call__(self, x):
      return self.softmax(x, weights, class_ids=ids)

  layer = Classifier()
  params = layer.init(jax.random.key(0), x)["params"]
  assert jax.tree.map(jnp.shape, params) == {"softmax": {"logits_ffn": {
      "linear": {"w": (4, 3)}, "bias": {"b": (3,)}}}}
  out = layer.apply({"params": params}, x)
  ff = params["softmax"]["logits_ffn"]
  logits = x.astype(np.float64) @ ff["linear"]["w"] + ff["bias"]["b"]
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  target = np.full((5, 3), 0.15)
  target[np.arange(5), ids[:, 0]] = 0.7  # praxis's smoothing: 0.3 spread over the others
  xent = -(logp * target).sum(-1)
  np.testing.assert_allclose(out.avg_xent, (xent * weights[:, 0]).sum() / weights.sum(),
                             rtol=1e-5)
  np.testing.assert_allclose(out.per_example_argmax, logits.argmax(-1))

  scores = np.array([[0.1, 0.5, 0.4], [0.9, 0.05, 0.05], [0.2, 0.3, 0.5]], np.float32)
  labels = np.eye(3, dtype=np.float32)[[2, 0, 0]]
  top1 = metric_utils.top_k_accuracy(1, scores, label_probs=labels)
  top2 = metric_utils.top_k_accuracy(2, scores, label_probs=labels,
                                     weights=np.array([1.0, 1.0, 2.0]))
  assert float(top1) == pytest.approx(1 / 3) and float(top2) == pytest.approx(2 / 4)

  maps = rng.normal(size=(2, 3, 3, 4)).astype(np.float32)
  pads = np.zeros((2, 3, 3, 1), np.float32)
  pads[:, 2] = 1.0  # the last row is padding
  pool = pax_fiddle.build(pax_fiddle.Config(GlobalPooling, pooling_dims=(1, 2)))
  got = pool.apply({}, maps, compatible_paddings=pads)
  np.testing.assert_allclose(got, maps[:, :2].mean((1, 2)), rtol=1e-5)

  res = pax_fiddle.build(pax_fiddle.Config(StochasticResidual, survival_prob=0.75))
  ones = np.ones((4000, 2), np.float32)
  assert np.array_equal(res.apply({}, ones, ones), 2 * ones)  # eval: nothing dropped
  kept = res.apply({}, ones, ones, rngs={"dropout": jax.random.key(1)}) - 1.0
  kept = np.asarray(kept)
  assert np.all(np.isclose(kept, 0.0) | np.isclose(kept, 1 / 0.75))  # dropped, or scaled up
  assert np.mean(kept[:, 0] > 0) == pytest.approx(0.75, abs=0.03)
  assert np.array_equal(kept[:, 0], kept[:, 1])  # per example, as praxis drops

  ramp = schedules.LinearRampupPiecewiseConstant(boundaries=[10, 30, 60], values=[1.0, 0.1, 0.0])
  assert [round(float(ramp.value_at(s)), 4) for s in (0, 5, 10, 29, 30, 59, 60, 99)] == [
      0.0, 0.5, 1.0, 1.0, 0.1, 0.1, 0.0, 0.0]
