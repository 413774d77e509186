"""TFRecordBertInput (Pax's MLPerf BERT input) on small MLPerf-format files."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from conftest import REPO_ROOT  # noqa: E402
from mlperf_records import CLS, SEP, write_mlperf_records  # noqa: E402

from paxlike.errors import UserError  # noqa: E402
from paxlike.inputs.bert_records import TFRecordBertInput  # noqa: E402
from paxlike.layers.masking import MlmMasking  # noqa: E402

SEQ, PRED, FILES, PER_FILE = 64, 10, 4, 16
KEYS = {"labels": np.int32, "masked_ids": np.int32, "segment_ids": np.int32,
        "segment_pos": np.int32, "masked_pos": np.float32, "paddings": np.float32}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  return write_mlperf_records(str(tmp_path_factory.mktemp("bert")), FILES, PER_FILE,
                              seq_len=SEQ, max_predictions=PRED)


def expected_rows(paths):
  """Every record as Pax's rows: originals restored, the first [SEP] taken out."""
  rows = []
  for path in paths:
    for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
      f = tf.train.Example.FromString(raw).features.feature
      ids, mask = list(f["input_ids"].int64_list.value), list(f["input_mask"].int64_list.value)
      labels, marks = list(ids), [0.0] * SEQ
      for p, t, w in zip(f["masked_lm_positions"].int64_list.value,
                         f["masked_lm_ids"].int64_list.value,
                         f["masked_lm_weights"].float_list.value, strict=True):
        if w:
          labels[p], marks[p] = t, 1.0
      cut = labels.index(SEP)
      rows.append({k: np.asarray(v[:cut] + v[cut + 1:] + [0]) for k, v in (
          ("labels", labels), ("masked_ids", ids), ("masked_pos", marks),
          ("segment_ids", mask))})
  return rows


def make(paths, **kw):
  kw.setdefault("num_infeed_hosts", 1)
  kw.setdefault("infeed_host_index", 0)
  return TFRecordBertInput(name="train", input_file=paths, max_sequence_length=SEQ,
                           max_predictions_per_seq=PRED, file_buffer_size=64, **kw)


def drain(inp):
  out = []
  while True:
    try:
      out.append(inp.get_next())
    except StopIteration:
      return out


def test_a_training_batch_holds_the_original_text_and_marks_the_masked_tokens(files):
  inp = make(files, batch_size=8)
  by_text = {tuple(r["labels"]): r for r in expected_rows(files)}
  for _ in range(3):
    batch = inp.get_next()
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
        k: ((8, SEQ), np.dtype(t)) for k, t in KEYS.items()}
    for i, labels in enumerate(batch["labels"]):
      want = by_text[tuple(labels)]  # the row is one record's text, as written
      for k in ("masked_ids", "masked_pos", "segment_ids"):
        np.testing.assert_array_equal(batch[k][i], want[k], err_msg=k)
      assert labels[0] == CLS and list(labels).count(SEP) == 1  # the first [SEP] is gone
    np.testing.assert_array_equal(batch["paddings"], 1 - batch["segment_ids"])
    np.testing.assert_array_equal(batch["segment_pos"], batch["segment_ids"] * np.arange(SEQ))
    assert np.all(batch["masked_ids"][batch["masked_pos"] == 1] == 103)


def test_remask_draws_a_new_masking_with_the_configured_mask_id(files):
  plain, fresh = make(files, batch_size=16), make(
      files, batch_size=16, remask=True,
      mlm_augmenter=MlmMasking(mask_token_id=999, vocab_size=1000))
  a, b = plain.get_next(), fresh.get_next()
  np.testing.assert_array_equal(a["labels"], b["labels"])  # the same records
  assert not np.array_equal(a["masked_pos"], b["masked_pos"])
  real = b["paddings"] == 0
  assert 0.08 < b["masked_pos"][real].mean() < 0.24
  assert not b["masked_pos"][~real].any()
  assert (b["masked_ids"] == 999).sum() > 0.5 * b["masked_pos"].sum()
  assert not (b["masked_ids"] == 103).any()


def test_remask_without_a_mask_token_is_refused():
  with pytest.raises(UserError, match="mask_token_id"):
    make("unused", batch_size=2, remask=True, mlm_augmenter=MlmMasking(vocab_size=1000))


