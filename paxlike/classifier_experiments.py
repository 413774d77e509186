"""Pax's MLP classifier template (model_params.ClassificationModelAdam), with Pax's values.

lm_cloud.py's SmallMlp and LargeMlp subclass it beside their data mixin.
The hyperparameters keep Pax's names: NUM_LAYER, INPUT_DIM, HIDDEN_DIM,
OUTPUT_DIM; MESH_SHAPE is the [replica, data, mdl] mesh (Pax's
set_sharding_annotations_v1 names its axes so; None: the pmap loop), and
MLP_WEIGHT_SHARDING / SOFTMAX_WEIGHT_SHARDING split the layers' and the
softmax's weights [in, out] over it, one entry a dim (None or -1: not
split; a mesh axis name, or a list of them). The batch goes over replica x
data. Training is set_default_adam's (paxlike.pax.tasks.lm.model_params).
What a step computes is paxlike.models.classifier's: the accuracy, which
has no gradient.
"""

from __future__ import annotations

import math
from typing import Any

import fiddle as fdl

from paxlike import mesh as mesh_lib
from paxlike.errors import UserError
from paxlike.experiment import pax_alias
from paxlike.models.classifier import MLP_AXES, SOFTMAX_AXES, ClassificationMLP
from paxlike.training_experiment import AdamTraining, PaxLearner


