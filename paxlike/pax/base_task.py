"""paxml.base_task: BaseTask, the class a Pax experiment's task() is annotated with."""

from paxlike.task import Task as BaseTask

__all__ = ["BaseTask"]
