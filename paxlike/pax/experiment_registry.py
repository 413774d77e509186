"""paxml.experiment_registry: `@experiment_registry.register` registers with paxlike."""

from paxlike.registry import get, list_names, register

__all__ = ["get", "list_names", "register"]
