"""The experiment registry: names, suffixes, on-demand imports, errors."""

from __future__ import annotations

import sys
import textwrap

import pytest
from conftest import TINY, TINY_KEY, describe, registrations_undone, run_cli

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
  with registrations_undone():
    yield


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
  # The module's name alone is not an experiment: the error names a class in it.
  with pytest.raises(UserError, match=r"^--exp=mymod names a module; name an experiment class "
                                      r"in it, e.g. --exp=mymod.MyExp "):
    registry.get("mymod")
  monkeypatch.delitem(sys.modules, "mymod")


def test_missing_dependency_inside_a_user_module_is_not_reported_as_a_wrong_name(
    tmp_path, monkeypatch):
  (tmp_path / "brokenmod.py").write_text("import no_such_dependency_xyz  # noqa\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "brokenmod", raising=False)
  with pytest.raises(UserError) as e:
    registry.get("brokenmod.Anything")
  # One line naming what is missing inside the module, not "no module brokenmod".
  assert "importing brokenmod failed" in str(e.value)
  assert "'no_such_dependency_xyz', which is not installed" in str(e.value)


# A Pax file's port asking paxlike.pax for what it does not have, three ways (Pax's GPU LLaMA
# template imports SAX's layers; TextInput is Pax's text input, make_masked_ml_data_augmenter
# its lingvo BERT masking's params).
PAX_GAPS = {
    "from paxlike.pax.contrib.gpu.scripts_gpu import saxml_layers":
        "contrib.gpu.scripts_gpu.saxml_layers",
    "from paxlike.pax.tasks.lm.input_generator import TextInput":
        "tasks.lm.input_generator.TextInput",
    "from paxlike.pax.tasks.lm import input_generator\nX = input_generator."
    "make_masked_ml_data_augmenter": "tasks.lm.input_generator.make_masked_ml_data_augmenter",
}


@pytest.mark.parametrize("source", sorted(PAX_GAPS))
def test_a_pax_name_paxlike_lacks_is_one_line_naming_the_files_line(source, tmp_path,
                                                                    monkeypatch):
  (tmp_path / "ported.py").write_text(f"import os\n{source}\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "ported", raising=False)
  with pytest.raises(UserError) as e:
    registry.get("ported.Anything")
  message, last_line = str(e.value), source.splitlines()[-1]
  assert "\n" not in message
  assert f"ported.py:{len(source.splitlines()) + 1}: {last_line})" in message
  assert f"paxlike.pax has no {PAX_GAPS[source]}: paxlike does not run" in message
  assert "pax_porting.md" in message


def test_a_users_own_attribute_error_keeps_its_traceback(tmp_path, monkeypatch):
  """Only a Pax name paxlike.pax lacks is turned into a line; a bug in the user's own code
  is theirs to read in full."""
  (tmp_path / "buggy.py").write_text("import os\nX = os.no_such_function_xyz\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "buggy", raising=False)
  with pytest.raises(AttributeError, match="no_such_function_xyz"):
    registry.get("buggy.Anything")


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


def _forget_after_test(monkeypatch, *modules: str) -> None:
  """Whatever these modules are now, the test ends with none of them imported."""
  for name in modules:
    monkeypatch.setitem(sys.modules, name, None)
    del sys.modules[name]


def _user_module(tmp_path, monkeypatch, name: str, source: str) -> None:
  (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
  monkeypatch.syspath_prepend(str(tmp_path))
  _forget_after_test(monkeypatch, name)


def test_a_dotted_name_looks_only_in_the_users_module_of_that_name(tmp_path, monkeypatch):
  _user_module(tmp_path, monkeypatch, "c4", """\
      from experiments.lm.c4 import C4SpmdGpt3AdamOrgHP as Shipped
      from paxlike import experiment_registry

      @experiment_registry.register
      class C4SpmdGpt3AdamOrgHP(Shipped):
        NUM_LAYERS = 2

      class C4SpmdAdam(Shipped):  # shadows a shipped name, never registered
        pass
      """)
  from experiments.lm import c4 as shipped

  assert registry.get("c4.C4SpmdGpt3AdamOrgHP").__module__ == "c4"
  with pytest.raises(UserError, match=r"c4\.C4SpmdAdam .* not a registered experiment; "
                     r"decorate the class with @experiment_registry\.register"):
    registry.get("c4.C4SpmdAdam")
  with pytest.raises(UserError, match=r"module c4 .* has no registered experiment "
                     r"'C4Spmd1BAdam4Replicas'"):
    registry.get("c4.C4Spmd1BAdam4Replicas")
  # The shipped module is named by its path under experiments/, or in full.
  assert registry.get("lm.c4.C4SpmdAdam") is shipped.C4SpmdAdam
  assert registry.get("experiments.lm.c4.C4SpmdAdam") is shipped.C4SpmdAdam


def test_without_a_user_module_a_suffix_still_finds_the_shipped_experiment():
  from experiments.lm import c4 as shipped

  assert "c4" not in sys.modules
  assert registry.get("c4.C4SpmdGpt3AdamOrgHP") is shipped.C4SpmdGpt3AdamOrgHP


def test_pax_paths_resolve_to_the_classes_their_modules_reexport():
  from experiments.lm import c4 as shipped

  assert registry.get("tasks.lm.params.c4.C4SpmdAdam") is shipped.C4SpmdAdam
  assert registry.get("paxlike.pax.tasks.lm.params.c4.C4SpmdAdam") is shipped.C4SpmdAdam
  assert registry.get("paxml.tasks.lm.params.c4.C4SpmdAdam") is shipped.C4SpmdAdam  # Pax's key
  with pytest.raises(UserError, match=r"C4SpmdAdamBf16 .*it is experiments\.lm\.c4\."
                     r"C4SpmdAdamBf16\) is not a registered experiment"):
    registry.get("tasks.lm.params.c4.C4SpmdAdamBf16")


def test_a_package_name_finds_a_class_in_its_submodules_unless_two_have_it(tmp_path,
                                                                           monkeypatch):
  pkg = tmp_path / "mypkg"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  for sub in ("a", "b"):
    (pkg / f"{sub}.py").write_text(textwrap.dedent(f"""\
        from paxlike import experiment_registry
        from paxlike.experiment import BaseExperiment

        @experiment_registry.register
        class Shared(BaseExperiment):
          pass

        @experiment_registry.register
        class Only{sub.upper()}(BaseExperiment):
          pass
        """))
  monkeypatch.syspath_prepend(str(tmp_path))
  _forget_after_test(monkeypatch, "mypkg", "mypkg.a", "mypkg.b")
  assert registry.get("mypkg.OnlyA").__module__ == "mypkg.a"
  with pytest.raises(UserError) as e:
    registry.get("mypkg.Shared")
  assert "mypkg.a.Shared" in str(e.value) and "mypkg.b.Shared" in str(e.value)
  assert "\n" not in str(e.value)
  names, unregistered = registry.module_names("mypkg")
  assert names == ["mypkg.a.OnlyA", "mypkg.a.Shared", "mypkg.b.OnlyB", "mypkg.b.Shared"]
  assert unregistered == []


@pytest.mark.parametrize("name", ["LmCloudSpmdTiyn", "lm_cloud.LmCloudSpmdTiyn",
                                  "lm.lm_cloud.LmCloudSpmdTiyn", "no_such_mod.Foo", "Zzzzq"])
def test_unknown_names_end_their_sentence_once(name):
  with pytest.raises(UserError) as e:
    registry.get(name)
  text = str(e.value)
  assert "?." not in text and ".." not in text and "\n" not in text
  assert text.endswith((".", "?"))


def test_a_user_nvidia_module_is_named_as_shadowing_the_cuda_packages(tmp_path, monkeypatch):
  monkeypatch.syspath_prepend(str(tmp_path))
  assert registry.shadowing_module("nvidia.X") is None  # none, or the installed packages
  (tmp_path / "nvidia.py").write_text("raise AssertionError('must not be imported')\n")
  import importlib

  importlib.invalidate_caches()
  line = registry.shadowing_module("nvidia.X")
  assert line is not None and str(tmp_path / "nvidia.py") in line
  assert "--exp=nvidia_experiments.X" in line
  # Also when --exp names another module: `import jax` would run the file all the same.
  assert "take its directory off PYTHONPATH" in registry.shadowing_module(TINY)
  assert "nvidia" not in sys.modules
