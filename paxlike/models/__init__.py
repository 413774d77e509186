"""Models: flax modules with `fprop(batch) -> (loss, metrics)`."""

from paxlike.models.language_model import LanguageModel

__all__ = ["LanguageModel"]
