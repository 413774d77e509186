"""The platform a program is lowered for, which some layers' choices depend on."""

from __future__ import annotations

import jax


def lowering_platform() -> str:
  """The platform this process lowers for: 'cpu', 'tpu', 'cuda' or 'rocm'."""
  backend = jax.default_backend()
  if backend != "gpu":
    return backend
  try:
    from jax.extend import backend as jax_backend

    version = jax_backend.get_backend().platform_version.lower()
  except Exception:  # an unusual plugin: assume CUDA, cuDNN's refusal then falls back
    return "cuda"
  return "rocm" if "rocm" in version else "cuda"
