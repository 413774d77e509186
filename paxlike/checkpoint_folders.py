"""Where a job keeps its checkpoints: job_log_dir/checkpoints/checkpoint_<step>, Pax's layout.

Light on purpose: main reads a job's steps before any backend starts, so this module
imports neither JAX nor orbax (paxlike.checkpoints writes and reads the checkpoints).
"""

from __future__ import annotations

import os
import re

STEP_PREFIX = "checkpoint"
STEP_DIGITS = 8


def checkpoint_dir(job_log_dir: str) -> str:
  return os.path.join(job_log_dir, "checkpoints")


def step_folders(job_log_dir: str) -> dict[int, str]:
  """{step: folder} of job_log_dir's checkpoint_<step> folders, by name alone (a folder
  orbax has not finished has a temporary name and is not one)."""
  folder = checkpoint_dir(job_log_dir)
  names = os.listdir(folder) if os.path.isdir(folder) else []
  return {int(m.group(1)): os.path.join(folder, n) for n in names
          if (m := re.fullmatch(rf"{STEP_PREFIX}_(\d+)", n))}
