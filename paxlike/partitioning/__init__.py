"""Partitioners: how state and batches are laid out and steps compiled."""

from paxlike.partitioning.pmap import PmapPartitioner
from paxlike.partitioning.spmd import SpmdPartitioner

__all__ = ["PmapPartitioner", "SpmdPartitioner"]
