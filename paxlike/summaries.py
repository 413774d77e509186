"""TensorBoard event files and the human-readable step log."""

from __future__ import annotations

import os
from collections.abc import Mapping

from paxlike import log as logging


class SummaryWriter:
  """Scalars under job_log_dir/summaries/<name>/; a no-op when disabled.

  Only process 0 writes, so multi-host runs produce one set of event files.
  """

  def __init__(self, job_log_dir: str, name: str, enabled: bool = True) -> None:
    self.path = os.path.join(job_log_dir, "summaries", name)
    self._writer = None
    if enabled:
      from tensorboardX import SummaryWriter as TBWriter  # noqa: N814  (deferred: slow import)
      self._writer = TBWriter(self.path, flush_secs=30)

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    if self._writer is None:
      return
    for k, v in values.items():
      self._writer.add_scalar(k, float(v), step)

  def text(self, step: int, tag: str, value: str) -> None:
    if self._writer is not None:
      self._writer.add_text(tag, value, step)

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None


def format_step_log(step: int, values: Mapping[str, float]) -> str:
  """'step 100 loss 2.3456 steps/s 12.3 tokens/s 1,234 ...' for the log."""
  parts = [f"step {step}"]
  for key, label, fmt in (("loss", "loss", "{:.4f}"), ("steps_per_sec", "steps/s", "{:.2f}"),
                          ("tokens_per_sec", "tokens/s", "{:,.0f}"),
                          ("grad_norm", "grad_norm", "{:.3f}"),
                          ("learning_rate", "lr", "{:.2e}"), ("mfu", "mfu", "{:.2%}")):
    if key in values:
      parts.append(f"{label} {fmt.format(float(values[key]))}")
  return " ".join(parts)


def log_step(step: int, values: Mapping[str, float]) -> None:
  logging.info(format_step_log(step, values))
