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
