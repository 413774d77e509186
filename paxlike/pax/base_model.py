"""praxis.base_model: BaseModel for a Pax user's own model (compute_predictions, compute_loss).

paxml's mnist.py writes `class CNNModel(base_model.BaseModel)` with
`setup()` creating its network, `compute_predictions(input_batch)` and
`compute_loss(predictions, input_batch) -> (WeightedScalars, per_example)`.
Such a class runs as a paxlike model family: its fprop calls the two, and
trains on the metric the learner names (`task_p.train.learner.loss_name`,
which Pax requires and paxlike requires to be among compute_loss's metrics).

Every WeightedScalars entry `name: (value, weight)` becomes the metrics
`name` and `name-weight` (summaries/train and each eval's summaries), averaged
by its own weight as Pax does: sum(weight x value) / sum(weight) over pmap
devices, a step's microbatches (where num_* counts add up) and an eval set,
with the weights summed. A name paxlike's own metrics take (loss, num_tokens,
num_examples) is written under Pax's TensorBoard name, `Metrics/name`. The
loss metric's weight is what a step's gradient and eval loss are weighted by.
add_summary scalars of the layers join them. What the layers set with
update_var (batch norm's moving statistics) a train step stores.

A model that defines Pax's decode(input_batch) and process_decode_out(input_obj,
decode_out) decodes as in Pax (paxlike.evaluator runs the two for --mode=decode);
paxlike's own generation (infer, export) is refused in one line.

An eval or decode step in which some host runs a filler (it is out of batches while
others are not) marks every row, real or filler (FILLER_WEIGHT). The model's
WeightedScalars are already averaged over the batch, so under SPMD, whose batch holds
every host's rows, each host's rows are run apart and only the real hosts' pairs count
(_by_host). Under pmap a batch is one host's, and the mark scales its weights.

The model's FLOPs per step (for MFU) are XLA's count of the train step's
gradient (its cost analysis, before optimisation), as no formula knows a
user's layers; tokens per step are the examples (rows) of the batch.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from paxlike import nontrainable
from paxlike.errors import UserError
from paxlike.models.base import WEIGHT, NoDecoder
from paxlike.models.base import BaseModel as _ModelContract
from paxlike.pax import base_layer
from paxlike.pax.py_utils import NestedMap

Predictions = Any
WeightedScalars = dict
DecodeOut = tuple

# fprop's own metrics: the trained loss and its weights (the evaluator's and the step's).
_PAXLIKE_KEYS = ("loss", "num_tokens", "num_examples")

# The batch key with which padding_batch marks a filler batch (an eval host that ran out of
# batches before the others): its metrics weigh 0.
FILLER_WEIGHT = "paxlike_filler_weight"


def _nested(value: Any) -> Any:
  if isinstance(value, dict):
    return NestedMap({k: _nested(v) for k, v in value.items()})
  return value


class BaseModel(NoDecoder, base_layer.BaseLayer, _ModelContract):
  """praxis's BaseModel: subclasses implement compute_predictions and compute_loss."""

  NO_DECODER = ("a Pax model written with compute_predictions / compute_loss has no decoder "
                "paxlike runs (Pax's decode and process_decode_out are not run)")

  # The metric the learner minimises (task_p.train.learner.loss_name) and the most verbose
  # add_summary written (task_p.summary_verbosity); Task sets both (for_task).
  paxlike_loss_name: str = "total_loss"
  paxlike_summary_verbosity: int = 3

  def compute_predictions(self, input_batch: NestedMap) -> Predictions:
    raise NotImplementedError(f"{type(self).__name__} does not implement compute_predictions.")

  def compute_loss(self, predictions: Predictions, input_batch: NestedMap
                   ) -> tuple[WeightedScalars, dict[str, Any]]:
    raise NotImplementedError(f"{type(self).__name__} does not implement compute_loss.")

  def __call__(self, input_batch: NestedMap) -> tuple[WeightedScalars, dict[str, Any]]:
    return self.compute_loss(self.compute_predictions(input_batch), input_batch)

  def fprop(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(the learner's loss, every metric of compute_loss and add_summary)."""
    batch = dict(batch)
    filler = batch.pop(FILLER_WEIGHT, None)
    if filler is not None and _hosts_in_batch() > 1:
      # An eval step in which some hosts run fillers: their rows are left out.
      pairs = _by_host(self, "paxlike_loss_pairs", batch, filler)
      loss, weight = pairs[self.paxlike_loss_name]
      metrics = _metrics(pairs)
      metrics.update(loss=loss, num_tokens=weight, num_examples=jnp.sum(filler))
      return loss, metrics
    (pairs, summaries, moves) = self.paxlike_loss_pairs(batch, with_state=True)
    # update_var's new values reach the train step through the loss (adding 0 to it).
    loss = pairs[self.paxlike_loss_name][0] + sum(
        (nontrainable.moved(*m) for m in moves.values()), jnp.zeros((), jnp.float32))
    rows = jnp.asarray(_rows(batch), jnp.float32)
    if filler is not None:  # a batch of one host's rows (pmap, or one process)
      pairs = {k: (v, w * filler[0]) for k, (v, w) in pairs.items()}
      rows = rows * filler[0]
    weight = pairs[self.paxlike_loss_name][1]
    metrics = _metrics(pairs)
    for key, value in summaries.items():
      metrics.setdefault(key, value)
    metrics.update(loss=loss, num_tokens=weight, num_examples=rows)
    return loss, metrics

  def paxlike_loss_pairs(self, batch: dict[str, jax.Array], with_state: bool = False
                         ) -> Any:
    """compute_loss's WeightedScalars as float32 pairs (with_state: and the add_summary
    scalars and update_var moves of the pass)."""
    token = base_layer._SUMMARIES.set(({}, self.paxlike_summary_verbosity))
    moves_token = base_layer._MOVES.set({})
    try:
      weighted, _ = self(_nested(batch))
      summaries = base_layer._SUMMARIES.get()[0]
      moves = base_layer._MOVES.get()
    finally:
      base_layer._SUMMARIES.reset(token)
      base_layer._MOVES.reset(moves_token)
    name = self.paxlike_loss_name
    if name not in weighted:
      raise UserError(f"learner.loss_name={name!r} is not among {type(self).__name__}."
                      f"compute_loss's metrics ({', '.join(sorted(weighted))}); set "
                      "task_p.train.learner.loss_name to the one to minimise.")
    pairs = _weighted_pairs(self, "compute_loss", weighted)
    return (pairs, summaries, moves) if with_state else pairs

  # ------------------------------------------------------- the contract

  def for_task(self, loss_name: str, summary_verbosity: int) -> BaseModel:
    """This model training on the metric loss_name, writing add_summary scalars of a
    verbosity up to summary_verbosity (the task's)."""
    return self.clone(paxlike_loss_name=loss_name,
                      paxlike_summary_verbosity=summary_verbosity)

  def check_mesh(self, ici_mesh_shape: Any, dcn_mesh_shape: Any) -> None:
    """Raises UserError where the model's own mesh fields (Pax files set model_p.
    ici_mesh_shape too) differ from the experiment's, which is the mesh paxlike builds."""
    for field, value in (("ici_mesh_shape", ici_mesh_shape), ("dcn_mesh_shape", dcn_mesh_shape)):
      mine = getattr(self, field)
      if mine is not None and value is not None and list(mine) != list(value):
        raise UserError(f"task.model.{field} = {list(mine)} but the experiment's "
                        f"{field.upper()} = {list(value)}; paxlike builds the mesh from the "
                        f"experiment's, so set the two alike.")

  def input_features(self) -> tuple[str, ...]:
    return ()

  def init_batch(self, specs: dict[str, Any]) -> dict[str, jax.Array]:
    """One row of every feature the input gives (compute_predictions reads any of them)."""
    return {k: jnp.zeros((1, *specs[k].shape[1:]), jax.dtypes.canonicalize_dtype(specs[k].dtype))
            for k in specs if k != FILLER_WEIGHT}

  def decode_features(self) -> tuple[str, ...]:
    """Refused: paxlike's generation (infer, export, and decode where the model has no Pax
    decode) asks this first, so a subclass's own decode(input_batch) is never called with
    the contract's arguments."""
    if self.pax_decodes():
      raise UserError(f"{type(self).__name__} decodes with Pax's decode(input_batch) and "
                      "process_decode_out, which --mode=decode and decode_once run; infer "
                      "and export run paxlike's generation, which it has not.")
    return self.prefill(None, None)

  # ------------------------------------------------ Pax's decode protocol

  @classmethod
  def pax_decodes(cls) -> bool:
    """Whether the class defines Pax's decode(input_batch) (what paxlike.evaluator's decode
    then runs, with process_decode_out)."""
    return cls.decode is not _ModelContract.decode

  def process_decode_out(self, input_obj: Any, decode_out: NestedMap
                         ) -> tuple[WeightedScalars, list[tuple[str, Any]], dict[str, Any]]:
    """praxis's default: no metrics, no outputs to write."""
    del input_obj, decode_out
    return {}, [], {}

  def pax_decode_step(self, batch: dict[str, jax.Array]
                      ) -> tuple[dict[str, tuple[jax.Array, jax.Array]], Any, jax.Array]:
    """(decode's WeightedScalars as float32 pairs, its per-example outputs, per row 1 for
    an example and 0 for a filler's row) of a batch. The pairs leave fillers out."""
    batch = dict(batch)
    filler = batch.pop(FILLER_WEIGHT, None)
    if filler is None:
      return (*self.paxlike_decode_pairs(batch), jnp.ones((_rows(batch),), jnp.float32))
    if _hosts_in_batch() > 1:
      pairs, per_example = _by_host(self, "paxlike_decode_pairs", batch, filler)
      return pairs, per_example, filler
    pairs, per_example = self.paxlike_decode_pairs(batch)  # one host's rows
    return {k: (v, w * filler[0]) for k, (v, w) in pairs.items()}, per_example, filler

  def paxlike_decode_pairs(self, batch: dict[str, jax.Array]
                           ) -> tuple[dict[str, tuple[jax.Array, jax.Array]], Any]:
    """(decode's WeightedScalars as float32 pairs, its per-example outputs) of a batch."""
    out = type(self).decode(self, _nested(batch))
    if not isinstance(out, tuple | list) or len(out) not in (2, 3):
      raise UserError(f"{type(self).__name__}.decode returned {type(out).__name__}; Pax's "
                      "decode returns (weighted_scalars, per_example_out, metrics).")
    if len(out) == 3 and out[2]:
      raise UserError(f"{type(self).__name__}.decode returned clu metrics "
                      f"({', '.join(sorted(out[2]))}); paxlike does not run clu metrics, "
                      "return them as weighted scalars (value, weight).")
    return _weighted_pairs(self, "decode", out[0]), out[1]

  def pax_process_decode(self, input_obj: Any, per_example: Any
                         ) -> tuple[dict[str, tuple[Any, Any]], list[Any]]:
    """On the host: process_decode_out of one batch's gathered per-example outputs (as
    NestedMaps) -> (its WeightedScalars, checked as pairs, the values of its (key, value)
    outputs)."""
    out = self.process_decode_out(input_obj, _nested(per_example))
    if not isinstance(out, tuple | list) or len(out) != 3:
      raise UserError(f"{type(self).__name__}.process_decode_out returned "
                      f"{type(out).__name__}; Pax's returns (weighted_scalars, "
                      "[(key, value), ...], metrics).")
    weighted, processed, _ = out
    return (_weighted_pairs(self, "process_decode_out", weighted),
            [value for _, value in processed])

  def model_flops_per_step(self, specs: dict[str, jax.ShapeDtypeStruct]) -> float:
    """XLA's FLOP count of the train step's gradient for a global batch of `specs`."""
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in specs.items()}
    params = jax.eval_shape(lambda: self.init(jax.random.key(0), self.init_batch(specs),
                                              method="fprop")["params"])

    def grads(p: Any, b: dict[str, jax.Array]) -> Any:
      return jax.grad(lambda q: self.apply({"params": q}, b, method="fprop",
                                           rngs={"dropout": jax.random.key(0)})[0])(p)

    cost = jax.jit(grads).lower(params, batch).cost_analysis()
    if isinstance(cost, list | tuple):
      cost = cost[0] if cost else {}
    return float((cost or {}).get("flops", 0.0))

  def flops_source(self) -> str:
    return "XLA's count of the gradient"

  def tokens_per_step(self, specs: dict[str, jax.ShapeDtypeStruct]) -> int:
    """The examples of a step: a Pax model's batch has no token axis paxlike knows."""
    return int(_rows(specs))

  def compute_dtype(self) -> str:
    return jnp.dtype(self.fprop_dtype).name

  def padding_batch(self, host_batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """host_batch marked as a filler: its metrics weigh 0 (compute_loss's weights are the
    model's own, so the mark scales them)."""
    return {**host_batch, FILLER_WEIGHT: np.zeros((_rows(host_batch),), np.float32)}

  def beside_filler(self, host_batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """host_batch marked as real, in a step in which another host runs a filler."""
    return {**host_batch, FILLER_WEIGHT: np.ones((_rows(host_batch),), np.float32)}


def _hosts_in_batch() -> int:
  """Whose rows the batch a step sees holds: under SPMD (a mesh is set) every process's,
  in process order; under pmap (a device's rows) and on one device, one host's."""
  return 1 if jax.sharding.get_abstract_mesh().empty else jax.process_count()


def _by_host(model: BaseModel, method: str, batch: dict[str, jax.Array], filler: jax.Array
             ) -> Any:
  """model.METHOD(batch) -> (pairs, ...) run on each host's rows apart (vmapped over the
  hosts), its pairs combined over the hosts whose rows are real (filler: per row, 1 real
  and 0 a filler's), sum(value x weight) / sum(weight): what the real rows alone give.
  Anything else METHOD returns comes back with its rows in the batch's order."""
  hosts = _hosts_in_batch()
  unbound = model.clone(parent=None)
  variables = model.variables

  def split(x: jax.Array) -> jax.Array:
    return x.reshape(hosts, x.shape[0] // hosts, *x.shape[1:])

  def one_host(rows: dict[str, jax.Array]) -> Any:
    return unbound.apply(variables, rows, method=method)

  out = jax.vmap(one_host)(jax.tree.map(split, batch))
  pairs, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, ())
  real = split(filler)[:, 0]
  combined = {}
  for key, (value, weight) in pairs.items():
    weight = weight * real
    total = jnp.sum(weight)
    combined[key] = (jnp.sum(value * weight) / jnp.maximum(total, 1e-30), total)
  rest = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]) if x.ndim >= 2 else x, rest)
  return (combined, *rest) if rest else combined


