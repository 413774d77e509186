"""paxml.tasks_lib: the task config a Pax experiment's task() returns and edits."""

from paxlike.pax._hparams import HParams
from paxlike.task import Task, TrainSettings


class SingleTask(Task):
  """paxlike's Task under Pax's name; `SingleTask.HParams(...)` configures it, and
  `pax_fiddle.Config(SingleTask.Train, ...)` its `train` (paxml's mnist.py)."""

  HParams = HParams()
  Train = TrainSettings

  @classmethod
  def sub_templates(cls) -> dict[str, type]:
    """pax_fiddle.Config(SingleTask) carries a config of its `train`, as paxml's does, so
    `task_p.train.learner = ...` edits it (paxml's imagenet_resnets.py)."""
    return {"train": TrainSettings}


__all__ = ["SingleTask", "TrainSettings"]
