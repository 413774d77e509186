"""Models: flax modules with `fprop(batch) -> (loss, metrics)`."""

from paxlike.models.language_model import LanguageModel
from paxlike.models.t5 import T5Model

__all__ = ["LanguageModel", "T5Model"]
