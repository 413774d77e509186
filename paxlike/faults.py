"""Fault injection for tests: kill or signal this process at a named point of a run.

PAXLIKE_TEST_FAULT="<action>:<point>:<step>" fires once, when the trainer
passes `point` at `step`:

  actions: kill (SIGKILL: no cleanup at all, as a crash or an OOM kill),
           term (SIGTERM), int (SIGINT), stop (SIGSTOP: the run pauses, alive, until
           the test sends SIGCONT)
  points:  step (right after step <step> is dispatched, while the device
           still runs it), save (right after the checkpoint of <step> has
           started, while orbax still writes it in the background), eval (between
           the eval of <step> and its decode, eval summaries written)

Unset (always, outside tests) this costs one dict lookup per call.
"""

from __future__ import annotations

import os
import signal

ENV = "PAXLIKE_TEST_FAULT"
ACTIONS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT,
           "stop": signal.SIGSTOP}


def hit(point: str, step: int) -> None:
  """Delivers the configured signal if (point, step) is the configured one."""
  spec = os.environ.get(ENV)
  if not spec:
    return
  action, _, rest = spec.partition(":")
  want_point, _, want_step = rest.partition(":")
  if want_point == point and want_step == str(step) and action in ACTIONS:
    os.kill(os.getpid(), ACTIONS[action])
