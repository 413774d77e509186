"""Input pipelines: the reset_for_eval table, host sharding, the native text input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paxlike.errors import UserError
from paxlike.evaluator import eval_batches
from paxlike.inputs.synthetic import SyntheticLmInput
from paxlike.inputs.text import TextInput
from paxlike.models import LanguageModel

# eval_batches asks the model for a weight-0 filler batch; its dims do not matter here.
LM = LanguageModel(vocab_size=8, model_dims=8, num_layers=1, num_heads=1, dim_per_head=8,
                   hidden_dims=8)


@pytest.fixture()
def jsonl(tmp_path):
  path = tmp_path / "data.jsonl"
  rows = [{"inputs": f"{i}+1=", "targets": str(i + 1)} for i in range(10)]
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  return path


def text_input(path, **kw):
  kw.setdefault("num_infeed_hosts", 1)
  kw.setdefault("infeed_host_index", 0)
  return TextInput(file_pattern=str(path), seq_len=8, **kw)


def examples_seen(batches):
  """The set of (row bytes) with any weight, over batches."""
  return [tuple(b["ids"][r]) for b in batches for r in range(len(b["ids"]))
          if b["weights"][r].any()]


def test_reset_for_eval_runs_one_full_padded_epoch_each_time(jsonl):
  inp = text_input(jsonl, name="e", batch_size=4, is_training=False, repeat=False,
                   reset_for_eval=True)
  first, second = list(eval_batches(inp, LM)), list(eval_batches(inp, LM))
  assert len(first) == len(second) == 3  # 10 examples in batches of 4
  assert len(examples_seen(first)) == 10  # the last batch's 2 padding rows carry weight 0
  assert examples_seen(first) == examples_seen(second)


def test_no_reset_takes_the_next_batches_of_a_repeating_stream(jsonl):
  inp = text_input(jsonl, name="e", batch_size=4, is_training=False, repeat=True,
                   reset_for_eval=False, eval_loop_num_batches=2)
  first, second = list(eval_batches(inp, LM)), list(eval_batches(inp, LM))
  assert len(first) == len(second) == 2
  seen1, seen2 = examples_seen(first), examples_seen(second)
  # Examples 0-7, then the stream goes on: 8, 9, and wraps to 0-5.
  assert len(set(seen1)) == 8 and not set(seen2[:2]) & set(seen1)
  assert seen2[2:] == seen1[:6]


@pytest.mark.parametrize("kwargs,expected", [
    (dict(is_training=False, repeat=True, reset_for_eval=True), "never ends"),
    (dict(is_training=False, repeat=True, reset_for_eval=False, eval_loop_num_batches=0),
     "eval_loop_num_batches > 0"),
    (dict(is_training=False, repeat=False, reset_for_eval=False, eval_loop_num_batches=2),
     "run out"),
    (dict(is_training=True, repeat=True, reset_for_eval=True), "training input"),
])
def test_unsupported_cells_are_rejected_with_the_reason(jsonl, kwargs, expected):
  with pytest.raises(UserError, match=expected):
    text_input(jsonl, name="bad", batch_size=2, **kwargs)


def test_hosts_never_emit_the_same_training_example_and_together_make_one_global_batch(
    tmp_path):
  path = tmp_path / "forty.jsonl"
  path.write_text("\n".join(json.dumps({"inputs": f"{i}*2=", "targets": str(2 * i)})
                            for i in range(40)))

  def stream(hosts, index, steps=10):  # one epoch: 10 global batches of 4
    inp = TextInput(file_pattern=str(path), seq_len=8, batch_size=4 // hosts,
                    num_infeed_hosts=hosts, infeed_host_index=index, name="t", seed=7)
    return [inp.get_next() for _ in range(steps)]

  one = stream(1, 0)
  h0, h1 = stream(2, 0), stream(2, 1)
  rows0 = {tuple(r) for b in h0 for r in b["ids"]}
  rows1 = {tuple(r) for b in h1 for r in b["ids"]}
  assert len(rows0) == len(rows1) == 20 and not rows0 & rows1
  for step in range(10):
    np.testing.assert_array_equal(
        np.concatenate([h0[step]["ids"], h1[step]["ids"]]), one[step]["ids"])
  # And the synthetic stream behaves the same way.
  a = SyntheticLmInput(batch_size=4, num_infeed_hosts=1, infeed_host_index=0)
  b0 = SyntheticLmInput(batch_size=2, num_infeed_hosts=2, infeed_host_index=0)
  b1 = SyntheticLmInput(batch_size=2, num_infeed_hosts=2, infeed_host_index=1)
  x, y0, y1 = a.get_next(), b0.get_next(), b1.get_next()
  assert not set(map(tuple, y0["ids"])) & set(map(tuple, y1["ids"]))
  np.testing.assert_array_equal(np.concatenate([y0["ids"], y1["ids"]]), x["ids"])


def test_text_input_tokenizes_prompts_and_targets_and_resumes_its_position(jsonl):
  inp = text_input(jsonl, name="t", batch_size=2, shuffle=False)
  batch = inp.get_next()
  assert inp.ids_to_strings(batch["ids"], batch["prompt_lens"]) == ["0+1=", "1+1="]
  target = batch["labels"][0][batch["weights"][0] > 0]
  assert inp.ids_to_strings(target[None]) == ["1"]  # "1" then end of sequence
  state = inp.get_state()
  expected = inp.get_next()
  again = text_input(jsonl, name="t", batch_size=2, shuffle=False)
  again.set_state(state)
  np.testing.assert_array_equal(again.get_next()["ids"], expected["ids"])


@pytest.mark.parametrize("pack", [False, True])
def test_peeking_a_large_text_input_copies_none_of_its_data_and_keeps_its_place(tmp_path,
                                                                               pack):
  """Every run peeks its training input's shapes a few times before step 1; for the user's
  own files that must not hold a second copy of every tokenized example."""
  import tracemalloc

  path = tmp_path / "big.txt"
  path.write_text("".join(f"line {i} of a user's own text file\n" for i in range(20000)))
  inp = TextInput(file_pattern=str(path), seq_len=64, pack=pack, name="t", batch_size=4,
                  num_infeed_hosts=1, infeed_host_index=0)
  data_bytes = sum(v.nbytes for v in inp._features.values())
  first, second = inp.get_next(), inp.get_next()
  tracemalloc.start()
  try:
    peeked = inp.peek_specs()
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert peak < data_bytes / 20, (peak, data_bytes)
  assert {k: (v.shape, v.dtype) for k, v in peeked.items()} == {
      k: (v.shape, v.dtype) for k, v in first.items()}
  again = TextInput(file_pattern=str(path), seq_len=64, pack=pack, name="t", batch_size=4,
                    num_infeed_hosts=1, infeed_host_index=0)
  np.testing.assert_array_equal(again.get_next()["ids"], first["ids"])
  np.testing.assert_array_equal(again.get_next()["ids"], second["ids"])
  third = inp.get_next()  # the stream goes on after the second batch
  for key, value in again.get_next().items():
    np.testing.assert_array_equal(third[key], value)


def test_plain_text_packs_lines(tmp_path):
  """Lines fill rows whole (segments 1, 2, ..., positions restarting); a line longer than a
  row is cut into pieces overlapping by one token, so no next-token prediction is lost."""
  path = tmp_path / "a.txt"
  path.write_text("hello world\nhi\nok\n")
  inp = TextInput(file_pattern=str(path), seq_len=8, pack=True, batch_size=2,
                  num_infeed_hosts=1, infeed_host_index=0, shuffle=False)
  batch = inp.get_next()
  # "hello world" + EOS is 12 tokens: pieces "hello wor" (8 predictions), "rld" + EOS (3).
  assert inp.ids_to_strings(batch["ids"][:1]) == ["hello wo"]
  np.testing.assert_array_equal(batch["segment_ids"][0], [1] * 8)
  np.testing.assert_array_equal(batch["segment_ids"][1], [1, 1, 1, 2, 2, 3, 3, 0])
  np.testing.assert_array_equal(batch["segment_pos"][1], [0, 1, 2, 0, 1, 0, 1, 0])
  np.testing.assert_array_equal(batch["weights"][1], [1] * 7 + [0])
  assert inp.ids_to_strings(batch["labels"][1:, :3]) == ["ld"]  # then EOS
  assert batch["ids"][1, 0] == batch["labels"][0, -1]  # the overlap: "r" predicts "l"


def test_packed_rows_give_each_line_its_unpacked_logits(tmp_path):
  """A PACKED_INPUT LM on packed rows gives every example the logits it gets alone; without
  the segments, the examples after the first would read their neighbours."""
  import jax
  import jax.numpy as jnp

  path = tmp_path / "a.txt"
  lines = ["hello world", "abc", "second line", "xy", "the last line"]
  path.write_text("\n".join(lines) + "\n")
  common = dict(file_pattern=str(path), seq_len=16, num_infeed_hosts=1, infeed_host_index=0,
                shuffle=False, repeat=False)
  packed = TextInput(pack=True, batch_size=3, **common).get_next()  # 11+3, 11+2, 13 tokens
  unpacked = TextInput(pack=False, batch_size=5, **common).get_next()
  assert packed["weights"].any(-1).all() and packed["segment_ids"].max() == 2
  model = LanguageModel(vocab_size=TextInput(**common).vocab.vocab_size, model_dims=16,
                        num_layers=2, num_heads=2, dim_per_head=8, hidden_dims=32,
                        packed_input=True)
  params = model.init(jax.random.key(0), jnp.zeros((1, 16), jnp.int32))["params"]
  logits = np.asarray(model.apply({"params": params}, packed["ids"],
                                  segment_ids=packed["segment_ids"],
                                  segment_pos=packed["segment_pos"]))
  mixed = np.asarray(model.apply({"params": params}, packed["ids"]))
  alone = np.asarray(model.apply({"params": params}, unpacked["ids"]))
  seen, differs = 0, False
  for r in range(len(packed["ids"])):
    for segment in range(1, packed["segment_ids"][r].max() + 1):
      span = np.nonzero(packed["segment_ids"][r] == segment)[0]
      # The unpacked row of the same line: the same ids, labels and weights at 0..m-1.
      u = next(i for i in range(len(lines)) if np.array_equal(
          unpacked["ids"][i, :len(span)], packed["ids"][r, span]) and
          unpacked["weights"][i].sum() == len(span))
      np.testing.assert_array_equal(unpacked["labels"][u, :len(span)], packed["labels"][r, span])
      np.testing.assert_allclose(logits[r, span], alone[u, :len(span)], rtol=1e-4, atol=1e-5)
      differs |= not np.allclose(mixed[r, span], alone[u, :len(span)], atol=1e-3)
      seen += 1
  assert seen == len(lines) and differs


def test_missing_and_unreadable_data_files_are_user_errors(tmp_path):
  with pytest.raises(UserError, match="no data file matches"):
    TextInput(file_pattern=str(tmp_path / "nope*.jsonl"), num_infeed_hosts=1,
              infeed_host_index=0)
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"inputs": "1+1=", "targets": "2"}\nnot json\n')
  with pytest.raises(UserError, match="line 2 is not valid JSON"):
    TextInput(file_pattern=str(bad), num_infeed_hosts=1, infeed_host_index=0)
  # One misspelt name in a list would train on the other files alone.
  good = tmp_path / "good.txt"
  good.write_text("one line\n")
  with pytest.raises(UserError, match=r"no data file matches '\S*trian\.txt' \(of"):
    TextInput(file_pattern=f"{good},{tmp_path / 'trian.txt'}", num_infeed_hosts=1,
              infeed_host_index=0)


def test_a_plain_text_example_is_a_line_whatever_breaks_it_holds(tmp_path):
  path = tmp_path / "t.txt"
  path.write_text("ab\u2028cd\x0cef\r\n\nsecond\n", newline="")
  inp = TextInput(file_pattern=str(path), seq_len=16, batch_size=2, num_infeed_hosts=1,
                  infeed_host_index=0, shuffle=False)
  assert inp.num_examples == 2
  ids = inp.get_next()["ids"]
  assert inp.vocab.decode(ids[0]) == "ab\u2028cd\x0cef"


def test_a_run_resumed_with_another_batch_size_reads_on_where_it_stopped(tmp_path):
  path = tmp_path / "n.txt"
  path.write_text("".join(f"{i}\n" for i in range(40)))

  def make(batch_size):
    return TextInput(file_pattern=str(path), seq_len=4, batch_size=batch_size, shuffle=False,
                     num_infeed_hosts=1, infeed_host_index=0)

  def lines(inp):
    return [inp.vocab.decode(row) for row in inp.get_next()["ids"]]

  first = make(2)
  assert [lines(first) for _ in range(3)][-1] == ["4", "5"]
  state = json.loads(json.dumps(first.get_state()))  # as a checkpoint keeps it
  second = make(4)
  second.set_state(state)
  assert lines(second) == ["6", "7", "8", "9"]
  # A state written before the input recorded its example (an older paxlike's checkpoint).
  old = make(2)
  old.set_state({"index": 3})
  assert lines(old) == ["6", "7"]


def test_packing_efficiency_counts_a_pad_id_that_is_not_0_as_padding():
  from paxlike.inputs.text import packing_efficiency

  labels = np.asarray([[5, 6, 1, 1], [7, 1, 1, 1]])  # a tokenizer padding with EOS (1)
  batch = {"labels": labels, "weights": np.ones((2, 4), np.float32)}
  assert packing_efficiency(batch, pad_id=1) == 3 / 8
  segments = np.asarray([[1, 1, 2, 0], [1, 0, 0, 0]])  # packed: the segments say it
  assert packing_efficiency({**batch, "segment_ids": segments}, pad_id=1) == 4 / 8


def test_synthetic_ids_fit_the_models_vocabulary():
  """Pax's SyntheticLmData takes the model's vocabulary (Pax's stream is all ones, inside
  any); a stream wider than the model's table is refused in one line, not a NaN loss."""
  from paxlike.pax.tasks.lm.input_generator import SyntheticLmData

  model = LanguageModel(vocab_size=64, model_dims=16, num_layers=1, num_heads=2,
                        dim_per_head=8, hidden_dims=32)
  pax = SyntheticLmData(name="train", batch_size=4, seq_len=32, is_training=True)
  pax.check_model(model)
  batch = pax.get_next()
  assert batch["ids"].max() < 64 and batch["labels"].max() < 64
  assert len(np.unique(batch["ids"])) > 8  # still the learnable walk, over 64 tokens
  wide = SyntheticLmInput(name="train", batch_size=4, seq_len=32, vocab_size=256)
  with pytest.raises(UserError, match=r"^input 'train' draws token ids below vocab_size=256, "
                                      r"but the model's VOCAB_SIZE is 64; set the input's "
                                      r"vocab_size to 64 or less"):
    wide.check_model(model)


def test_fewer_infeed_hosts_than_processes_is_refused_by_every_process_alike():
  # A Pax file's fractional PERCORE_BATCH_SIZE can make num_infeed_hosts=1 on 2 processes;
  # process 0 refuses too (before: only process 1 did, and process 0 waited in the first
  # collective until Gloo timed out, then printed a traceback).
  for process in (0, 1):
    inp = SyntheticLmInput(batch_size=2, num_infeed_hosts=1)
    with pytest.raises(UserError, match=r"num_infeed_hosts=1 is fewer than the 2 processes"):
      inp.bind_host(2, process)
  inp = SyntheticLmInput(batch_size=2, num_infeed_hosts=1, infeed_host_index=0)
  inp.bind_host(2, 1)  # an index the user set stands
  assert inp.hosts == (1, 0)
