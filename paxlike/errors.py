"""The one exception type that means "the user got something wrong", and where it was."""

from __future__ import annotations

import traceback
from types import TracebackType


class UserError(Exception):
  """A mistake in names, flags, shapes, paths or checkpoints.

  The message is one sentence that says what is wrong and how to fix it;
  main.py prints it as `error: <message>` and exits with status 2.
  """


def counted(n: int, one: str, many: str | None = None) -> str:
  """'1 microbatch', '4 microbatches': a count and its noun, for messages."""
  return f"{n} {one if n == 1 else (many or one + 's')}"


def user_frame(tb: TracebackType | None) -> str:
  """` (at FILE:LINE: SOURCE)` of the innermost frame outside paxlike, fiddle, Python's
  own modules and importlib, or ''; paxlike.pax counts as the user's (Pax's names)."""
  for frame in reversed(traceback.extract_tb(tb)):
    path = frame.filename.replace("\\", "/")
    if path.startswith("<") or ("/paxlike/" in path and "/paxlike/pax/" not in path):
      continue
    if "/fiddle/" in path or "/site-packages/" in path or "/lib/python" in path:
      continue
    src = f": {frame.line.strip()}" if frame.line else ""
    return f" (at {frame.filename}:{frame.lineno}{src})"
  return ""
