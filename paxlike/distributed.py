"""Multi-host setup on JAX's own multi-controller runtime (jax.distributed).

One process per host. Explicit flags (--coordinator_address, --num_processes,
--process_id) win; otherwise a cluster that jax.distributed.initialize()
detects by itself (TPU pods, SLURM, Open MPI, ...) is used; otherwise the run
is single-process. On CPU the cross-process collectives go through gloo.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time

from paxlike import log
from paxlike.errors import UserError

# Environment variables that say "this process is one of several".
_CLUSTER_HINTS = (
    ("SLURM_NTASKS", lambda v: int(v) > 1),
    ("OMPI_COMM_WORLD_SIZE", lambda v: int(v) > 1),
    ("TPU_WORKER_HOSTNAMES", lambda v: "," in v),
    ("MEGASCALE_COORDINATOR_ADDRESS", bool),
)


def cluster_detected() -> bool:
  for name, test in _CLUSTER_HINTS:
    value = os.environ.get(name)
    if value:
      try:
        if test(value):
          return True
      except ValueError:
        continue
  return False


def _split_address(address: str) -> tuple[str, int]:
  host, sep, port = address.rpartition(":")
  if not sep or not port.isdigit():
    raise UserError(f"--coordinator_address {address!r} is not HOST:PORT.")
  return host.strip("[]") or "127.0.0.1", int(port)


def wait_for_coordinator(address: str, timeout_s: float) -> None:
  """Polls the coordinator's port until it accepts a connection.

  jax.distributed aborts the whole process (no Python exception) when the
  coordinator never answers, so a non-zero process checks first.

  Raises:
    UserError: the coordinator did not answer within timeout_s.
  """
  host, port = _split_address(address)
  deadline = time.monotonic() + timeout_s
  last = "no answer"
  while time.monotonic() < deadline:
    try:
      with socket.create_connection((host, port), timeout=min(2.0, timeout_s)):
        return
    except OSError as e:
      last = e.strerror or str(e)
      time.sleep(0.25)
  raise UserError(f"cannot reach the coordinator at {address} within {timeout_s:g}s ({last}); "
                  "start process 0 first or fix --coordinator_address.")


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, timeout_s: int = 300) -> bool:
  """Starts jax.distributed when this is a multi-process job; True if it did.

  Must run before anything starts a JAX backend.
  """
  import jax

  explicit = (coordinator_address is not None or (num_processes or 1) > 1
              or process_id not in (None, 0))  # --process_id=1 alone is a partial set
  if not explicit and not cluster_detected():
    return False
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if not explicit:
    log.info("cluster environment detected: jax.distributed.initialize() auto-detects it")
    jax.distributed.initialize(initialization_timeout=timeout_s)
    return True
  if coordinator_address is None or num_processes is None or process_id is None:
    raise UserError("a multi-process run needs --coordinator_address, --num_processes and "
                    "--process_id together.")
  if not 0 <= process_id < num_processes:
    raise UserError(f"--process_id {process_id} is outside [0, {num_processes}).")
  if process_id != 0:
    wait_for_coordinator(coordinator_address, timeout_s)
  jax.distributed.initialize(coordinator_address, num_processes=num_processes,
                             process_id=process_id, initialization_timeout=timeout_s)
  return True


_REFUSED = "paxlike/refused/"  # the coordination service's keys: process index -> why


def _client() -> object | None:
  """jax.distributed's client in a multi-process run that started it, else None (never
  imports JAX: a run refused before the backend has no other process waiting on it)."""
  module = sys.modules.get("jax._src.distributed")
  state = getattr(module, "global_state", None)
  client = getattr(state, "client", None)
  return client if client is not None and (state.num_processes or 1) > 1 else None


def share_refusal(message: str) -> None:
  """Leaves why this process refuses the run where the others can read it: a refusal that
  only one process meets (a file only its host lacks) leaves the others waiting in the
  run's next collective until it times out, and they then name this one (peer_refusal)."""
  client = _client()
  if client is None:
    return
  import jax

  with contextlib.suppress(Exception):  # the service may already be gone
    client.key_value_set(f"{_REFUSED}{jax.process_index()}", message)  # type: ignore[attr-defined]


def peer_refusal() -> str | None:
  """"process K refused the run: <why>" when another process did (share_refusal), else
  None; asked when this process failed in a collective."""
  client = _client()
  if client is None:
    return None
  try:
    entries = client.key_value_dir_get(_REFUSED)  # type: ignore[attr-defined]
  except Exception:  # the service went with process 0
    return None
  if not entries:
    return None
  key, message = min(entries, key=lambda kv: int(kv[0].rsplit("/", 1)[-1]))
  return f"process {key.rsplit('/', 1)[-1]} refused the run: {message}"
