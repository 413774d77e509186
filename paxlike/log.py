"""paxlike's own logger: readable lines on stderr, apart from libraries' chatter.

Libraries that log through absl (orbax is verbose at INFO) are held at
WARNING unless the user passes --verbosity/-v; paxlike's lines always show,
prefixed with the process index in multi-process runs.
"""

from __future__ import annotations

import logging
import sys

_LOGGER = logging.getLogger("paxlike")


def setup(process_index: int = 0, process_count: int = 1, quiet_libraries: bool = True) -> None:
  """Installs the stderr handler once; call again to update the process prefix."""
  who = f"[process {process_index}/{process_count}] " if process_count > 1 else ""
  fmt = logging.Formatter(f"%(asctime)s paxlike {who}%(message)s", datefmt="%H:%M:%S")
  if not _LOGGER.handlers:
    handler = logging.StreamHandler(sys.stderr)
    _LOGGER.addHandler(handler)
  for h in _LOGGER.handlers:
    h.setFormatter(fmt)
  _LOGGER.setLevel(logging.INFO)
  _LOGGER.propagate = False
  if quiet_libraries:
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)


def info(msg: str, *args: object) -> None:
  _LOGGER.info(msg, *args)


def warning(msg: str, *args: object) -> None:
  _LOGGER.warning(msg, *args)
