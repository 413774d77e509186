"""Initial checkpoints with rules (paxlike.initial): rename, skip, strict, shapes, optimizer."""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest
from conftest import TINY, train_in_process

from paxlike import config, experiment, initial, registry, trainer
from paxlike.errors import UserError
from paxlike.partitioning import SpmdPartitioner


def shapes(**named):
  return {k.replace("__", "/"): types.SimpleNamespace(shape=v) for k, v in named.items()}


TARGET = shapes(encoder__x=(2, 3), encoder__y=(4,), head__w=(3, 5))
SOURCE = shapes(enc__x=(2, 3), enc__y=(4,), head__w=(3, 5))


def test_rules_rename_and_leave_fresh():
  init = initial.InitFrom("paxlike:/src", rules=((r"encoder/(.*)", r"enc/\1"),
                                                  (r"head/.*", None)))
  plan = initial.plan(init, TARGET, SOURCE)
  assert plan.mapping == {"encoder/x": "enc/x", "encoder/y": "enc/y", "head/w": None}
  assert plan.counts() == {"from_source": 2, "renamed": 2, "fresh": 1}


def test_first_matching_rule_wins_and_identity_is_the_default():
  init = initial.InitFrom("paxlike:/src", rules=((r"head/w", None), (r"(.*)", r"\1")))
  assert initial.plan(init, shapes(head__w=(3, 5)), SOURCE).mapping == {"head/w": None}
  plan = initial.plan(initial.InitFrom("paxlike:/src"), shapes(head__w=(3, 5)), SOURCE)
  assert plan.mapping == {"head/w": "head/w"} and plan.renamed == 0


def test_strict_names_the_parameter_no_rule_covers():
  init = initial.InitFrom("paxlike:/src", rules=((r"encoder/(.*)", r"enc/\1"),))
  with pytest.raises(UserError, match="parameter head/w is covered by no INIT_FROM_RULES"):
    initial.plan(init, TARGET, SOURCE)
  relaxed = initial.InitFrom("paxlike:/src", rules=((r"encoder/(.*)", r"enc/\1"),),
                             strict=False)
  assert initial.plan(relaxed, TARGET, SOURCE).mapping["head/w"] is None


def test_strict_names_a_parameter_the_source_lacks():
  init = initial.InitFrom("paxlike:/src")  # identity: encoder/x is not in the source
  with pytest.raises(UserError, match="encoder/x maps to encoder/x, which paxlike:/src"):
    initial.plan(init, TARGET, SOURCE)


def test_a_shape_that_differs_names_both_shapes():
  init = initial.InitFrom("paxlike:/src", rules=((r"encoder/(.*)", r"enc/\1"),
                                                  (r"(.*)", r"\1")), strict=False)
  with pytest.raises(UserError, match=r"head/w has shape \(5, 3\) in this run but head/w "
                                      r"has shape \(3, 5\)"):
    initial.plan(init, {**TARGET, "head/w": types.SimpleNamespace(shape=(5, 3))}, SOURCE)


def test_bad_specs_and_rules_are_user_errors():
  exp = types.SimpleNamespace(INIT_FROM="gs://bucket", INIT_FROM_RULES=None,
                              INIT_FROM_STRICT=True, INIT_FROM_OPTIMIZER=False)
  with pytest.raises(UserError, match="is not one of hf:DIR, paxlike:DIR"):
    initial.InitFrom.of(exp, None)
  exp.INIT_FROM = "t5x:gs://t5-data/pretrained_models/t5x/flan_t5_base/checkpoint_1184000"
  with pytest.raises(UserError, match="remote paths are not read; copy the checkpoint"):
    initial.InitFrom.of(exp, None)
  exp.INIT_FROM, exp.INIT_FROM_RULES = "paxlike:/x", [("(unclosed", None)]
  with pytest.raises(UserError, match="not a regular expression"):
    initial.InitFrom.of(exp, None)
  exp.INIT_FROM_RULES, exp.INIT_FROM_OPTIMIZER = None, True
  with pytest.raises(UserError, match="needs a paxlike source"):
    initial.InitFrom.of(exp, "hf:/some/dir")


def _program(overrides):
  exp = experiment.instantiate(registry.get(TINY), overrides)
  task = config.build(exp.task())
  inp = config.build(exp.datasets()[0])
  inp.bind_host(1, 0)
  from paxlike import mesh

  part = SpmdPartitioner(mesh.build([1, 1, 1], None, devices=jax.devices()[:1]))
  return trainer.build_train_program(task, inp, part)


def test_load_takes_mapped_weights_and_a_fresh_optimizer(tmp_path):
  source_job = tmp_path / "source"
  result, _, part = train_in_process(TINY, ["NUM_TRAIN_STEPS=3"], source_job)
  trained = jax.device_get(part.to_saveable(result.state))
  program = _program([])
  fresh = jax.device_get(program.partitioner.to_saveable(program.init_state(7)))
  init = initial.InitFrom(f"paxlike:{source_job}",
                          rules=((r"final_norm/.*", None), (r"(.*)", r"\1")))
  state, plan = initial.load(init, program.task.model, program.abstract, fresh)
  got, src, new = (initial.flat_names(t) for t in (state.params, trained.params, fresh.params))
  assert plan.counts()["fresh"] == 2  # final_norm's scale and bias
  for name, value in got.items():
    expected = new[name] if name.startswith("final_norm/") else src[name]
    np.testing.assert_array_equal(value, expected, err_msg=name)
  # The optimizer starts fresh (Adam's moments zero), not from the source's moments.
  assert not any(np.any(np.asarray(x)) for x in jax.tree.leaves(state.opt_state)
                 if np.asarray(x).ndim > 0)
  assert any(np.any(np.asarray(x)) for x in jax.tree.leaves(trained.opt_state)
             if np.asarray(x).ndim > 0)
  # Asked for, the optimizer state comes from the source too.
  with_opt = initial.InitFrom(f"paxlike:{source_job}", optimizer=True)
  state, _ = initial.load(with_opt, program.task.model, program.abstract, fresh)
  for a, b in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(trained.opt_state),
                  strict=True):
    np.testing.assert_array_equal(a, b)
  # A model whose shapes differ is refused before anything is read.
  wider = _program(["MODEL_DIMS=32"])
  with pytest.raises(UserError, match="has shape"):
    initial.check(init, wider.task.model, wider.abstract)
