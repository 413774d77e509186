"""The experiment registry: names, suffixes, on-demand imports, errors."""

from __future__ import annotations

import sys
import textwrap

import pytest
from conftest import TINY, TINY_KEY, describe, run_cli

from paxlike import experiment_registry, registry
from paxlike.errors import UserError
from paxlike.experiment import BaseExperiment

SHIPPED = (
    "experiments.lm.lm_cloud.LmCloudSpmd2B",
    "experiments.lm.lm_cloud.LmCloudSpmd2BLimitSteps",
    "experiments.lm.lm_cloud.LmCloudSpmdTiny",
)


@pytest.fixture(autouse=True)
def clean_registry():
  """Unregisters whatever a test registers (shipped experiments stay)."""
  registry.import_shipped()
  before = set(registry.list_names())
  yield
  for key in set(registry.list_names()) - before:
    registry.unregister(key)


def _exp_class(module: str, name: str) -> type:
  """A fresh experiment class whose registry key is module.name."""
  return type(name, (BaseExperiment,), {"__module__": module, "__qualname__": name})


def test_full_path_suffix_and_class_name_resolve_to_the_same_class():
  from experiments.lm.lm_cloud import LmCloudSpmdTiny

  assert registry.get(TINY_KEY) is LmCloudSpmdTiny
  assert registry.get("lm_cloud.LmCloudSpmdTiny") is LmCloudSpmdTiny
  assert registry.get("lm.lm_cloud.LmCloudSpmdTiny") is LmCloudSpmdTiny
  assert registry.get(TINY) is LmCloudSpmdTiny
  assert registry.get(f"  {TINY} ") is LmCloudSpmdTiny


def test_shipped_experiments_are_listed():
  assert set(SHIPPED) <= set(registry.list_names())


def test_get_imports_a_user_module_on_demand(tmp_path, monkeypatch):
  (tmp_path / "mymod.py").write_text(textwrap.dedent("""\
      from experiments.lm.lm_cloud import LmCloudSpmdTiny
      from paxlike import experiment_registry

      @experiment_registry.register
      class MyExp(LmCloudSpmdTiny):
        NUM_LAYERS = 3
      """))
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "mymod", raising=False)
  assert "mymod.MyExp" not in registry.list_names()

  cls = registry.get("mymod.MyExp")

  assert "mymod" in sys.modules
  assert cls.__module__ == "mymod" and cls.__name__ == "MyExp"
  assert cls.NUM_LAYERS == 3
  # Once imported, the bare class name resolves too.
  assert registry.get("MyExp") is cls
  monkeypatch.delitem(sys.modules, "mymod")


def test_missing_dependency_inside_a_user_module_is_not_reported_as_a_wrong_name(
    tmp_path, monkeypatch):
  (tmp_path / "brokenmod.py").write_text("import no_such_dependency_xyz  # noqa\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "brokenmod", raising=False)
  with pytest.raises(ModuleNotFoundError) as e:
    registry.get("brokenmod.Anything")
  assert e.value.name == "no_such_dependency_xyz"


def test_unknown_module_names_the_module():
  with pytest.raises(UserError, match="no_such_module_abc"):
    registry.get("no_such_module_abc.Foo")


def test_duplicate_registration_raises_unless_allow_overwrite():
  first = _exp_class("regtest_dup", "Dup")
  second = _exp_class("regtest_dup", "Dup")
  registry.register(first)
  # Registering the same class again is harmless.
  assert registry.register(first) is first

  with pytest.raises(UserError, match=r"regtest_dup\.Dup is already registered"):
    registry.register(second)
  assert registry.get("regtest_dup.Dup") is first

  registry.register(second, allow_overwrite=True)
  assert registry.get("regtest_dup.Dup") is second


def test_decorator_with_and_without_arguments():
  @experiment_registry.register
  class Plain(BaseExperiment):
    pass

  @experiment_registry.register(tags=("small", "cpu"))
  class Tagged(BaseExperiment):
    pass

  # The decorator returns the class itself, not a wrapper.
  assert isinstance(Plain, type) and issubclass(Plain, BaseExperiment)
  assert isinstance(Tagged, type) and issubclass(Tagged, BaseExperiment)
  plain_key = f"{__name__}.{Plain.__qualname__}"
  tagged_key = f"{__name__}.{Tagged.__qualname__}"
  assert registry.get(plain_key) is Plain
  assert registry.get(tagged_key) is Tagged
  assert registry.tags(tagged_key) == ("small", "cpu")
  assert registry.tags(plain_key) == ()


def test_typo_suggests_the_right_name():
  with pytest.raises(UserError) as e:
    registry.get("LmCloudSpmdTiyn")
  assert "LmCloudSpmdTiny" in str(e.value)
  assert "Did you mean" in str(e.value)


def test_typo_in_class_of_an_existing_module_suggests_the_right_name():
  with pytest.raises(UserError) as e:
    registry.get("lm_cloud.LmCloudSpmdTiyn")
  assert "LmCloudSpmdTiny" in str(e.value)


def test_ambiguous_suffix_lists_every_match():
  registry.register(_exp_class("regtest_a.models", "Shared"))
  registry.register(_exp_class("regtest_b.models", "Shared"))

  with pytest.raises(UserError, match="ambiguous") as e:
    registry.get("models.Shared")
  assert "regtest_a.models.Shared" in str(e.value)
  assert "regtest_b.models.Shared" in str(e.value)
  # A longer suffix picks one.
  assert registry.get("regtest_b.models.Shared").__module__ == "regtest_b.models"


def test_unregister_removes_the_name():
  registry.register(_exp_class("regtest_gone", "Gone"))
  assert registry.get("regtest_gone.Gone").__name__ == "Gone"
  registry.unregister("regtest_gone.Gone")
  with pytest.raises(UserError):
    registry.get("regtest_gone.Gone")


def test_list_experiments_cli_prints_the_shipped_names(tmp_path):
  proc = run_cli(["--list_experiments"], cwd=tmp_path)
  assert proc.returncode == 0, describe(proc)
  lines = proc.stdout.split()
  for name in SHIPPED:
    assert name in lines, describe(proc)
