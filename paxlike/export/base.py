"""What every export format shares: the Exporter contract, where exports go, how they land.

An export is written into a sibling `<dir>.partial-<pid>` folder and renamed
into place only once complete, so a failed or interrupted export leaves no
half-written directory behind, and `--export_overwrite` swaps an old export
for a new one without a moment where neither is whole.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any, Protocol

from paxlike.errors import UserError

# A directory holding one of these is a previous export (`--export_overwrite` may replace
# it); any other non-empty directory is the user's and is never touched.
EXPORT_MARKERS = ("manifest.json", "config.json", "saved_model.pb")


class Exporter(Protocol):
  """One --export_format.

  check() runs before the job writes anything and refuses (UserError) what
  this format cannot write; what it returns (a plan: for StableHLO, the
  lowered program) is handed back to write() with the restored parameters.
  """

  name: str

  def check(self, job: Any) -> Any: ...

  def write(self, plan: Any, params: Any, step: int, out_dir: str) -> None: ...


def out_dir(job_log_dir: str, step: int, fmt: str, export_dir: str | None) -> str:
  """--export_dir, or job_log_dir/export/<step>/<format>."""
  if export_dir:
    return os.path.abspath(os.path.expanduser(export_dir))
  return os.path.join(job_log_dir, "export", f"{step:08d}", fmt)


def is_export(path: str) -> bool:
  return os.path.isdir(path) and any(
      os.path.exists(os.path.join(path, m)) for m in EXPORT_MARKERS)


def check_free(path: str, overwrite: bool = False) -> None:
  """Raises UserError unless path is free (absent or an empty directory).

  With overwrite, a directory holding a previous export counts as free too;
  a file, or a directory that is not an export, never does.
  """
  if not os.path.lexists(path) or (os.path.isdir(path) and not os.listdir(path)):
    return
  if overwrite and is_export(path):
    return
  if overwrite:
    raise UserError(f"the export directory {path} exists and holds no export (no "
                    f"{' / '.join(EXPORT_MARKERS)}); --export_overwrite only replaces an "
                    "earlier export: remove it yourself or pass another --export_dir.")
  raise UserError(f"the export directory {path} already exists and is not empty; exports "
                  "are never overwritten unless you pass --export_overwrite: remove it, "
                  "pass another --export_dir, or add --export_overwrite.")


def _missing_dirs(path: str) -> list[str]:
  """path and its ancestors that do not exist yet, deepest first."""
  missing = []
  while path and not os.path.exists(path):
    missing.append(path)
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return missing


def publish(path: str, fill: Callable[[str], None], overwrite: bool = False) -> None:
  """Runs fill(tmp_dir) and moves tmp_dir to path; on any failure nothing is left.

  Args:
    path: the export directory (checked free with check_free beforehand).
    fill: writes the export into the empty directory it is given.
    overwrite: replace an earlier export at path.

  Raises:
    UserError: path was taken between check_free and now.
  """
  created = _missing_dirs(os.path.dirname(path))
  tmp = f"{path}.partial-{os.getpid()}"
  try:
    if os.path.lexists(tmp):
      shutil.rmtree(tmp)  # left by an earlier process with our pid, killed mid-export
    os.makedirs(tmp)
    fill(tmp)
    check_free(path, overwrite)
    if os.path.isdir(path) and not os.listdir(path):
      os.rmdir(path)
    if os.path.lexists(path):
      old = f"{path}.replaced-{os.getpid()}"
      os.rename(path, old)
      os.rename(tmp, path)
      shutil.rmtree(old, ignore_errors=True)
    else:
      os.rename(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    for d in created:  # the export/<step>/ parents this call made, deepest first
      try:
        os.rmdir(d)
      except OSError:
        break
    raise


def directory_size(path: str) -> int:
  """Bytes in the regular files under path."""
  total = 0
  for root, _, files in os.walk(path):
    total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
  return total
