"""The BaseInput contract (Pax semantics).

`get_next()` returns a dict of numpy arrays whose leading dim is the per-host
batch. The global batch is batch_size x num_infeed_hosts, and the global batch
at a step does not depend on how many hosts read it.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np

from paxlike.errors import UserError


@dataclasses.dataclass
class BaseInput:
  """Base of every input pipeline.

  Attributes:
    name: used for summary directories (eval_test_<name>) and decoder_out/<name>.
    batch_size: examples per host per get_next().
    num_infeed_hosts: how many hosts read this input; 0 means "fill in at run time".
    infeed_host_index: this host's index among them; -1 means "fill in at run time".
    is_training: the training input (True) or an eval/decode input.
    reset_for_eval: each eval run is one full epoch of a finite input.
    eval_loop_num_batches: batches per eval run when reset_for_eval is False.
    repeat: cycle through the data forever.
    seed: input randomness; combined with the step so batches are reproducible.
  """

  name: str = "train"
  batch_size: int = 1
  num_infeed_hosts: int = 0
  infeed_host_index: int = -1
  is_training: bool = True
  reset_for_eval: bool = False
  eval_loop_num_batches: int = 1
  repeat: bool = True
  seed: int = 1234

  def __init_subclass__(cls, **kwargs: Any) -> None:
    """Makes a subclass that declares fields as annotations a dataclass, as praxis does.

    A praxis input declares its hyperparameters as class annotations without
    @dataclass; an explicit @dataclasses.dataclass on top still works.
    """
    super().__init_subclass__(**kwargs)
    if "__annotations__" not in cls.__dict__:
      return
    dataclasses.dataclass(cls, kw_only=True)
    for f in dataclasses.fields(cls):
      # dataclass() removes default_factory fields from the class; put them back so a
      # decorator applied after this one sees the same fields.
      if (f.name in cls.__dict__["__annotations__"] and f.default is dataclasses.MISSING
          and f.default_factory is not dataclasses.MISSING):
        setattr(cls, f.name, f)

  def __post_init__(self) -> None:
    if self.batch_size <= 0:
      raise UserError(f"input {self.name!r}: batch_size must be positive, got {self.batch_size}.")
    self.validate()

  def validate(self) -> None:
    """Rejects the combinations Pax does not support, with the reason.

    | reset_for_eval | repeat | eval_loop_num_batches | an eval run is            |
    | True           | False  | ignored               | one full epoch, padded    |
    | True           | True   | -                     | rejected: never ends      |
    | False          | True   | N > 0                 | the next N batches        |
    | False          | True   | <= 0                  | rejected: no fixed size   |
    | False          | False  | -                     | rejected: would run dry   |
    """
    where = f"input {self.name!r}"
    if self.is_training:
      if self.reset_for_eval:
        raise UserError(f"{where}: reset_for_eval applies to eval inputs; a training input "
                        "(is_training=True) cannot be reset for eval.")
      return
    if self.reset_for_eval and self.repeat:
      raise UserError(f"{where}: reset_for_eval=True runs one epoch per eval, which a repeating "
                      "input never ends; set repeat=False.")
    if not self.reset_for_eval and self.eval_loop_num_batches <= 0:
      raise UserError(f"{where}: reset_for_eval=False needs eval_loop_num_batches > 0 (a dynamic "
                      "number of batches without reset is unsupported); set it or reset_for_eval.")
    if not self.reset_for_eval and not self.repeat:
      raise UserError(f"{where}: reset_for_eval=False takes the next eval_loop_num_batches "
                      "batches of a stream, which a finite input (repeat=False) would run out "
                      "of; set repeat=True or reset_for_eval=True.")

  def bind_host(self, num_hosts: int, host_index: int) -> None:
    """Fills in the host layout at run time (a value set by the user wins)."""
    if self.num_infeed_hosts <= 0:
      self.num_infeed_hosts = num_hosts
    if self.infeed_host_index < 0:
      if self.num_infeed_hosts < num_hosts:
        # Refused by every process alike: a refusal by the processes past the last
        # infeed host alone would leave the others waiting in the run's first collective.
        raise UserError(
            f"input {self.name!r}: num_infeed_hosts={self.num_infeed_hosts} is fewer than the "
            f"{num_hosts} processes, so processes {self.num_infeed_hosts}..{num_hosts - 1} "
            "would read no share of the batch; give every process a share (a per-host batch "
            "that divides the global batch, e.g. a whole PERCORE_BATCH_SIZE x local devices) "
            "or set infeed_host_index per process.")
      self.infeed_host_index = host_index
    if not 0 <= self.infeed_host_index < self.num_infeed_hosts:
      raise UserError(f"input {self.name!r}: infeed_host_index {self.infeed_host_index} is "
                      f"outside [0, {self.num_infeed_hosts}).")

  def check_model(self, model: Any) -> None:
    """Raises UserError (one line) if what this input makes cannot feed `model`; called
    once both are built, before anything is written. Most inputs fit any model."""
    del model

  @property
  def hosts(self) -> tuple[int, int]:
    return max(self.num_infeed_hosts, 1), max(self.infeed_host_index, 0)

  def get_global_batch_size(self) -> int:
    return self.batch_size * self.hosts[0]

  def get_next(self) -> dict[str, np.ndarray]:
    """The next per-host batch; raises StopIteration at the end of a finite input."""
    raise NotImplementedError

  def reset(self) -> None:
    """Back to the start of the data."""
    raise NotImplementedError

  def peek_specs(self) -> dict[str, np.ndarray]:
    """One batch with the shapes and dtypes get_next() returns; the stream does not move."""
    return copy.deepcopy(self).get_next()

  def ids_to_strings(self, ids: np.ndarray, lengths: np.ndarray | None = None) -> list[str]:
    """Detokenises rows; inputs without a vocabulary show the ids."""
    rows = np.asarray(ids)
    return [" ".join(str(int(t)) for t in (r[:int(lengths[i])] if lengths is not None else r))
            for i, r in enumerate(rows)]

  def score(self, targets: list[str], predictions: list[str]) -> dict[str, float]:
    """Decode metrics; exact match unless the input knows better."""
    hits = sum(t.strip() == p.strip() for t, p in zip(targets, predictions, strict=True))
    return {"exact_match": hits / max(len(targets), 1)}

  def packing_efficiency(self, batch: dict[str, np.ndarray]) -> float | None:
    """The fraction of a batch's token positions holding real tokens (None: not measured)."""
    del batch
    return None

  def get_state(self) -> dict[str, Any]:
    """JSON-able position in the stream, saved with checkpoints."""
    return {}

  def set_state(self, state: dict[str, Any]) -> None:
    """Continues the stream from a position returned by get_state()."""
    del state


