"""Device meshes from ICI/DCN shapes, and the logical-axis rules.

Mesh axes are Pax's ('replica', 'data', 'mdl'), and ('stage', 'replica',
'data', 'mdl') for a pipeline (NUM_STAGES). The batch is sharded over
replica x data; weights over data (their embed dim) and mdl (their heads /
hidden / vocab dims), a pipeline's layer weights over stage too.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh

from paxlike.errors import UserError

MESH_AXES = ("replica", "data", "mdl")
PIPELINE_MESH_AXES = ("stage", *MESH_AXES)
BATCH_AXES = ("replica", "data")

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


def logical_axis_rules(training_optimized: bool = False):
  """The rules for an experiment's TRAINING_OPTIMIZED_SHARDING."""
  return TRAINING_OPTIMIZED_RULES if training_optimized else LOGICAL_AXIS_RULES


def rules_for(exp: object):
  """The experiment's rules: TRAINING_OPTIMIZED_SHARDING's, with a pipelined
  experiment's EMB_W_DATA_DIMS on the tables' embed dim."""
  rules = logical_axis_rules(bool(getattr(exp, "TRAINING_OPTIMIZED_SHARDING", False)))
  emb = getattr(exp, "emb_w_data_dims", None)
  if emb is None:
    return rules
  return tuple((name, emb() if name == "table_embed" else axes) for name, axes in rules)


def axes_for(shape: Sequence[int]) -> tuple[str, ...]:
  """The mesh axis names of a 3-axis or (pipelined) 4-axis mesh shape."""
  return PIPELINE_MESH_AXES if len(shape) == len(PIPELINE_MESH_AXES) else MESH_AXES


def _product(shape: Sequence[int] | None) -> int:
  return int(np.prod(shape)) if shape else 1


def build(ici_mesh_shape: Sequence[int], dcn_mesh_shape: Sequence[int] | None = None,
          devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Builds the ('replica', 'data', 'mdl') mesh, or ('stage', ...) for four axes.

  Args:
    ici_mesh_shape: mesh within a slice / host group.
    dcn_mesh_shape: mesh across slices or processes; None or all ones for one.
    devices: defaults to jax.devices().

  Raises:
    UserError: the mesh size and the device or process count disagree.
  """
  devices = list(jax.devices() if devices is None else devices)
  ici = list(ici_mesh_shape)
  dcn = list(dcn_mesh_shape) if dcn_mesh_shape else [1] * len(ici)
  axes = axes_for(ici)
  if len(ici) != len(axes) or len(dcn) != len(axes):
    raise UserError(f"ICI_MESH_SHAPE and DCN_MESH_SHAPE need {len(axes)} entries "
                    f"{axes}, got {ici} and {dcn}.")
  want = _product(ici) * _product(dcn)
  if want != len(devices):
    raise UserError(
        f"the mesh ICI_MESH_SHAPE={ici} x DCN_MESH_SHAPE={dcn} needs {want} devices but "
        f"{len(devices)} are available; change the mesh shape or the device count.")
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
  """How many ways the batch is split: replica x data."""
  return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))
