"""TensorBoard event files and the human-readable step log."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping

from paxlike import log as logging


def _import_tensorboardx() -> None:
  """Imports tensorboardX without the PyTorch it probes for.

  tensorboardX's package import tries `import torch` (for its own SummaryWriter's
  tensor type, which paxlike does not use): 3.5 s of every run's startup wherever
  torch is installed, as the [export] extra installs it. Hiding torch for that one
  import leaves it importable afterwards.
  """
  import sys
  if "tensorboardX" in sys.modules or "torch" in sys.modules:
    return
  sys.modules["torch"] = None  # `import torch` raises ImportError while this is set
  try:
    import tensorboardX  # noqa: F401
  finally:
    del sys.modules["torch"]


_WRITERS = itertools.count()  # this process's writers, numbered: a unique file name each


class SummaryWriter:
  """Scalars under job_log_dir/summaries/<name>/; a no-op when disabled.

  Only process 0 writes, so multi-host runs produce one set of event files.
  Events are written synchronously (tensorboardX's EventsWriter, not its
  SummaryWriter): that one's background thread outlives a close that failed (a
  full disk) and dies at exit with a traceback over the run's one-line error.
  """

  def __init__(self, job_log_dir: str, name: str, enabled: bool = True) -> None:
    self.path = os.path.join(job_log_dir, "summaries", name)
    self._writer = None
    if enabled:
      _import_tensorboardx()
      from tensorboardX.event_file_writer import EventsWriter  # deferred: slow import
      os.makedirs(self.path, exist_ok=True)
      # The file name's time is in whole seconds: two writers of one folder within a second
      # (evals at close intervals) would write the same file, the later over the earlier.
      self._writer = EventsWriter(os.path.join(self.path, "events"),
                                  filename_suffix=f".{os.getpid()}.{next(_WRITERS):06d}")

  def _write(self, step: int, summaries: list) -> None:
    from tensorboardX.proto import event_pb2
    for summary in summaries:
      self._writer.write_event(event_pb2.Event(wall_time=time.time(), step=int(step),
                                               summary=summary))
    self._writer.flush()  # one small write per log step: TensorBoard sees it at once

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    if self._writer is not None:
      from tensorboardX.summary import scalar
      self._write(step, [scalar(k, float(v)) for k, v in values.items()])

  def text(self, step: int, tag: str, value: str) -> None:
    if self._writer is not None:
      from tensorboardX.summary import text
      self._write(step, [text(tag, value)])

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    writer, self._writer = self._writer, None
    if writer is not None:
      writer.close()


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
