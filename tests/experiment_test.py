"""Experiments: --set overrides, their type checks, and the hyperparameter dump."""

from __future__ import annotations

import fiddle as fdl
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY, TINY_KEY, parse_cls_vars

from paxlike import experiment, registry
from paxlike.errors import UserError

TINY_CLASS_SOURCE = TINY_KEY


def _tiny(*overrides: str):
  return experiment.instantiate(registry.get(TINY), list(overrides))


def _model(exp):
  return fdl.build(exp.task()).model


def test_model_dims_override_reaches_derived_values():
  base = _model(_tiny())
  assert (base.model_dims, base.hidden_dims, base.dim_per_head) == (64, 256, 16)

  model = _model(_tiny("MODEL_DIMS=128"))
  assert model.model_dims == 128
  assert model.hidden_dims == 512  # 4 x MODEL_DIMS
  assert model.dim_per_head == 32  # MODEL_DIMS // NUM_HEADS


def test_override_does_not_leak_into_the_class_or_other_instances():
  cls = registry.get(TINY)
  exp = _tiny("MODEL_DIMS=128", "NUM_LAYERS=3")
  assert exp.MODEL_DIMS == 128 and exp.overrides == {"MODEL_DIMS": 128, "NUM_LAYERS": 3}
  assert cls.MODEL_DIMS == 64
  assert _tiny().MODEL_DIMS == 64


def test_overrides_reach_the_input_and_the_train_settings():
  exp = _tiny("MAX_SEQ_LEN=16", "VOCAB_SIZE=100", "NUM_TRAIN_STEPS=7")
  (ds,) = [fdl.build(c) for c in exp.datasets()]
  assert ds.get_next()["ids"].shape[1] == 16
  assert ds.vocab_size == 100
  task = fdl.build(exp.task())
  assert task.train.num_train_steps == 7
  assert task.model.vocab_size == 100


def test_unknown_key_suggests_the_right_one():
  with pytest.raises(UserError) as e:
    _tiny("MODEL_DIM=128")
  msg = str(e.value)
  assert "MODEL_DIM" in msg and "Did you mean" in msg
  assert "MODEL_DIMS" in msg.split("Did you mean", 1)[1]
  with pytest.raises(UserError, match=r"Did you mean NUM_TRAIN_STEPS\?$"):  # its case
    _tiny("num_train_steps=2")
  with pytest.raises(UserError, match=r"^--set '=5' names no hyperparameter"):
    _tiny("=5")


@pytest.mark.parametrize("value", ["abc", "2.5", "'2'", "[2]"])
def test_wrong_type_for_an_int_fails(value):
  with pytest.raises(UserError, match=r"NUM_LAYERS.*int"):
    _tiny(f"NUM_LAYERS={value}")


@pytest.mark.parametrize("value", ["1", "0", "'True'"])
def test_bool_rejects_non_bools(value):
  with pytest.raises(UserError, match="USE_REPEATED_LAYER"):
    _tiny(f"USE_REPEATED_LAYER={value}")


def test_bool_accepts_bools():
  assert _tiny("USE_REPEATED_LAYER=False").USE_REPEATED_LAYER is False
  assert _model(_tiny("USE_REPEATED_LAYER=False")).use_repeated_layer is False


def test_float_accepts_an_int_and_lists_accept_tuples():
  exp = _tiny("LEARNING_RATE=1", "ICI_MESH_SHAPE=(1, 1, 1)")
  assert exp.LEARNING_RATE == 1.0 and isinstance(exp.LEARNING_RATE, float)
  assert exp.ICI_MESH_SHAPE == [1, 1, 1] and isinstance(exp.ICI_MESH_SHAPE, list)


def test_string_attribute_accepts_a_bare_word():
  exp = _tiny("LR_SCHEDULE=constant")
  assert exp.LR_SCHEDULE == "constant"
  # The Pax template's optimizer config takes a constant schedule.
  assert type(fdl.build(exp.task()).learner.optimizer.lr_schedule).__name__ == "Constant"


def test_fprop_dtype_override_to_bfloat16():
  exp = _tiny("FPROP_DTYPE=bfloat16")
  assert np.dtype(exp.FPROP_DTYPE) == np.dtype(jnp.bfloat16)
  assert np.dtype(_model(exp).fprop_dtype) == np.dtype(jnp.bfloat16)
  assert "FPROP_DTYPE : bfloat16" in experiment.format_hparams(exp)


def test_fprop_dtype_rejects_a_non_dtype():
  with pytest.raises(UserError, match="FPROP_DTYPE.*not a dtype"):
    _tiny("FPROP_DTYPE=float33")


def test_set_without_equals_sign_fails():
  with pytest.raises(UserError, match="KEY=VALUE"):
    _tiny("NUM_LAYERS")


def test_inconsistent_values_fail_validation():
  with pytest.raises(UserError, match="NUM_HEADS"):
    _tiny("MODEL_DIMS=30")  # 30 does not split into 4 heads
  with pytest.raises(UserError, match="ICI_MESH_SHAPE"):
    _tiny("ICI_MESH_SHAPE=[1, 2]")
  with pytest.raises(UserError, match="NUM_LAYERS must be a positive number, got 0"):
    _tiny("NUM_LAYERS=0")


def test_cls_vars_dump_shows_where_each_value_comes_from():
  exp = _tiny("MODEL_DIMS=128", "NUM_TRAIN_STEPS=40")
  text = experiment.format_hparams(exp)
  assert text.startswith(f"# experiment: {TINY_KEY}\n")
  sections = parse_cls_vars(text)

  assert sections["--set"] == {"MODEL_DIMS": "128", "NUM_TRAIN_STEPS": "40"}
  tiny = sections[TINY_CLASS_SOURCE]
  assert tiny["NUM_LAYERS"] == "2"
  # The dims it shares with the family's other CPU-sized members come from their mixin.
  assert sections["experiments.lm.lm_cloud.CpuSized"]["FPROP_DTYPE"] == "float32"
  assert "MODEL_DIMS" not in tiny and "NUM_TRAIN_STEPS" not in tiny
  # Inherited values are attributed to the class that defines them.
  assert sections["paxlike.training_experiment.AdamTraining"]["OPTIMIZER"] == "'adam'"
  assert sections["experiments.lm.lm_cloud.LmCloudSpmd"]["CHECKPOINT_POLICY"] == "'SAVE_NOTHING'"
  # Each hyperparameter is listed exactly once, and methods are not hyperparameters.
  names = [n for s in sections.values() for n in s]
  assert len(names) == len(set(names))
  assert "MODEL_DIMS" in names and "task" not in names
  # The --set section comes last, after every class section.
  assert list(sections)[-1] == "--set"


def test_init_from_knobs_without_init_from_are_refused_when_set():
  exp = _tiny("INIT_FROM_OPTIMIZER=True")
  with pytest.raises(UserError, match=r"^--set INIT_FROM_OPTIMIZER=True: nothing reads it; "
                                      r"INIT_FROM is None \(and no --init_from\)"):
    experiment.build_checked(exp)
