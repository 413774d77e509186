"""Device meshes from ICI/DCN shapes, and the logical-axis rules.

Mesh axes are Pax's ('replica', 'data', 'mdl'); ('stage', 'replica', 'data',
'mdl') for a pipeline (NUM_STAGES); ('replica', 'data', 'data_expert', 'mdl')
for expert parallelism (Pax's USE_EXPERT_PARALLEL), with 'stage' in front for
both. The batch is sharded over
replica x data (x data_expert); weights over data (x data_expert: their embed
dim) and mdl (their heads / hidden / vocab dims), a pipeline's layer weights
over stage too. On the expert-parallel mesh a mixture-of-experts layer's
experts go over data_expert and their embed dim over data, as praxis's
set_sharding_params_with_expert_parallelism places them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from paxlike.errors import UserError, counted

if TYPE_CHECKING:  # jax is imported where a mesh is built: experiments read the names only
  import jax
  from jax.sharding import Mesh

MESH_AXES = ("replica", "data", "mdl")
PIPELINE_MESH_AXES = ("stage", *MESH_AXES)
EXPERT_MESH_AXES = ("replica", "data", "data_expert", "mdl")
PIPELINE_EXPERT_MESH_AXES = ("stage", *EXPERT_MESH_AXES)
BATCH_AXES = ("replica", "data")
EXPERT_BATCH_AXES = ("replica", "data", "data_expert")

# Logical axis name -> mesh axis (or axes, or None for replicated).
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", BATCH_AXES),
    ("length", None),
    ("embed", "data"),
    ("mlp", "mdl"),
    ("heads", "mdl"),
    ("kv", None),
    ("qkv", None),
    ("vocab", "mdl"),
    ("table_embed", "data"),  # the embedding/softmax table's embed dim (EMB_W_DATA_DIMS)
    ("layers", None),
    ("stage", "stage"),
    ("circular_repeat", None),
    # A pipelined model's embedding and softmax: data-parallel over every core.
    ("pipeline_batch", ("stage", *BATCH_AXES)),
    ("relpos_buckets", None),
    # Mixture-of-experts weights: experts over 'data' (as Pax's set_sharding_params_v1),
    # so their embed dim stays whole; the hidden dim goes over 'mdl' ("mlp").
    ("expert", "data"),
    ("expert_embed", None),
    # The groups' dim of the experts' dispatched inputs [experts, groups, capacity, embed].
    ("expert_group", None),
    ("activation_embed", None),
    ("activation_mlp", "mdl"),
    ("activation_heads", "mdl"),
    ("activation_vocab", "mdl"),
)
# Pax's TRAINING_OPTIMIZED_SHARDING: the residual stream's embed dim also goes
# over 'mdl', so the activations a layer saves for its backward pass are split
# mdl ways instead of replicated (what makes 100B+ models fit).
TRAINING_OPTIMIZED_RULES = tuple(
    (name, "mdl" if name == "activation_embed" else axes) for name, axes in LOGICAL_AXIS_RULES)


# The expert-parallel mesh's changes (praxis's set_sharding_params_with_expert_parallelism):
# the batch and the weights' embed dims over data x data_expert; the experts over data_expert,
# their embed dim over data, and their dispatched inputs' groups over replica x data; a
# pipeline's embedding and softmax over every core.
_EXPERT_PARALLEL = {
    "batch": EXPERT_BATCH_AXES,
    "pipeline_batch": ("stage", *EXPERT_BATCH_AXES),
    "embed": ("data", "data_expert"),
    "table_embed": ("data", "data_expert"),
    "expert": "data_expert",
    "expert_embed": "data",
    "expert_group": BATCH_AXES,
}


def logical_axis_rules(training_optimized: bool = False,
                       axes: Sequence[str] = MESH_AXES) -> tuple[tuple[str, object], ...]:
  """The rules for an experiment's TRAINING_OPTIMIZED_SHARDING on a mesh of these axis
  names (the expert-parallel ones where it has 'data_expert')."""
  rules = TRAINING_OPTIMIZED_RULES if training_optimized else LOGICAL_AXIS_RULES
  if "data_expert" in axes:
    rules = tuple((name, _EXPERT_PARALLEL.get(name, mesh_axes)) for name, mesh_axes in rules)
  return rules


# A logical axis name that names mesh axes itself: "mesh:data", "mesh:data+mdl" (a Pax user's
# layer's praxis split mapping, paxlike.pax.base_layer). The partitioner resolves them by
# direct_rules, after the experiment's own rules.
DIRECT = "mesh:"


def direct_rules(axes: Sequence[str]) -> tuple[tuple[str, object], ...]:
  """The rules of the DIRECT names over these mesh axes: every set of them, in mesh order."""
  import itertools

  return tuple((DIRECT + "+".join(combo), combo if len(combo) > 1 else combo[0])
               for n in range(1, len(axes) + 1) for combo in itertools.combinations(axes, n))


def direct_name(axes: Sequence[str], mesh_axes: Sequence[str]) -> str:
  """The DIRECT logical name of a split over these mesh axes (put in mesh order)."""
  unknown = [a for a in axes if a not in mesh_axes]
  if unknown:
    raise UserError(f"split dims mapping names mesh axis {unknown[0]!r}; the mesh's axes are "
                    f"{', '.join(mesh_axes)}.")
  return DIRECT + "+".join(a for a in mesh_axes if a in axes)


def axis_names(exp: object) -> tuple[str, ...]:
  """The experiment's mesh axis names (its mesh_axis_names(); the 3-axis ones without it)."""
  names = getattr(exp, "mesh_axis_names", None)
  return tuple(names()) if callable(names) else MESH_AXES


