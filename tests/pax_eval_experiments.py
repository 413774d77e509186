"""Test-only Pax experiments for tests/pax_eval_jobs_test.py (import path: tests/ on
PYTHONPATH): a Pax user's file (paxlike.pax imports), a linear regression with Pax's
compute_loss, decode and process_decode_out, whose eval rows carry their index.

- Regress: trains 4 steps; its eval ("held") and decode ("rows") sets hold 12 examples,
  split over the hosts by EVAL_SHARES (each host's count) or evenly.
- RegressDecodeOnly: no datasets(); its model initialises from the shapes its
  get_input_specs_provider_params() gives.
- RegressDecodeOnlyNoSpecs: no datasets() and no provider.
- ArithmeticUnevenHosts: paxlike's own LM (ArithmeticAdditionTiny), whose decode set
  host 1 of 2 holds one batch fewer of.
"""

from __future__ import annotations

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np

from experiments.lm.arithmetic import ArithmeticAdditionTiny
from paxlike.inputs.text import TextInput
from paxlike.pax import (
  base_experiment,
  base_input,
  base_model,
  experiment_registry,
  learners,
  optimizers,
  pax_fiddle,
  py_utils,
  schedules,
  tasks_lib,
)
from paxlike.pax.layers import activations, linears

NestedMap = py_utils.NestedMap
W = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)


class Regression(base_model.BaseModel):
  def setup(self) -> None:
    self.create_child("ff", pax_fiddle.Config(
        linears.FeedForward, input_dims=4, output_dims=3,
        activation_tpl=pax_fiddle.Config(activations.Identity)))

  def compute_predictions(self, input_batch):
    return self.ff(input_batch.x)

  def compute_loss(self, predictions, input_batch):
    rows = jnp.asarray(input_batch.x.shape[0], jnp.float32)
    return NestedMap(mse=(jnp.mean((predictions - input_batch.y) ** 2), rows)), NestedMap()

  def decode(self, input_batch):
    out = self.compute_predictions(input_batch)
    rows = jnp.asarray(out.shape[0], jnp.float32)
    return (NestedMap(mean_out=(jnp.mean(out), rows)),
            NestedMap(out=out, y=input_batch.y, idx=input_batch.idx), NestedMap())

  def process_decode_out(self, input_obj, decode_out):
    err = np.abs(decode_out.out - decode_out.y).sum(-1)
    lines = [(str(int(i)), {"idx": int(i), "err": float(e)})
             for i, e in zip(decode_out.idx, err, strict=True)]
    return NestedMap(mean_err=(err.mean(), len(err))), lines, NestedMap()


class Rows(base_input.BaseInput):
  """Example i: x from a seeded normal, y = x @ W. Training draws forever; an eval input
  holds num_examples, split over the hosts by `shares` (each host's count), else evenly."""

  num_examples: int = 12
  shares: tuple = ()

  def _range(self):
    hosts, host = self.num_infeed_hosts, self.infeed_host_index
    shares = list(self.shares) or [self.num_examples // hosts] * hosts
    start = sum(shares[:host])
    return start, start + shares[host]

  def get_next(self):
    if self.is_training:
      self._n = getattr(self, "_n", 0) + 1
      idx = np.arange(self.batch_size) + 1000 * self._n + 100000 * self.infeed_host_index
    else:
      start, stop = self._range()
      first = start + getattr(self, "_n", 0) * self.batch_size
      if first >= stop:
        raise StopIteration
      self._n = getattr(self, "_n", 0) + 1
      idx = np.arange(first, first + self.batch_size)
    x = np.stack([np.random.default_rng(int(i)).normal(size=4) for i in idx]).astype(np.float32)
    return NestedMap(x=x, y=x @ W, idx=idx.astype(np.int32))

  def reset(self):
    self._n = 0


class XSpecs(base_input.BaseInputSpecsProvider):
  batch_size: int = 1

  def get_input_specs(self):
    return NestedMap(x=jax.ShapeDtypeStruct((self.batch_size, 4), jnp.float32),
                     y=jax.ShapeDtypeStruct((self.batch_size, 3), jnp.float32),
                     idx=jax.ShapeDtypeStruct((self.batch_size,), jnp.int32))


@experiment_registry.register
class Regress(base_experiment.BaseExperiment):
  BATCH_SIZE = 2
  EVAL_SHARES = ()
  ICI_MESH_SHAPE = [1, 1, 1]
  DCN_MESH_SHAPE = None

  def task(self):
    optimizer_p = pax_fiddle.Config(optimizers.Adam,
                                    lr_schedule=pax_fiddle.Config(schedules.Constant, value=1))
    optimizer_p.learning_rate = 0.05
    learner_p = pax_fiddle.Config(learners.Learner, loss_name="mse", optimizer=optimizer_p)
    return pax_fiddle.Config(
        tasks_lib.SingleTask, name="regress", model=pax_fiddle.Config(Regression),
        train=pax_fiddle.Config(tasks_lib.SingleTask.Train, learner=learner_p,
                                num_train_steps=4, eval_interval_steps=4))

  def _eval(self, name):
    return pax_fiddle.Config(Rows, name=name, batch_size=self.BATCH_SIZE, is_training=False,
                             reset_for_eval=True, shares=tuple(self.EVAL_SHARES))

  def datasets(self):
    return [pax_fiddle.Config(Rows, batch_size=self.BATCH_SIZE, is_training=True),
            self._eval("held")]

  def decode_datasets(self):
    return [self._eval("rows")]


@experiment_registry.register
class RegressDecodeOnly(Regress):
  def datasets(self):
    return []

  def get_input_specs_provider_params(self):
    return pax_fiddle.Config(XSpecs).set(batch_size=self.BATCH_SIZE)


@experiment_registry.register
class RegressDecodeOnlyNoSpecs(Regress):
  def datasets(self):
    return []


class _EndsEarlyOnHost1(TextInput):
  """The held-out prompts, but host 1 of 2 stops one batch before host 0 (its last batch
  is all padding rows here), as a sharded finite input may."""

  def get_next(self):
    if self.hosts == (2, 1) and not self.repeat and self._index >= self.num_batches() - 1:
      raise StopIteration
    return super().get_next()


@experiment_registry.register
class ArithmeticUnevenHosts(ArithmeticAdditionTiny):
  """ArithmeticAdditionTiny whose decode set host 1 holds one batch fewer of."""

  def own_decode_datasets(self):
    return [fdl.Config(_EndsEarlyOnHost1, **fdl.ordered_arguments(cfg))
            for cfg in super().own_decode_datasets()]
