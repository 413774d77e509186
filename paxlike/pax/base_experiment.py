"""paxml.base_experiment: the experiment base class."""

from paxlike.experiment import BaseExperiment

__all__ = ["BaseExperiment"]
