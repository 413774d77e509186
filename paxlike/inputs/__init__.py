"""Input pipelines: the BaseInput contract and shipped inputs."""

from paxlike.inputs.base_input import BaseInput
from paxlike.inputs.synthetic import SyntheticLmInput

__all__ = ["BaseInput", "SyntheticLmInput"]
