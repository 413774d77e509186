"""Files in job_log_dir that readers (a rerun, an evaler beside the trainer) must never see
half-written."""

from __future__ import annotations

import os
import socket


def write_atomic(path: str, data: str | bytes) -> None:
  """Writes path so that a reader, or a run killed mid-write, sees the old file or the whole
  new one: the data goes to a temporary file beside it, which then replaces it."""
  tmp = f"{path}.tmp-{socket.gethostname()}-{os.getpid()}"  # hosts' pids may be the same
  with open(tmp, "wb" if isinstance(data, bytes) else "w",
            **({} if isinstance(data, bytes) else {"encoding": "utf-8"})) as f:
    f.write(data)
  os.replace(tmp, path)
