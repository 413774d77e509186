"""--profile_steps on a GPU: command buffers off, so the profile names ops; a user's flag kept."""

from __future__ import annotations

import types

import pytest

from paxlike import profiler, xla_flags

FLAG = xla_flags.COMMAND_BUFFER_FLAG


def _exp(overrides=None):
  return types.SimpleNamespace(XLA_FLAGS_OVERRIDES=overrides, DCN_MESH_SHAPE=None)


@pytest.mark.parametrize("platform", ["gpu", "cuda"])
def test_a_profiled_gpu_run_runs_without_command_buffers_and_says_why(platform):
  res = xla_flags.resolve(_exp(), platform, environ={}, profiling=True)
  assert f"--{FLAG}= " in res.env["XLA_FLAGS"] + " ", res.env
  assert res.flags[FLAG] == "" and res.sources[FLAG] == "profile"
  record = res.record()
  assert {"flag": FLAG, "value": "", "source": "profile"} in record["xla_flags_resolved"]
  (note,) = record["xla_flag_notes"]
  assert "without CUDA graphs" in note and "may differ slightly" in note

  plain = xla_flags.resolve(_exp(), platform, environ={}, profiling=False)
  assert FLAG not in plain.flags and plain.record()["xla_flag_notes"] == []


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_other_platforms_profile_with_their_flags_unchanged(platform):
  profiled = xla_flags.resolve(_exp(), platform, environ={}, profiling=True)
  plain = xla_flags.resolve(_exp(), platform, environ={})
  assert profiled.env == plain.env and profiled.notes == []


def test_a_command_buffer_flag_the_user_or_the_experiment_set_is_kept():
  user = xla_flags.resolve(_exp(), "gpu", environ={"XLA_FLAGS": f"--{FLAG}=FUSION,CUBLAS"},
                           profiling=True)
  assert user.flags[FLAG] == "FUSION,CUBLAS" and user.sources[FLAG] == "user"
  assert "kept" in user.notes[0] and "command_buffer_N" in user.notes[0]

  exp = xla_flags.resolve(_exp({"gpu": {FLAG: "FUSION"}}), "gpu", environ={}, profiling=True)
  assert exp.flags[FLAG] == "FUSION" and exp.sources[FLAG] == "experiment"
  assert "set by the experiment" in exp.notes[0]


def test_a_summary_whose_top_ops_are_cuda_graphs_is_named_as_such():
  summary = {"top_ops": [{"name": "command_buffer_255"}, {"name": "fusion.12"},
                         {"name": "command_buffer_45"}]}
  assert profiler.command_buffers(summary) == ["command_buffer_255", "command_buffer_45"]
  assert profiler.command_buffers({"top_ops": [{"name": "nvjet_gemm"}]}) == []
