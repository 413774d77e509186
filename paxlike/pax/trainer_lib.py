"""paxml.trainer_lib: the names Pax experiment files take from it.

RunningMode is the second argument of a task's early_stopping_fn (c4.py's
EarlyStoppingFn annotates it); paxlike's trainer calls that hook after each
eval during training (paxlike.task.Task.early_stopping_fn).
"""

from paxlike.task import RunningMode

__all__ = ["RunningMode"]
