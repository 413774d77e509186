"""praxis.pytypes: the type names Pax files annotate with."""

from typing import Any

import jax

from paxlike.pax.py_utils import NestedMap

JTensor = jax.Array
PRNGKey = jax.Array
NestedJTensor = Any
NestedMap = NestedMap
WeightedScalars = dict
WeightedScalarsList = dict
Metrics = dict
Nested = Any
SplitDimsMapping = Any
HParams = Any
NestedShapeDtypeStruct = Any

__all__ = ["HParams", "JTensor", "Metrics", "Nested", "NestedJTensor", "NestedMap",
           "NestedShapeDtypeStruct", "PRNGKey",
           "SplitDimsMapping", "WeightedScalars", "WeightedScalarsList"]