def _metrics(pairs: dict[str, tuple[jax.Array, jax.Array]]) -> dict[str, jax.Array]:
  """fprop's metrics of compute_loss's pairs: each value under its name and its weight
  beside it (paxlike.models.base.WEIGHT), which microbatches, pmap devices and eval sets
  average it by. A name of paxlike's own (the loss it trains, the weights it counts) goes
  under Pax's TensorBoard name for it, Metrics/<name>."""
  out = {}
  for key, (value, weight) in pairs.items():
    name = f"Metrics/{key}" if key in _PAXLIKE_KEYS else key
    out[name], out[name + WEIGHT] = value, weight
  return out


def _weighted_pairs(model: Any, method: str, weighted: Any
                    ) -> dict[str, tuple[jax.Array, jax.Array]]:
  """praxis's WeightedScalars as {name: (value, weight)} in float32; one line for another
  shape of entry."""
  pairs = {}
  for key, entry in (weighted or {}).items():
    if not (isinstance(entry, tuple | list) and len(entry) == 2):
      raise UserError(f"{type(model).__name__}.{method} returned {key!r} as "
                      f"{type(entry).__name__}, not a (value, weight) pair (praxis's "
                      "WeightedScalars); paxlike does not run clu metrics.")
    pairs[key] = (jnp.asarray(entry[0], jnp.float32), jnp.asarray(entry[1], jnp.float32))
  return pairs


def _rows(batch: dict[str, Any]) -> int:
  """The leading dim of the batch's first array (its examples)."""
  for value in jax.tree.leaves(batch):
    if np.ndim(value):
      return int(np.shape(value)[0])
  return 1


__all__ = ["BaseModel", "DecodeOut", "Predictions", "WeightedScalars"]
