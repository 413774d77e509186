"""The non-finite guard: a NaN/Inf loss or gradient stops the run before it is saved.

Every train step computes, on device, an int code of what was not finite
(steps.NONFINITE_KEY: the loss, the first parameter whose gradient is not
finite, or the gradient norm). The trainer hands each step's metrics to
`FiniteGuard.record`, which keeps a reference to that device scalar and does
not wait for it, so the host still runs ahead of the device. `check()` fetches
the codes recorded since the last check in one transfer; the trainer calls it
where it synchronises anyway (summary steps, where it fetches metrics) and
right before every checkpoint save (orbax reads the state off the device
there, so the step has to finish first), and at the end. A state that
follows a non-finite step is therefore never checkpointed, and the error
names the first bad step exactly, however far apart the checks are.

With skip=True (--skip_nonfinite_steps) the step itself kept the old
parameters and optimizer state; check() only logs what was skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from paxlike import log as logging
from paxlike.errors import UserError
from paxlike.steps import NONFINITE_KEY


def param_names(params: Any) -> list[str]:
  """'softmax/embedding'-style names of the parameter leaves, in tree order."""
  return ["/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
          for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


def _kind(value: float | None) -> str:
  if value is None:
    return "NaN or Inf"
  return "NaN" if np.isnan(value) else ("+Inf" if value > 0 else "-Inf")


class FiniteGuard:
  """Collects each step's non-finite code; check() raises at the first bad step.

  Args:
    names: parameter names in tree order (see param_names).
    unshard: device metrics -> host values (the partitioner's unshard).
    skip: the steps skip non-finite updates; log them instead of raising.
  """

  def __init__(self, names: list[str], unshard: Callable[[Any], Any] = jax.device_get,
               skip: bool = False) -> None:
    self.names = names
    self.unshard = unshard
    self.skip = skip
    self.skipped = 0
    self._pending: list[tuple[int, Any, Any]] = []

  def record(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
    """Keeps step's code (no sync); returns the metrics without it, for summaries."""
    metrics = dict(metrics)
    code = metrics.pop(NONFINITE_KEY, None)
    if code is not None:
      self._pending.append((step, code, metrics.get("loss")))
    return metrics

  def describe(self, code: int, loss: float | None) -> str:
    """The first offending quantity of a step, in words."""
    if code == 1:
      return f"the loss is {_kind(loss)}"
    index = code - 2
    if 0 <= index < len(self.names):
      return f"the gradient of {self.names[index]} has NaN or Inf values"
    return "the gradient norm is not finite (the gradients overflow)"

  def check(self, last_checkpoint: int | None = None) -> None:
    """Fetches the pending codes; raises at the first non-finite step (or logs it when skipping).

    Raises:
      UserError: a recorded step had a NaN/Inf loss or gradient.
    """
    if not self._pending:
      return
    pending, self._pending = self._pending, []
    codes = [int(c) for c in self.unshard([c for _, c, _ in pending])]
    for (step, _, loss_ref), code in zip(pending, codes, strict=True):
      if code == 0:
        continue
      loss = float(self.unshard(loss_ref)) if loss_ref is not None else None
      what = self.describe(code, loss)
      if self.skip:
        self.skipped += 1
        logging.warning("step %d skipped: %s (kept the parameters of the step before; %d "
                        "skipped so far)", step, what, self.skipped)
        continue
      kept = (f"the last good checkpoint, step {last_checkpoint}, is kept and nothing later "
              "was saved" if last_checkpoint else "no checkpoint was saved from this run")
      raise UserError(
          f"training diverged at step {step}: {what} ({kept}); lower LEARNING_RATE or raise "
          "CLIP_GRADIENT_NORM_TO_VALUE, check the input data, or rerun with "
          "--skip_nonfinite_steps to skip such updates.")
