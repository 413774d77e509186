"""praxis.pax_fiddle: fiddle's Config, Partial and build under Pax's names."""

from fiddle import Config, Partial, build, get_callable

instantiate = build

__all__ = ["Config", "Partial", "build", "get_callable", "instantiate"]
