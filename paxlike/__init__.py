"""paxlike: Pax-style experiments on current JAX."""

from paxlike import registry as experiment_registry
from paxlike.errors import UserError

__all__ = ["experiment_registry", "UserError"]
__version__ = "0.1.0"
