"""SeqIOInput on the arithmetic task registered in tasks/seqio_tasks.py (the [seqio] extra)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("seqio")

from paxlike.inputs.seqio_input import SeqIOInput  # noqa: E402
from paxlike.inputs.text import TextInput  # noqa: E402


def seqio_input(**kw):
  kw.setdefault("num_infeed_hosts", 1)
  kw.setdefault("infeed_host_index", 0)
  return SeqIOInput(name="t", mixture_name="paxlike_arithmetic", task_module="tasks.seqio_tasks",
                    task_feature_lengths={"inputs": 6, "targets": 6}, **kw)


def test_seqio_eval_epoch_matches_the_native_input_and_pads():
  inp = seqio_input(split_name="test", batch_size=64, is_training=False, repeat=False,
                    reset_for_eval=True)
  batches = []
  while True:
    try:
      batches.append(inp.get_next())
    except StopIteration:
      break
  assert len(batches) == 8  # 500 held-out examples in batches of 64, the last padded
  weights = np.concatenate([b["weights"] for b in batches])
  assert int((weights.sum(axis=1) > 0).sum()) == 500
  native = TextInput(generator="tasks.arithmetic:examples", split="test", seq_len=12,
                     batch_size=64, num_infeed_hosts=1, infeed_host_index=0, is_training=False,
                     repeat=False, reset_for_eval=True, shuffle=False)
  nb = native.get_next()
  first = batches[0]
  assert inp.ids_to_strings(first["ids"], first["prompt_lens"]) == native.ids_to_strings(
      nb["ids"], nb["prompt_lens"])
  # The same byte ids: seqio's row is the native row shifted right by one (BOS = 0).
  np.testing.assert_array_equal(first["labels"][:, :11], nb["ids"][:, :11])
  assert inp.score(["12", "3"], ["12", "4"]) == {"exact_match": 0.5}


def test_seqio_shards_hosts_disjointly_and_resumes():
  rows = []
  for host in (0, 1):
    inp = seqio_input(split_name="test", batch_size=50, is_training=False, repeat=False,
                      reset_for_eval=True, num_infeed_hosts=2, infeed_host_index=host)
    rows.append({tuple(r) for _ in range(5) for r in inp.get_next()["ids"]})
  assert len(rows[0]) == len(rows[1]) == 250 and not rows[0] & rows[1]
  train = seqio_input(split_name="train", batch_size=8, seed=5)
  train.get_next()
  state = train.get_state()
  expected = train.get_next()
  again = seqio_input(split_name="train", batch_size=8, seed=5)
  again.set_state(state)
  np.testing.assert_array_equal(again.get_next()["ids"], expected["ids"])
