"""The serving function every compiled export wraps, and its lowering with jax.export.

    serve(params, *features, seed) -> (tokens [b, K, T] int32, scores [b, K] float32)

`params` is a flat list of float32 arrays in `param_names` order (the
order jax.tree flattens the parameter dict: sorted keys), so an export
stores its weights beside the program, not inside it, and a runner needs
no pytree to call it. `features` are the model's decode_features() in
order, with a symbolic batch `b`; `seed` is an int32 scalar that seeds
sampling (greedy and beam search ignore it). Inside, each parameter is
cast to its checkpoint dtype and model.decode runs with the export's
DecodeSettings: the program is the one the job's own decode runs.

The function is traced outside any mesh, so the model's logical sharding
constraints are no-ops and the artifact is a single-device program that
runs on whichever platform it was lowered for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from paxlike.errors import UserError
from paxlike.layers import attention_policy

PARAM_DTYPE = np.float32
SEED_NAME = "seed"
SEED_DTYPE = np.int32
OUTPUTS = (("tokens", np.int32), ("scores", np.float32))


def param_names(tree: Any) -> list[str]:
  """'a/b/c' per leaf, in jax.tree's flattening order."""
  return ["/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
          for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def flat_params(params: Any, abstract: Any) -> list[np.ndarray]:
  """The parameter values as float32 numpy arrays, in param_names order, checked."""
  leaves, treedef = jax.tree.flatten(jax.device_get(params))
  want_leaves, want_def = jax.tree.flatten(abstract)
  if treedef != want_def:
    raise UserError("the restored parameters do not have the model's structure; the "
                    "checkpoint belongs to another experiment or --set override.")
  out = []
  for name, x, want in zip(param_names(abstract), leaves, want_leaves, strict=True):
    if tuple(np.shape(x)) != tuple(want.shape):
      raise UserError(f"parameter {name} has shape {np.shape(x)} in the checkpoint but the "
                      f"model expects {tuple(want.shape)}.")
    out.append(np.asarray(x, PARAM_DTYPE))
  return out


def serving_fn(model: Any, settings: Any, abstract: Any) -> Callable[..., Any]:
  """serve(params, *features, seed) for this model and DecodeSettings (see the module doc)."""
  leaves, treedef = jax.tree.flatten(abstract)
  names = tuple(model.decode_features())

  def serve(flat: list[jax.Array], *args: jax.Array) -> tuple[jax.Array, jax.Array]:
    *features, seed = args
    params = jax.tree.unflatten(
        treedef, [p.astype(a.dtype) for p, a in zip(flat, leaves, strict=True)])
    out = model.decode(params, dict(zip(names, features, strict=True)),
                       jax.random.key(seed), settings)
    return out.tokens.astype(jnp.int32), out.scores.astype(jnp.float32)

  return serve


def arg_specs(job: Any, batch: Any) -> list[Any]:
  """ShapeDtypeStructs of serve's arguments for a batch size (an int or a symbolic dim)."""
  params = [jax.ShapeDtypeStruct(a.shape, PARAM_DTYPE)
            for a in jax.tree.leaves(job.abstract_params)]
  features = [jax.ShapeDtypeStruct((batch, *f.shape), f.dtype) for f in job.features]
  return [params, *features, jax.ShapeDtypeStruct((), SEED_DTYPE)]


def lower(job: Any) -> jax.export.Exported:
  """serve lowered for job.platforms with a symbolic batch size `b`.

  Raises:
    UserError: the decode cannot be exported with these settings (the
      reason jax.export gave is in the message).
  """
  (batch,) = jax.export.symbolic_shape("b")
  fn = jax.jit(serving_fn(job.model, job.settings, job.abstract_params))
  try:
    # Exports keep XLA attention, also on a GPU host: cuDNN cannot be lowered for other
    # platforms (nor on a host without a GPU), and jax.export refuses its custom call.
    with attention_policy.portable():
      return jax.export.export(fn, platforms=job.platforms)(*arg_specs(job, batch))
  except Exception as e:  # any tracing or lowering failure: the settings are the user's to change
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise UserError(
        f"the decode of {type(job.model).__name__} with {describe_settings(job.settings)} "
        f"cannot be exported for {', '.join(job.platforms)} with a symbolic batch size: "
        f"{type(e).__name__}: {reason}; change the --decode_* flags or "
        "--export_platforms.") from None


def describe_settings(settings: Any) -> str:
  """The DecodeSettings in the words of the flags."""
  if settings.num_beams > 1:
    how = f"beam search ({settings.num_beams} beams, alpha {settings.alpha})"
  elif settings.temperature > 0:
    how = (f"sampling (temperature {settings.temperature}, top_k {settings.top_k}, "
           f"top_p {settings.top_p})")
  else:
    how = "greedy decoding"
  if settings.max_decode_length is not None:
    how += f", at most {settings.max_decode_length} tokens"
  return how


