"""Step-time and MFU benchmarks: paxlike measured against plain-JAX references."""