def segments(batch):
  """(labels, masked_ids, masked_pos) of every packed example, checking segment_pos."""
  out = []
  for r, ids in enumerate(batch["segment_ids"]):
    for s in range(1, ids.max() + 1):
      cols = np.flatnonzero(ids == s)
      assert np.array_equal(cols, np.arange(cols[0], cols[0] + len(cols)))  # contiguous
      np.testing.assert_array_equal(batch["segment_pos"][r, cols], np.arange(len(cols)))
      out.append(tuple(tuple(batch[k][r, cols].tolist())
                       for k in ("labels", "masked_ids", "masked_pos")))
  return out


def test_packing_puts_several_whole_examples_in_a_row(files):
  inp = make(files, batch_size=8, enable_packing=True, prepacking_batch_size=32)
  batch = inp.get_next()
  assert (batch["segment_ids"].max(axis=1) > 1).any()  # rows with several examples
  np.testing.assert_array_equal(batch["paddings"], batch["segment_ids"] == 0)
  unpacked = make(files, batch_size=8).get_next()
  assert inp.packing_efficiency(batch) > inp.packing_efficiency(unpacked) + 0.15
  # One pass, packed in one chunk and served a row at a time: every example exactly once.
  one_pass = make(files, batch_size=1, enable_packing=True, repeat=False,
                  prepacking_batch_size=FILES * PER_FILE)
  got = [s for b in drain(one_pass) for s in segments(b)]
  want = [tuple(tuple(r[k][:r["segment_ids"].sum()].tolist())
                for k in ("labels", "masked_ids", "masked_pos")) for r in expected_rows(files)]
  assert sorted(got) == sorted(want)


def test_eval_is_one_padded_pass_in_order_and_reset_starts_it_again(files):
  inp = make(files, batch_size=5, is_training=False)  # Pax's eval config
  assert (inp.reset_for_eval, inp.repeat) == (True, False)
  first = drain(inp)
  assert len(first) == 13  # 64 examples: 12 full batches and one of 4
  with pytest.raises(StopIteration):
    inp.get_next()
  want = expected_rows(files)
  labels = np.concatenate([b["labels"] for b in first])
  np.testing.assert_array_equal(labels[:64], [r["labels"] for r in want])
  last = first[-1]
  assert last["paddings"][4:].all() and not any(v[4:].any() for k, v in last.items()
                                                if k != "paddings")
  inp.reset()
  for a, b in zip(first, drain(inp), strict=True):
    for k in KEYS:
      np.testing.assert_array_equal(a[k], b[k])


def test_two_eval_hosts_serve_equally_many_batches_and_all_examples_between_them(files):
  hosts = [drain(make(files, batch_size=5, is_training=False, num_infeed_hosts=2,
                      infeed_host_index=h)) for h in (0, 1)]
  assert [len(h) for h in hosts] == [7, 7]  # 13 batches: host 1 adds one of padding
  assert hosts[1][-1]["paddings"].all()
  split = [b for pair in zip(*hosts, strict=True) for b in pair]  # batch k from host k % 2
  real = np.concatenate([b["labels"][b["paddings"].min(axis=1) == 0] for b in split])
  np.testing.assert_array_equal(real, [r["labels"] for r in expected_rows(files)])


def test_pax_sharded_pattern_and_globs_find_the_files(files):
  directory = files[0].rsplit("/", 1)[0]
  for pattern in (f"{directory}/part@{FILES}", f"{directory}/part-*"):
    assert len(drain(make(pattern, batch_size=16, is_training=False))) == 4, pattern


def test_training_files_must_split_evenly_between_hosts(files):
  inp = make(files[:3], batch_size=2, num_infeed_hosts=2, infeed_host_index=1)
  with pytest.raises(UserError, match="3 training files .* 2 hosts"):
    inp.get_next()


def test_a_pattern_that_matches_nothing_is_named_at_the_first_read():
  inp = make("/PATH/TO/BERT/TRAIN/TF_RECORDS", batch_size=2)  # building reads nothing
  assert inp.peek_specs()["labels"].shape == (2, SEQ)
  with pytest.raises(UserError, match="/PATH/TO/BERT/TRAIN/TF_RECORDS"):
    inp.get_next()
  with pytest.raises(UserError, match="input_file is not set"):
    make(None, batch_size=2).get_next()


