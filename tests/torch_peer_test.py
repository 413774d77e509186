"""benchmarks.torch_peer: paxlike's step beside the transformers model of the same shape."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, subprocess_env

from benchmarks import torch_peer
from paxlike import config, experiment, registry
from paxlike.errors import UserError


def _model(exp_name, overrides=()):
  exp = experiment.instantiate(registry.get(exp_name), list(overrides))
  return config.build(exp.task()).model


def test_the_llama_peer_is_the_same_model_and_both_sides_are_timed():
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  # One OpenMP thread: CI runs two suites on two cores, and torch's spinning threads,
  # oversubscribed, can stretch a millisecond step to seconds (speed is not asserted here).
  env = {**subprocess_env(), "OMP_NUM_THREADS": "1"}
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.torch_peer", "--exp=LlamaTiny", "--steps=2",
       "--warmup=0"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240)
  assert proc.returncode == 0, proc.stderr[-2000:]
  record = json.loads(proc.stdout.strip().splitlines()[-1])
  # Counted apart, by JAX and by torch: the peer has paxlike's parameters, no more, no fewer.
  assert record["num_params"] == record["peer_num_params"] > 0
  assert record["peer"]["model"].endswith("LlamaForCausalLM")
  assert record["ratio"] == pytest.approx(
      record["step_s_median"] / record["peer_step_s_median"])
  assert record["mfu"] > 0 and record["peer_mfu"] > 0
  # Both start untrained: about ln(vocabulary) nats a token.
  vocab = _model("LlamaTiny").vocab_size
  for loss in (record["first_step_loss"], record["peer_first_step_loss"]):
    assert abs(loss - math.log(vocab)) < 1.0, record


def test_an_lm_gpt2_cannot_mirror_is_refused_in_one_sentence():
  with pytest.raises(UserError, match="time the Llama family instead"):
    torch_peer.peer_config(_model("LmCloudSpmdTiny", ["USE_GATED_ACTIVATION=True"]))
  architecture, cfg = torch_peer.peer_config(_model("LmCloudSpmdTiny"))
  assert architecture == "GPT2LMHeadModel" and cfg["tie_word_embeddings"]
