"""benchmarks.compiler_options: how an --option NAME=VALUE reaches XLA."""

from __future__ import annotations

import pytest

from benchmarks import compiler_options
from paxlike.errors import UserError


@pytest.mark.parametrize("text, parsed", [
    ("xla_gpu_dot_merger_threshold_mb=0", ("xla_gpu_dot_merger_threshold_mb", 0)),
    ("--xla_gpu_enable_command_buffer=", ("xla_gpu_enable_command_buffer", "")),
    ("xla_cpu_enable_fast_math=True", ("xla_cpu_enable_fast_math", True)),
    ("xla_gpu_memory_limit_slop_factor=0.5", ("xla_gpu_memory_limit_slop_factor", 0.5)),
])
def test_an_option_is_parsed_as_xla_flags_spell_it(text, parsed):
  assert compiler_options.parse_option(text) == parsed


@pytest.mark.parametrize("text", ["xla_gpu_dot_merger_threshold_mb", "=0"])
def test_an_option_without_name_and_value_is_refused(text):
  with pytest.raises(UserError, match="NAME=VALUE"):
    compiler_options.parse_option(text)


def test_a_step_that_casts_to_float8_is_counted_and_a_plain_one_is_not():
  import jax
  import jax.numpy as jnp

  from benchmarks import settings_pair

  x = jnp.ones((8, 8), jnp.float32)
  fp8 = jax.jit(lambda a: (a.astype(jnp.float8_e4m3fn).astype(jnp.float32) @ a)).lower(x)
  plain = jax.jit(lambda a: a @ a).lower(x)
  assert settings_pair.fp8_instructions(fp8.compile().as_text()) >= 1
  assert settings_pair.fp8_instructions(plain.compile().as_text()) == 0


def test_a_settings_pair_without_another_setting_is_one_error_line(capsys):
  from benchmarks import settings_pair

  with pytest.raises(SystemExit) as e:
    settings_pair.main(["--exp=LmCloudSpmdTiny"])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ["error: name at least one --other KEY=VALUE to compare against the --set step."]