class ClassificationModelAdam(PaxLearner, AdamTraining):
  """Pax's model_params.ClassificationModelAdam: an MLP classifier trained with Adam."""

  NUM_LAYER = 8
  INPUT_DIM = 4096
  HIDDEN_DIM = 7168
  OUTPUT_DIM = 4096
  LEARNING_RATE = 1e-3
  WEIGHT_DECAY = 1e-3
  CHECKPOINT_EVERY_N_STEPS = 5
  SUMMARY_INTERVAL_STEPS = 5
  NUM_TRAIN_STEPS = 10
  MLP_WEIGHT_SHARDING: list[Any] | None = None
  SOFTMAX_WEIGHT_SHARDING: list[Any] | None = None
  MESH_SHAPE: list[int] | None = None  # sub-classes give a mesh to run SPMD
  TRAINING_OPTIMIZED_SHARDING = True  # Pax's value; nothing of this model reads it
  # set_default_adam's: AdamTraining's Adam and ramp-up numbers, with these two.
  CLIP_GRADIENT_NORM_TO_VALUE = 5.0
  LR_SCHEDULE = "linear_rampup_exponential_decay"
  EVAL_INTERVAL_STEPS = 100  # Pax's task default

  ICI_MESH_SHAPE = pax_alias("ICI_MESH_SHAPE", "MESH_SHAPE")
  VOCAB_SIZE = pax_alias("VOCAB_SIZE", "INPUT_DIM")  # the classes: the table's INPUT_DIM rows

  def validate(self) -> None:
    shape = self.MESH_SHAPE
    if shape is not None and (not isinstance(shape, list | tuple) or len(shape) != 3 or not all(
        isinstance(d, int) and d > 0 for d in shape)):
      raise UserError(f"MESH_SHAPE must be a list of three positive ints [replica, data, mdl] "
                      f"(or None for the pmap loop), got {shape!r}.")
    super().validate()
    self.check_positive(*(n for n in (
        "NUM_LAYER", "INPUT_DIM", "HIDDEN_DIM", "OUTPUT_DIM", "MAX_SEQ_LEN",
        "PERCORE_BATCH_SIZE", "NUM_TRAIN_STEPS", "CHECKPOINT_EVERY_N_STEPS")
        if hasattr(self, n)))
    if self.OUTPUT_DIM != self.INPUT_DIM:
      raise UserError(f"OUTPUT_DIM={self.OUTPUT_DIM} must equal INPUT_DIM={self.INPUT_DIM}: the "
                      "MLP's output is classified by the table its input is looked up in "
                      "(praxis's SharedEmbeddingSoftmax of INPUT_DIM classes).")
    self.weight_axis_rules()

  def model(self) -> fdl.Config[ClassificationMLP]:
    self.weight_axis_rules()  # the split-dims mappings are read (and checked) with the model
    self.not_used("USE_CUDNN_FLASH_ATTENTION", "USE_FLASH_ATTENTION",
                  reason="the MLP classifier has no attention")
    self.not_used("TRAINING_OPTIMIZED_SHARDING", reason="the MLP classifier's activations "
                  "follow its weights, which MLP_WEIGHT_SHARDING and SOFTMAX_WEIGHT_SHARDING "
                  "place")
    return fdl.Config(ClassificationMLP, num_layers=self.NUM_LAYER, input_dims=self.INPUT_DIM,
                      hidden_dims=self.HIDDEN_DIM, output_dims=self.OUTPUT_DIM,
                      num_classes=self.INPUT_DIM)

  def axis_rules(self, rules: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    """weight_axis_rules() before the mesh's rules."""
    return self.weight_axis_rules() + tuple(super().axis_rules(rules))

  def weight_axis_rules(self) -> tuple[tuple[str, Any], ...]:
    """The weights' logical dims -> the mesh axes MLP_WEIGHT_SHARDING and
    SOFTMAX_WEIGHT_SHARDING name.

    Raises:
      UserError: a mapping that is not one entry of mesh axes per weight dim, that splits
        a dim the mesh does not divide, or that splits anything without a mesh.
    """
    sizes = dict(zip(mesh_lib.MESH_AXES, self.MESH_SHAPE or (1, 1, 1), strict=True))
    layer_dims = (("INPUT_DIM", "HIDDEN_DIM"), ("HIDDEN_DIM", "OUTPUT_DIM"))
    rules = []
    for name, axes, dims in (("MLP_WEIGHT_SHARDING", MLP_AXES, layer_dims),
                             ("SOFTMAX_WEIGHT_SHARDING", SOFTMAX_AXES,
                              (("INPUT_DIM",), ("INPUT_DIM",)))):
      split = self._mesh_axes(name, len(axes))
      if self.MESH_SHAPE is None and any(split):
        raise UserError(f"{name}={getattr(self, name)!r} splits weights over a mesh, but "
                        "MESH_SHAPE is None (the pmap loop, every weight whole on every "
                        "device); set MESH_SHAPE or drop it.")
      for mesh_axes, dim_names in zip(split, dims, strict=True):
        ways = math.prod(sizes[a] for a in (
            (mesh_axes,) if isinstance(mesh_axes, str) else mesh_axes or ()))
        for dim in dim_names:
          if getattr(self, dim) % ways:
            raise UserError(f"{name}={getattr(self, name)!r} splits {dim}="
                            f"{getattr(self, dim)} {ways} ways over {mesh_axes!r} "
                            f"(MESH_SHAPE={self.MESH_SHAPE}), which does not divide it.")
      rules += zip(axes, split, strict=True)
    return tuple(rules)

  def _mesh_axes(self, name: str, dims: int) -> list[Any]:
    """The mesh axes (None, a name or a tuple of names) of each weight dim, from Pax's
    split-dims mapping `name` (None: nothing split)."""
    mapping = getattr(self, name)
    if mapping is None:
      return [None] * dims
    names = mesh_lib.MESH_AXES
    if not isinstance(mapping, list | tuple) or len(mapping) != dims:
      raise UserError(f"{name} must be a list of {dims} entries, one a weight dim, got "
                      f"{mapping!r}.")
    out = []
    for entry in mapping:
      axes = entry if isinstance(entry, list | tuple) else (entry,)
      if entry is None or entry == -1:
        out.append(None)
      elif all(isinstance(a, str) and a in names for a in axes):
        out.append(tuple(axes) if len(axes) > 1 else axes[0])
      else:
        raise UserError(f"{name}={mapping!r}: each entry is None or -1 (not split), or "
                        f"mesh axes among {list(names)}; {entry!r} is neither.")
    return out
