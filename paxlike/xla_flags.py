"""XLA flags and the run_env.json record of the environment a run saw."""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from typing import Any


def run_env(extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """Platform, devices, versions and flags; starts the JAX backend."""
  import jax

  devices = jax.devices()
  env = {
      "platform": devices[0].platform,
      "device_kind": devices[0].device_kind,
      "device_count": jax.device_count(),
      "local_device_count": jax.local_device_count(),
      "process_index": jax.process_index(),
      "process_count": jax.process_count(),
      "host": socket.gethostname(),
      "python": sys.version.split()[0],
      "machine": platform.machine(),
      "jax_version": jax.__version__,
      "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
      "LIBTPU_INIT_ARGS": os.environ.get("LIBTPU_INIT_ARGS", ""),
  }
  env.update(extra or {})
  return env


def write_run_env(job_log_dir: str, env: dict[str, Any]) -> None:
  with open(os.path.join(job_log_dir, "run_env.json"), "w") as f:
    json.dump(env, f, indent=2, sort_keys=True, default=str)
    f.write("\n")