def input_specs(inp: BaseInput) -> dict[str, Any]:
  """The features of one per-host batch of `inp`, as jax.ShapeDtypeStructs (nothing is read)."""
  import jax

  return {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in inp.peek_specs().items()}


@dataclasses.dataclass
class SpecsInput(BaseInput):
  """The stand-in for the training input of a run that has none (eval or decode only):
  the batch shapes an experiment's input specs provider gives, which the model initialises
  from. Nothing reads its batches."""

  specs: dict[str, Any] = dataclasses.field(default_factory=dict)

  def get_next(self) -> dict[str, np.ndarray]:
    raise UserError(f"input {self.name!r} only gives the shapes the model initialises from; "
                    "it has no batches to read.")

  def reset(self) -> None:
    pass

  def peek_specs(self) -> dict[str, np.ndarray]:
    """Zeros of the specs' shapes, as views of one zero each (no batch is allocated)."""
    return {k: np.broadcast_to(np.zeros((), dtype), shape)
            for k, (shape, dtype) in self.specs.items()}


def specs_input(specs: Any, rows_factor: int, where: str) -> SpecsInput:
  """A SpecsInput of `specs` (a mapping of feature -> anything with .shape and .dtype, one
  batch: rows first), the rows multiplied by rows_factor (a pmap provider's are a device's).

  Raises:
    UserError: (naming `where`) not such a mapping, or features whose rows differ.
  """
  if not isinstance(specs, dict) or not specs:
    raise UserError(f"{where} returned {type(specs).__name__}; it returns a dict (or "
                    "NestedMap) of feature name -> jax.ShapeDtypeStruct.")
  flat = {}
  for key, spec in specs.items():
    shape = getattr(spec, "shape", None)
    if isinstance(spec, dict) or shape is None or not hasattr(spec, "dtype") or not shape:
      raise UserError(f"{where} gave {key!r} as {type(spec).__name__}; paxlike takes a flat "
                      "dict of jax.ShapeDtypeStruct, each with the batch's rows first.")
    flat[key] = ((int(shape[0]) * rows_factor, *map(int, shape[1:])), np.dtype(spec.dtype))
  rows = {shape[0] for shape, _ in flat.values()}
  if len(rows) != 1:
    raise UserError(f"{where} gave features with different numbers of rows "
                    f"({', '.join(f'{k} {s[0]}' for k, (s, _) in flat.items())}); a batch's "
                    "features share their first dim.")
  return SpecsInput(name="input_specs", batch_size=rows.pop(), specs=flat)
