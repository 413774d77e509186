"""Device memory: a step that cannot fit is one sentence, before step 1 or when it happens.

`--device_memory_gib` states what a device may use. The train step is then
compiled ahead of its first call and its memory analysis (arguments, outputs
not aliased to donated inputs, temporaries, code: what the dry run reports
as the peak) is compared with that budget; a step that needs more is
refused before it runs, with the knobs that shrink it. Without a budget no
step is compiled twice; an out-of-memory error while a step runs becomes
the same kind of sentence, naming the checkpoint that stays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from paxlike.errors import UserError

GIB = 1 << 30
# What shrinks a step's memory, in the order to try.
REMEDIES = ("CHECKPOINT_POLICY='SAVE_NOTHING' (recompute activations in the backward pass)",
            "NUM_MICROBATCHES=2, 4, ... (the batch in slices, one update)",
            "a smaller PERCORE_BATCH_SIZE or MAX_SEQ_LEN", "more devices on 'data' or 'mdl'")
_OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")


def step_memory(compiled: Any) -> dict[str, int]:
  """A compiled step's memory analysis per device, bytes, with the peak it implies.

  Live at the peak: inputs, outputs not aliased to a donated input, scratch, code.
  """
  mem = compiled.memory_analysis()
  size = {k: int(getattr(mem, f"{k}_size_in_bytes", 0) or 0)
          for k in ("argument", "output", "alias", "temp", "generated_code")}
  size["peak"] = (size["argument"] + size["output"] - size["alias"] + size["temp"]
                  + size["generated_code"])
  return size


def step_peak_bytes(compiled: Any) -> int:
  """Bytes a compiled step holds at its peak on one device (the dry run's peak)."""
  return step_memory(compiled)["peak"]


def _advice(last_saved: int | None, in_place: tuple[str, ...] = ()) -> str:
  """What to try, less the remedies already in place (a name in `in_place`, e.g. the
  policy 'SAVE_NOTHING', found in the remedy's text)."""
  kept = (f"; the checkpoint of step {last_saved} is kept" if last_saved else "")
  remedies = [r for r in REMEDIES if not any(f"'{p}'" in r for p in in_place)]
  return f"try {'; or '.join(remedies)}{kept}."


def preflight(step_fn: Any, args: tuple[Any, ...], budget_bytes: int,
              last_saved: int | None = None, in_place: tuple[str, ...] = ()) -> int:
  """Compiles step_fn for args and refuses it when its peak exceeds budget_bytes.

  Returns:
    The step's peak bytes per device.

  Raises:
    UserError: one sentence with both numbers and what to try.
  """
  lower = getattr(step_fn, "lower", None)
  if lower is None:  # a step wrapped by a tool that does not lower (PGLE's collector)
    raise UserError("--device_memory_gib cannot check this step (it runs under --pgle's "
                    "collector); drop one of the two.")
  need = step_peak_bytes(lower(*args).compile())
  if need > budget_bytes:
    raise UserError(f"the train step needs {need / GIB:.2f} GiB per device, more than the "
                    f"{budget_bytes / GIB:.2f} GiB --device_memory_gib allows; "
                    + _advice(last_saved, in_place))
  return need


@contextlib.contextmanager
def out_of_memory_is_one_line(last_saved: Callable[[], int | None]) -> Iterator[None]:
  """Turns a device out-of-memory error raised inside into a UserError."""
  try:
    yield
  except UserError:
    raise
  except Exception as e:  # XLA raises its runtime errors under several types
    text = str(e)
    if not any(m in text for m in _OOM_MARKERS):
      raise
    first = text.strip().splitlines()[0][:200]
    raise UserError(f"a train step ran out of device memory ({first}); "
                    + _advice(last_saved())) from None
