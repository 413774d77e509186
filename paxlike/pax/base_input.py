"""praxis.base_input: BaseInput, and LingvoInputAdaptor for Pax's lingvo-style inputs."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import fiddle as fdl

from paxlike.errors import UserError
from paxlike.inputs.base_input import BaseInput as _BaseInput
from paxlike.pax._hparams import HParams


@dataclasses.dataclass
class BaseInput(_BaseInput):
  """paxlike's BaseInput; `BaseInput.HParams(...)` configures a subclass as Pax did.

  praxis's `input_random_seed` sets `seed`. Two defaults are praxis's, for a Pax
  user's own input (paxml's mnist.py):
  an unnamed input is 'train' when is_training and 'input' otherwise, and an
  eval input with reset_for_eval ends its epoch itself (StopIteration), so
  `repeat` (paxlike's field) is False for it unless set.
  """

  HParams = HParams()
  name: str = ""
  repeat: bool | None = None
  input_random_seed: int | None = None  # praxis's name for `seed`

  def __post_init__(self) -> None:
    if self.input_random_seed is not None:
      self.seed = self.input_random_seed
    if not self.name:
      self.name = "train" if self.is_training else "input"
    if self.repeat is None:
      self.repeat = not (self.reset_for_eval and not self.is_training)
    super().__post_init__()

  def peek_specs(self) -> dict[str, Any]:
    """One batch get_next() returns, without moving the stream. An input holding what
    cannot be copied (a tf.data iterator, as Pax's own inputs do) reads its next batch and
    hands it back at the next get_next(), as praxis's peek does."""
    try:
      return super().peek_specs()
    except Exception:  # noqa: BLE001  (copying failed: read ahead instead)
      pass
    batch = self.get_next()

    def replay() -> dict[str, Any]:
      del self.get_next  # the class's get_next again
      return batch

    self.get_next = replay
    return batch

  def reset(self) -> None:
    """Back to the start: a batch read ahead by peek_specs is dropped (praxis's reset)."""
    self.__dict__.pop("get_next", None)


class LingvoInputAdaptor:
  """Pax's adaptor around a lingvo input generator; paxlike's inputs need no adaptor.

  `LingvoInputAdaptor.HParams(input=cfg, is_training=..., ...)` returns the
  inner input's config with the adaptor's fields set on it, so the run reads
  the inner input directly. A config of the adaptor itself,
  `pax_fiddle.Config(LingvoInputAdaptor, input=cfg, ...)`, is turned into the
  same inner config where the run gathers its inputs (unwrap_config), and
  builds into the inner input with those fields replaced.
  """

  def __new__(cls, input: _BaseInput, **fields: Any) -> _BaseInput:  # noqa: A002
    return dataclasses.replace(input, **_with_name(fields, input.is_training))

  @staticmethod
  def HParams(input: fdl.Config, **fields: Any) -> fdl.Config:  # noqa: A002, N802
    """The inner input's config, with the adaptor's fields (is_training, ...) on it."""
    if not isinstance(input, fdl.Buildable):
      raise UserError(f"LingvoInputAdaptor: input is {type(input).__name__}, not the config "
                      "of an input (e.g. input_generator.SyntheticLmData.HParams()).")
    cfg = copy.deepcopy(input)
    if "name" not in cfg.__arguments__:
      fields = _with_name(fields, fields.get("is_training", True))
    for key, value in fields.items():
      setattr(cfg, key, value)
    return cfg

  @classmethod
  def unwrap_config(cls, cfg: fdl.Config) -> fdl.Config:
    """A `pax_fiddle.Config(LingvoInputAdaptor, input=..., ...)` as the inner input's config."""
    fields = dict(cfg.__arguments__)
    if "input" not in fields:
      raise UserError("pax_fiddle.Config(LingvoInputAdaptor, ...) has no input; set input= "
                      "to the config of the input it adapts.")
    return cls.HParams(**fields)


class BaseInputSpecsProvider:
  """praxis's BaseInputSpecsProvider: what an experiment's get_input_specs_provider_params
  configures. get_input_specs() gives the batch's features as jax.ShapeDtypeStructs (a
  dict or NestedMap), with the rows of a process under SPMD and of a device under pmap. A
  run with no training input (eval or decode only) initialises the model from them. A
  subclass declares its fields as annotations, as praxis's do."""

  def __init_subclass__(cls, **kwargs: Any) -> None:
    super().__init_subclass__(**kwargs)
    if "__annotations__" in cls.__dict__:
      dataclasses.dataclass(cls, kw_only=True)

  def get_input_specs(self) -> Any:
    raise NotImplementedError(f"{type(self).__name__} does not implement get_input_specs.")


class DatasetInputSpecsProvider(BaseInputSpecsProvider):
  """praxis's: the specs of one batch of the input input_p configures (built and peeked,
  bound to this host; its rows are a process's, under pmap too)."""

  input_p: Any = None
  paxlike_rows_per_process = True  # a host batch's rows, which pmap does not divide

  def get_input_specs(self) -> Any:
    import jax

    from paxlike import config, experiment
    from paxlike.inputs.base_input import input_specs

    if self.input_p is None:
      raise UserError("pax_fiddle.Config(DatasetInputSpecsProvider) has no input; set "
                      "input_p to the config of the input whose shapes to take.")
    inp = config.build(experiment.input_config(self.input_p))
    inp.bind_host(jax.process_count(), jax.process_index())
    return input_specs(inp)


def _with_name(fields: dict[str, Any], is_training: bool) -> dict[str, Any]:
  """Names an unnamed eval input 'eval' (summaries/eval_test_eval), as paxlike's own do."""
  if "name" in fields or fields.get("is_training", is_training):
    return fields
  return {**fields, "name": "eval"}


__all__ = ["BaseInput", "BaseInputSpecsProvider", "DatasetInputSpecsProvider",
           "LingvoInputAdaptor"]
