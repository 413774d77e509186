"""Initial weights: what a run with no checkpoint of its own starts from.

T5X calls it the initial checkpoint, Pax `init_from_checkpoint_rules`. An
experiment names it with the hyperparameter INIT_FROM (the flag --init_from
overrides it):

    INIT_FROM = "hf:/path/to/flan-t5-base"   # a Hugging Face save_pretrained directory

A train run whose job_log_dir holds no checkpoint starts from these
parameters with a fresh optimizer; a rerun resumes from its own checkpoints
as usual; eval, decode and export with no checkpoint use them as they are.
`check()` runs in the preflight, before anything is written, so a config
that does not fit the experiment fails while job_log_dir is untouched.
"""

from __future__ import annotations

import os
from typing import Any

from paxlike.errors import UserError

KINDS = ("hf",)


def parse(spec: str) -> tuple[str, str]:
  """'hf:DIR' -> ('hf', absolute DIR).

  Raises:
    UserError: no known prefix.
  """
  kind, sep, path = spec.partition(":")
  if not sep or kind not in KINDS or not path:
    raise UserError(f"INIT_FROM / --init_from {spec!r} is not one of "
                    f"{', '.join(k + ':PATH' for k in KINDS)}; e.g. hf:/path/to/flan-t5-base.")
  return kind, os.path.abspath(os.path.expanduser(path))


def check(spec: str, model: Any) -> None:
  """Raises UserError when the source is missing or does not fit the model (reads metadata)."""
  from paxlike.interop import hf

  _, path = parse(spec)
  model.hf_config()  # a family with no Hugging Face layout says so first
  hf.check_config(hf.read_config(path), model)


def load_params(spec: str, model: Any, abstract_params: Any) -> Any:
  """The source's parameters as a tree of host arrays shaped like abstract_params.

  Raises:
    UserError: the source is missing, does not fit the model, or lacks a parameter.
  """
  import jax
  import numpy as np

  from paxlike import checkpoints as ckpt_lib
  from paxlike.interop import hf

  check(spec, model)
  _, path = parse(spec)
  params = hf.import_params(path, model)
  problem = ckpt_lib.first_mismatch(abstract_params, jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), params))
  if problem:
    raise UserError(f"the parameters of {spec} do not fit this experiment's model: {problem}.")
  return params


def state_from_params(params: Any, tx: Any, partitioner: Any) -> Any:
  """A step-0 TrainState of the given parameters and a fresh optimizer, in the run's layout."""
  import jax.numpy as jnp

  from paxlike.train_state import TrainState

  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  return partitioner.shard_state(state)
