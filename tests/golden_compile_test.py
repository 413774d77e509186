"""Pod-scale experiments compile (dry run) within their recorded peak bytes per device.

The whole set takes about 12 minutes on a 2-core CPU, so each run checks one
experiment, a different one each day of the year (all of them every two
weeks); `python -m paxlike.golden --compile-all` checks them all at once.
Peaks are recorded per JAX release (XLA's buffer assignment moves between
releases); a JAX with no recorded peaks skips, naming the command that adds them.
"""

from __future__ import annotations

import datetime
import os

import pytest

from paxlike import golden


def test_todays_pod_scale_experiment_compiles_within_its_recorded_peak():
  keys = golden.recorded_pod_scale_keys()
  assert len(keys) >= 10, f"the records name only {keys} as pod-scale"
  field = golden.compiled_field()
  if not any(field in (golden.RECORD_DIR / f).read_text() for f in os.listdir(golden.RECORD_DIR)):
    pytest.skip(f"no {field} recorded (peaks move between JAX releases); "
                f"`{golden.COMPILE_COMMAND}` under this JAX records them")
  today = golden.rotating_subset(keys, datetime.date.today().timetuple().tm_yday)
  moved, missing = golden.check_compiled(today)
  if missing:
    pytest.fail(f"no compiled peak recorded for {', '.join(missing)}; run "
                f"`{golden.COMPILE_COMMAND}`.", pytrace=False)
  if moved:
    pytest.fail("\n" + golden.report(moved, [], []) + f"\n(or `{golden.COMPILE_COMMAND}`)",
                pytrace=False)
