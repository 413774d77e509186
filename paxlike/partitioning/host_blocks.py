"""Host-to-device copies that let go of the host block before the next one is read."""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# A transfer that has not let go of its block after this long is left to the
# collector; the import goes on (it only holds one more block for a while).
_RELEASE_WAIT_S = 2.0


def process_copy(x: Any) -> Any:
  """This process's copy of a value replicated over every process's devices (reading the
  whole array would need the others); any other value as it is."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return x.addressable_data(0)
  return x


def put_and_release(block: np.ndarray, put: Callable[[np.ndarray], list[jax.Array]]
                    ) -> list[jax.Array]:
  """put(block) (device_puts of it), done once JAX no longer holds the block.

  Two things kept earlier blocks alive, so the streaming import's peak moved
  between 50 and 109 MB for the same 249 MB checkpoint (JAX 0.10 and 0.12):
  - a CPU device adopts a 64-byte-aligned numpy block as its buffer even
    with may_alias=False: such a copy is copied again on the device, so the
    parameter never lives in the reader's block;
  - after a transfer, JAX drops its reference to the block only when its
    garbage callback runs (a gc pass) after the transfer thread is done.
  The caller reads its next block only once this one is free, so the host
  holds one block (and the tensor it is cut from), whatever the timing.
  """
  held = sys.getrefcount(block)
  placed = jax.block_until_ready(put(block))
  pointer = block.ctypes.data if block.size else None
  placed = [jnp.copy(p) if pointer is not None and _buffer(p) == pointer else p
            for p in placed]
  jax.block_until_ready(placed)
  deadline = time.monotonic() + _RELEASE_WAIT_S
  gc.collect(0)  # runs JAX's callback that releases finished transfers' host buffers
  while sys.getrefcount(block) > held and time.monotonic() < deadline:
    time.sleep(0.0005)
    gc.collect(0)
  return placed


def _buffer(array: jax.Array) -> int | None:
  """The device buffer's address (a host address on a CPU device)."""
  try:
    return array.unsafe_buffer_pointer()
  except Exception:  # a platform or layout that has no single pointer to give
    return None