@pytest.mark.parametrize("kw", [
    {}, {"enable_packing": True, "prepacking_batch_size": 16, "remask": True,
         "mlm_augmenter": MlmMasking(vocab_size=1000, mask_token_id=103)}],
    ids=["unpacked", "packed_remasked"])
def test_a_restarted_input_continues_where_the_state_says(files, kw):
  inp = make(files, batch_size=3, **kw)
  for _ in range(5):
    inp.get_next()
  state = json.loads(json.dumps(inp.get_state()))
  ahead = [inp.get_next() for _ in range(2)]
  copied = copy.deepcopy(inp)  # an open input copies its position, not its pipeline
  later = inp.get_next()
  restarted = make(files, batch_size=3, **kw)
  restarted.set_state(state)
  for want, got in zip(ahead + [later], [restarted.get_next() for _ in range(3)], strict=True):
    for k in KEYS:
      np.testing.assert_array_equal(want[k], got[k], err_msg=k)
  np.testing.assert_array_equal(copied.get_next()["labels"], later["labels"])


def test_pax_bert_dataset_config_builds():
  from paxlike.pax import pax_fiddle
  from paxlike.pax.tasks.lm import input_generator

  p = pax_fiddle.Config(input_generator.TFRecordBertInput)
  p.name, p.input_file, p.enable_packing, p.batch_size = "train", "/PATH/X", True, 8
  p.remask, p.num_samples, p.file_buffer_size, p.is_training = True, 156_725_653, 100_000, True
  p.mlm_augmenter.Set(mask_token_id=103, vocab_size=30522)  # bert.py's line
  inp = pax_fiddle.build(p)
  assert (inp.mlm_augmenter.mask_token_id, inp.mlm_augmenter.vocab_size) == (103, 30522)
  assert input_generator.TFRecordBertInput.HParams(batch_size=2).batch_size == 2


def test_the_pax_module_imports_no_tensorflow():
  code = ("import sys, paxlike.pax.tasks.lm.input_generator; "
          "assert 'tensorflow' not in sys.modules")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT)


# Pax's own test file of ten MLPerf records (paxml/tasks/lm/testdata/tfrecords at b397693),
# kept outside the repository with Pax's other files; its expected values are those of
# Pax's input_generator_test.py: each row's first id after [CLS] and its token count.
PAX_RECORDS = Path(os.environ.get("PAXLIKE_PAXREF", "/work/paxref")) / "bert_test.tfrecords"
PAX_FIRST_IDS = [2003, 1996, 1996, 2049, 3748, 1007, 4862, 1996, 2004, 2002]
PAX_LENGTHS = [35, 239, 55, 56, 511, 511, 161, 43, 416, 511]


@pytest.mark.skipif(not PAX_RECORDS.is_file(), reason=f"{PAX_RECORDS} is absent")
def test_paxs_own_records_read_as_paxs_test_expects_whole_and_split_over_four_hosts():
  whole = TFRecordBertInput(input_file=str(PAX_RECORDS), batch_size=10, is_training=False)
  batch = whole.get_next()
  assert batch["labels"][:, 1].tolist() == PAX_FIRST_IDS
  assert batch["segment_ids"].sum(axis=1).tolist() == PAX_LENGTHS
  # Four hosts of 4 rows: three batches and one of padding, batch k on host k.
  ids, lengths = PAX_FIRST_IDS + [0] * 6, PAX_LENGTHS + [0] * 6
  for host in (1, 3, 2, 0):
    inp = TFRecordBertInput(input_file=str(PAX_RECORDS), batch_size=4, is_training=False,
                            num_infeed_hosts=4, infeed_host_index=host)
    batch = inp.get_next()
    assert batch["labels"][:, 1].tolist() == ids[4 * host:4 * host + 4]
    assert batch["segment_ids"].sum(axis=1).tolist() == lengths[4 * host:4 * host + 4]
    with pytest.raises(StopIteration):
      inp.get_next()
  remasked = TFRecordBertInput(input_file=str(PAX_RECORDS), batch_size=10, remask=True,
                               file_buffer_size=20,
                               mlm_augmenter=MlmMasking(vocab_size=8000, mask_token_id=103))
  batch = remasked.get_next()
  assert batch["labels"].shape == (10, 512) and batch["masked_pos"].sum() > 0
