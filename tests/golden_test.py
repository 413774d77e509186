"""Every shipped experiment against its golden record (tests/golden/, paxlike.golden)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from paxlike import config, golden, registry
from paxlike import experiment as experiment_lib
from paxlike import mesh as mesh_lib
from paxlike.dry_run import _bytes_per_device, input_specs
from paxlike.lm_experiments import TransformerLmSpmdAdam
from paxlike.partitioning import SpmdPartitioner

LM_TINY = "experiments.lm.lm_cloud.LmCloudSpmdTiny"
T5_TINY = "experiments.t5.flan_t5.FlanT5Tiny"


def test_every_shipped_experiment_matches_its_record():
  moved, missing, stale = golden.check()
  if moved or missing or stale:
    pytest.fail("\n" + golden.report(moved, missing, stale), pytrace=False)


def test_an_experiment_without_a_record_fails_with_the_update_command(tmp_path):
  (tmp_path / "LmCloudSpmdTiny.txt").write_text(golden.render(golden.compute(LM_TINY)))
  moved, missing, stale = golden.check([LM_TINY, T5_TINY], record_dir=tmp_path)
  assert (moved, missing, stale) == ({}, ["FlanT5Tiny"], [])
  text = golden.report(moved, missing, stale)
  assert "FlanT5Tiny" in text and "python -m paxlike.golden --update" in text


def test_a_changed_template_default_names_the_experiments_and_fields_that_moved(monkeypatch):
  # HIDDEN_DIMS=None derives 4 x MODEL_DIMS in the LM template; a rule of 2 x moves every
  # LM that leaves it unset, and nothing of the T5 family.
  monkeypatch.setattr(TransformerLmSpmdAdam, "hidden_dims", lambda self: 2 * self.MODEL_DIMS)
  moved, missing, _ = golden.check([LM_TINY, T5_TINY])
  assert not missing and list(moved) == ["LmCloudSpmdTiny"], golden.report(moved, missing, [])
  changes = "\n".join(moved["LmCloudSpmdTiny"])
  assert "task.model.hidden_dims: 256 -> 128" in changes
  assert "model.params: " in changes and "bytes_per_device.params: " in changes
  assert "flops.model_per_step: " in changes


def test_a_changed_template_attribute_moves_every_experiment_that_inherits_it(monkeypatch):
  monkeypatch.setattr(TransformerLmSpmdAdam, "LAYERNORM_EPSILON", 1e-5)
  moved, _, _ = golden.check([LM_TINY, T5_TINY])
  assert list(moved) == ["LmCloudSpmdTiny"]
  assert "hparam.LAYERNORM_EPSILON: 1e-06 -> 1e-05" in moved["LmCloudSpmdTiny"]


def test_bytes_per_device_equal_the_real_shardings_on_an_8_device_mesh():
  # C4SpmdAdam's mesh [1, 4, 2] is the 8 fake devices: its arithmetic record must equal
  # the bytes NamedShardings put on one device.
  key = "experiments.lm.c4.C4SpmdAdam"
  rec = golden.compute(key)
  exp = experiment_lib.instantiate(registry.get(key))
  shape = [1, 4, 2]
  part = SpmdPartitioner(Mesh(np.asarray(jax.devices()[:8]).reshape(shape), mesh_lib.MESH_AXES),
                         rules=mesh_lib.logical_axis_rules(exp.TRAINING_OPTIMIZED_SHARDING))
  task = config.build(exp.task())
  abstract, logical = golden._abstract_state(
      task.model, task.learner.transform(),
      task.model.init_batch(input_specs(exp.datasets()[0])))
  part.set_state_specs(logical)
  state = part.abstract_state(abstract)
  assert int(rec["bytes_per_device.params"]) == _bytes_per_device(state.params)
  assert int(rec["bytes_per_device.opt_state"]) == _bytes_per_device(state.opt_state)


@pytest.mark.parametrize("old,new,moved", [
    ({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}, ["b: 2 -> 3", "c: (new) -> 4"]),
    ({"a": "1", "input": "unavailable here (no seqio)"}, {"a": "1", "model.params": "7"}, []),
])
def test_diff(old, new, moved):
  assert golden.diff(old, new) == moved


def test_the_compiled_peak_is_compared_within_its_tolerance():
  old = {golden.compiled_field(): golden.compiled_value(1000)}
  assert golden.diff(old, {golden.compiled_field(): golden.compiled_value(1090)}) == []
  moved = golden.diff(old, {golden.compiled_field(): golden.compiled_value(1200)})
  assert len(moved) == 1 and "-> 1200" in moved[0] and "tolerance" in moved[0]
  # A plain check does not compile: the recorded peak is not compared then.
  assert golden.diff(old, {}) == []


def test_the_rotating_subset_covers_every_pod_scale_experiment():
  keys = [f"k{i}" for i in range(14)]
  days = [golden.rotating_subset(keys, d) for d in range(1, 15)]
  assert all(len(d) == 1 for d in days) and sorted(sum(days, [])) == sorted(keys)


def test_a_family_without_a_flops_formula_is_recorded_as_na(monkeypatch):
  from paxlike.models.language_model import LanguageModel

  def no_formula(self, specs):
    raise NotImplementedError

  monkeypatch.setattr(LanguageModel, "model_flops_per_step", no_formula)
  rec = golden.compute(LM_TINY)
  assert rec["flops.model_per_step"] == (
      "n/a (LanguageModel has no model_flops_per_step formula)")
  assert int(rec["model.params"]) > 0


def test_readme_dry_run_table_is_rendered_from_the_golden_records():
  from paxlike import golden_table

  shown = golden_table.in_readme(golden_table.README.read_text())
  assert shown is not None, f"{golden_table.README.name} lost its dry-run table markers"
  assert shown == golden_table.table(), (
      f"{golden_table.README.name}'s dry-run table differs from the golden records; run "
      "`python -m paxlike.golden_table --write`")