def rules_for(exp: object):
  """The experiment's rules: TRAINING_OPTIMIZED_SHARDING's on its mesh, as the experiment's
  `axis_rules` changes them (a pipeline's EMB_W_DATA_DIMS, the MLP classifier's weights)."""
  rules = logical_axis_rules(bool(getattr(exp, "TRAINING_OPTIMIZED_SHARDING", False)),
                             axis_names(exp))
  own = getattr(exp, "axis_rules", None)
  return tuple(own(rules)) if callable(own) else rules


def axes_for(shape: Sequence[int], pipelined: bool = True) -> tuple[str, ...]:
  """The mesh axis names of a mesh shape: 3 axes, Pax's plain mesh; 4, a pipeline's, or the
  expert-parallel mesh's (pipelined=False); 5, a pipeline's with expert parallelism."""
  if len(shape) == len(PIPELINE_EXPERT_MESH_AXES):
    return PIPELINE_EXPERT_MESH_AXES
  if len(shape) == len(PIPELINE_MESH_AXES):
    return PIPELINE_MESH_AXES if pipelined else EXPERT_MESH_AXES
  return MESH_AXES


def batch_axes(axes: Sequence[str]) -> tuple[str, ...]:
  """The mesh axes the batch is split over: replica x data (x data_expert)."""
  return EXPERT_BATCH_AXES if "data_expert" in axes else BATCH_AXES


def _product(shape: Sequence[int] | None) -> int:
  return int(np.prod(shape)) if shape else 1


def build(ici_mesh_shape: Sequence[int], dcn_mesh_shape: Sequence[int] | None = None,
          devices: Sequence[jax.Device] | None = None,
          names: Sequence[str] | None = None, ici_name: str = "ICI_MESH_SHAPE") -> Mesh:
  """Builds the ('replica', 'data', 'mdl') mesh, or ('stage', ...) for four axes.

  Args:
    ici_mesh_shape: mesh within a slice / host group.
    dcn_mesh_shape: mesh across slices or processes; None or all ones for one.
    devices: defaults to jax.devices().
    names: the axis names (the experiment's mesh_axis_names()); None: axes_for's.
    ici_name: the experiment's name for the ICI shape, for the errors (Pax's MESH_SHAPE
      on its MLP and BERT templates).

  Raises:
    UserError: the mesh size and the device or process count disagree.
  """
  import jax
  from jax.experimental import mesh_utils
  from jax.sharding import Mesh

  devices = list(jax.devices() if devices is None else devices)
  ici = list(ici_mesh_shape)
  dcn = list(dcn_mesh_shape) if dcn_mesh_shape else [1] * len(ici)
  axes = tuple(names) if names is not None else axes_for(ici)
  if len(ici) != len(axes) or len(dcn) != len(axes):
    raise UserError(f"{ici_name} and DCN_MESH_SHAPE need {len(axes)} entries "
                    f"{axes}, got {ici} and {dcn}.")
  want = _product(ici) * _product(dcn)
  if want != len(devices):
    raise UserError(
        f"the mesh {ici_name}={ici} x DCN_MESH_SHAPE={dcn} needs {counted(want, 'device')} "
        f"but {len(devices)} {'is' if len(devices) == 1 else 'are'} available; change the mesh "
        "shape or the device count.")
  if _product(dcn) > 1:
    num_processes = len({d.process_index for d in devices})
    num_slices = len({getattr(d, "slice_index", 0) for d in devices})
    granules = num_slices if num_slices > 1 else num_processes
    if _product(dcn) != granules:
      raise UserError(
          f"DCN_MESH_SHAPE={dcn} spans {_product(dcn)} slices/processes but the job has "
          f"{granules}; make its product equal the number of processes.")
    device_array = mesh_utils.create_hybrid_device_mesh(
        ici, dcn, devices, process_is_granule=num_slices <= 1,
        allow_split_physical_axes=True)
  else:
    try:
      device_array = mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=True)
    except (ValueError, NotImplementedError, AssertionError):
      # Shapes the physical topology cannot tile: fall back to device order.
      device_array = np.asarray(devices).reshape(ici)
  return Mesh(device_array, axes)


def batch_divisor(mesh: Mesh) -> int:
  """How many ways the batch is split: replica x data (x data_expert)."""
  return int(np.prod([mesh.shape[a] for a in batch_axes(mesh.axis_names)]))
