"""The CPU-sized Flan-T5 learns packed addition, then fine-tunes on subtraction, through main.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import describe, parse_trained_line, read_scalars, run_cli

from tasks import arithmetic

TEST_STEPS = 500
# Exact match on the 500 held-out prompts after the test-sized run (measured 0.938);
# the full 1200-step FlanT5ArithmeticTiny run reaches 1.0.
TEST_BAR = 0.8
FINETUNE_STEPS = 100
# Held-out subtraction exact match after FINETUNE_STEPS from the addition weights
# (measured 0.16-0.22 over three seeds); a fresh model after as many steps: 0.014.
FINETUNE_BAR = 0.1
MAX_INPUT_LEN, MAX_TARGET_LEN = 24, 12  # FlanT5ArithmeticTiny's packed row


def unpacked_efficiency() -> float:
  """The real-token fraction of addition rows with one example each (ids + EOS, both sides)."""
  lens = [len(ex["inputs"]) + len(ex["targets"]) + 2 for ex in arithmetic.examples("train")]
  return float(np.mean(lens)) / (MAX_INPUT_LEN + MAX_TARGET_LEN)


@pytest.fixture(scope="module")
def addition_job(tmp_path_factory):
  """A shortened FlanT5ArithmeticTiny run in jobs/flan_add, where the fine-tune's INIT_FROM is."""
  root = tmp_path_factory.mktemp("flan_arith")
  job = root / "jobs" / "flan_add"
  proc = run_cli(["--exp=FlanT5ArithmeticTiny", f"--job_log_dir={job}",
                  "--set", f"NUM_TRAIN_STEPS={TEST_STEPS}",
                  "--set", f"LR_COS_DECAY_END={TEST_STEPS}", "--set", "EVAL_INTERVAL_STEPS=0",
                  "--set", f"CHECKPOINT_EVERY_N_STEPS={TEST_STEPS}"], root, timeout=600,
                 optimized=True)
  assert proc.returncode == 0, describe(proc)
  return root, job


def test_packed_addition_reaches_exact_match_on_held_out_prompts(addition_job):
  _, job = addition_job
  metrics = json.loads((job / "decoder_out" / "test" / f"metrics_{TEST_STEPS:08d}.json")
                       .read_text())
  assert metrics["num_examples"] == 500
  assert metrics["exact_match"] >= TEST_BAR, metrics
  # Rows hold ~3 examples each: far more real tokens than one example a row (~0.28).
  efficiency = [v for _, v in read_scalars(job / "summaries" / "train")["packing_efficiency"]]
  assert efficiency, "no packing_efficiency in the train summaries"
  assert all(2 * unpacked_efficiency() < e <= 1.0 for e in efficiency), (
      efficiency, unpacked_efficiency())


def test_subtraction_fine_tunes_from_the_addition_checkpoint(addition_job):
  root, job = addition_job
  proc = run_cli(["--exp=FlanT5SubtractionFromAddition", f"--job_log_dir={root / 'sub'}",
                  "--set", f"NUM_TRAIN_STEPS={FINETUNE_STEPS}",
                  "--set", f"LR_COS_DECAY_END={FINETUNE_STEPS}",
                  "--set", "SUMMARY_INTERVAL_STEPS=50"], root, timeout=600, optimized=True)
  assert proc.returncode == 0, describe(proc)
  assert "starting from the parameters of paxlike:jobs/flan_add" in proc.stderr, describe(proc)
  # Not the first loss: the addition model is confidently wrong on subtraction's answers,
  # so it starts near a fresh model's (~5.9; 7.7-8.7 from fully trained addition runs).
  # After as many steps, the fine-tune's loss is far below the fresh addition run's,
  # and a fresh model on subtraction does worse still (1.63 at step 100).
  fresh = dict(read_scalars(job / "summaries" / "train")["loss"])[FINETUNE_STEPS]
  trained = parse_trained_line(proc.stdout)
  assert trained["last_loss"] < 0.75 * fresh, (trained, fresh)
  metrics = json.loads((root / "sub" / "decoder_out" / "test" /
                        f"metrics_{FINETUNE_STEPS:08d}.json").read_text())
  assert metrics["exact_match"] >= FINETUNE_BAR, metrics
  rows = [json.loads(line) for line in (root / "sub" / "decoder_out" / "test" /
                                        f"decode_{FINETUNE_STEPS:08d}.jsonl").open()]
  a, b = rows[0]["prompt"].rstrip("=").split("-")
  assert rows[0]["target"] == str(int(a) - int(b))
