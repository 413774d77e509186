"""Encoder-decoder inputs: TextInput and SeqIOInput with the enc_dec feature converter, packing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paxlike.errors import UserError
from paxlike.inputs.text import TextInput, packing_efficiency

ARITHMETIC = "tasks.arithmetic:examples"
UNPACKED_KEYS = {"encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens",
                 "decoder_loss_weights"}
PACKED_KEYS = UNPACKED_KEYS | {"encoder_segment_ids", "decoder_segment_ids",
                               "encoder_positions", "decoder_positions"}


def enc_dec(**kw) -> TextInput:
  kw.setdefault("num_infeed_hosts", 1)
  kw.setdefault("infeed_host_index", 0)
  kw.setdefault("name", "t")
  return TextInput(feature_converter="enc_dec", **kw)


def write_jsonl(path, rows) -> str:
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  return str(path)


def split_packed(batch: dict[str, np.ndarray]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
  """A packed batch -> its examples in row-major order as (encoder tokens, target tokens).

  Also asserts what a packed row promises: segments 1, 2, ... then padding on both sides,
  positions restarting at 0, decoder inputs restarting with the start id 0, loss weights on
  exactly the real target tokens.
  """
  out = []
  for r in range(len(batch["encoder_input_tokens"])):
    enc_seg, dec_seg = batch["encoder_segment_ids"][r], batch["decoder_segment_ids"][r]
    n = int(enc_seg.max())
    assert int(dec_seg.max()) == n, f"row {r}: encoder and decoder hold different examples"
    for seg, side in ((enc_seg, "encoder"), (dec_seg, "decoder")):
      used = int((seg > 0).sum())
      assert (seg[used:] == 0).all(), f"row {r}: {side} padding inside the row"
      assert (np.diff(seg[:used]) >= 0).all() and set(seg[:used]) == set(range(1, n + 1))
      starts = np.searchsorted(seg[:used], np.arange(1, n + 1))
      want = np.arange(used) - np.repeat(starts, np.diff(np.r_[starts, used]))
      np.testing.assert_array_equal(batch[f"{side}_positions"][r][:used], want)
    np.testing.assert_array_equal(batch["decoder_loss_weights"][r], dec_seg > 0)
    for s in range(1, n + 1):
      enc = batch["encoder_input_tokens"][r][enc_seg == s]
      tgt = batch["decoder_target_tokens"][r][dec_seg == s]
      dec_in = batch["decoder_input_tokens"][r][dec_seg == s]
      np.testing.assert_array_equal(dec_in, np.r_[0, tgt[:-1]])
      assert (enc != 0).all() and (tgt != 0).all()
      out.append((tuple(enc), tuple(tgt)))
  return out


def unpacked_examples(batch: dict[str, np.ndarray]) -> list[tuple[tuple[int, ...], ...]]:
  """An unpacked batch's rows with loss weight, as (encoder tokens, target tokens)."""
  return [(tuple(e[e != 0]), tuple(t[t != 0]))
          for e, t, w in zip(batch["encoder_input_tokens"], batch["decoder_target_tokens"],
                             batch["decoder_loss_weights"], strict=True) if w.any()]


def test_unpacked_features_of_known_examples_with_custom_field_names(tmp_path):
  path = write_jsonl(tmp_path / "qa.jsonl", [{"question": "37+45=", "answer": "82"},
                                             {"question": "1+2=", "answer": "3"}])
  inp = enc_dec(file_pattern=path, input_key="question", target_key="answer", seq_len=8,
                target_len=4, batch_size=2, shuffle=False, pack=True, is_training=False,
                repeat=False, reset_for_eval=True)
  batch = inp.get_next()
  assert set(batch) == UNPACKED_KEYS  # pack is ignored by an eval input
  # Byte b -> id b + 3, EOS = 1 after inputs and targets, 0 = padding.
  np.testing.assert_array_equal(batch["encoder_input_tokens"], [
      [54, 58, 46, 55, 56, 64, 1, 0],  # "37+45=" EOS
      [52, 46, 53, 64, 1, 0, 0, 0]])  # "1+2=" EOS
  np.testing.assert_array_equal(batch["decoder_target_tokens"], [[59, 53, 1, 0], [54, 1, 0, 0]])
  # The targets row shifted right behind the start id 0 (EOS lands on padding, as in seqio).
  np.testing.assert_array_equal(batch["decoder_input_tokens"], [[0, 59, 53, 1], [0, 54, 1, 0]])
  np.testing.assert_array_equal(batch["decoder_loss_weights"], [[1, 1, 1, 0], [1, 1, 0, 0]])
  assert {k: v.dtype for k, v in batch.items()} == {
      "encoder_input_tokens": np.int32, "decoder_input_tokens": np.int32,
      "decoder_target_tokens": np.int32, "decoder_loss_weights": np.float32}
  assert inp.ids_to_strings(batch["encoder_input_tokens"]) == ["37+45=", "1+2="]
  assert inp.ids_to_strings(batch["decoder_target_tokens"]) == ["82", "3"]


def test_a_cut_example_keeps_its_eos_as_t5x_trains(tmp_path):
  """seqio's append_eos_after_trim: cut to the row less one, then EOS; so a model learns to
  end targets longer than MAX_TARGET_LEN, and a long prompt still ends."""
  path = write_jsonl(tmp_path / "long.jsonl", [{"inputs": "123456789+1=", "targets": "123456"}])
  inp = enc_dec(file_pattern=path, seq_len=8, target_len=4, batch_size=1, shuffle=False,
                is_training=False, repeat=False, reset_for_eval=True)
  batch = inp.get_next()
  np.testing.assert_array_equal(batch["encoder_input_tokens"], [[52, 53, 54, 55, 56, 57, 58, 1]])
  np.testing.assert_array_equal(batch["decoder_target_tokens"], [[52, 53, 54, 1]])
  np.testing.assert_array_equal(batch["decoder_loss_weights"], [[1, 1, 1, 1]])


def test_text_input_and_seqio_input_give_the_same_enc_dec_features():
  pytest.importorskip("seqio")
  from paxlike.inputs.seqio_input import SeqIOInput

  common = dict(num_infeed_hosts=1, infeed_host_index=0, batch_size=128, is_training=False,
                repeat=False, reset_for_eval=True)
  seqio_inp = SeqIOInput(name="s", mixture_name="paxlike_arithmetic_seq2seq",
                         task_module="tasks.seqio_tasks", split_name="test",
                         feature_converter="enc_dec", pack=True,
                         task_feature_lengths={"inputs": 6, "targets": 4}, **common)
  # Six encoder positions cut "37+45=" + EOS: both pipelines trim, then append EOS.
  native = TextInput(name="n", generator=ARITHMETIC, split="test", feature_converter="enc_dec",
                     seq_len=6, target_len=4, shuffle=False, **common)
  batches = 0
  while True:
    try:
      got = seqio_inp.get_next()
    except StopIteration:
      break
    want = native.get_next()
    batches += 1
    assert set(got) == set(want) == UNPACKED_KEYS  # no extra seqio features, no packing
    live = want["decoder_loss_weights"].any(axis=1)
    # Both pad the last batch with weight-0 rows (their contents may differ).
    np.testing.assert_array_equal(got["decoder_loss_weights"].any(axis=1), live)
    for k in want:
      assert got[k].dtype == want[k].dtype, k
      np.testing.assert_array_equal(got[k][live], want[k][live], err_msg=k)
  assert batches == native.num_batches() == 4  # 500 held-out examples, the last batch padded
  assert seqio_inp.ids_to_strings(got["encoder_input_tokens"][:2]) == native.ids_to_strings(
      want["encoder_input_tokens"][:2])
  with pytest.raises(UserError, match="prepacked=True reads rows the task packed already, "
                                      "with the decoder converter"):
    SeqIOInput(name="s", mixture_name="paxlike_arithmetic", feature_converter="enc_dec",
               prepacked=True)


def test_packing_keeps_every_example_once_in_stream_order(tmp_path):
  rows = [{"inputs": f"{i}*{i + 3}=" + "x" * (i % 7), "targets": str(i * (i + 3))}
          for i in range(41)]
  path = write_jsonl(tmp_path / "mul.jsonl", rows)
  seq_len, target_len = 32, 12
  common = dict(file_pattern=path, seq_len=seq_len, target_len=target_len, seed=11, repeat=False)
  # A finite training input: one shuffled epoch, packed until it runs out.
  packed = enc_dec(pack=True, batch_size=3, **common)
  batches = []
  while True:
    try:
      batches.append(packed.get_next())
    except StopIteration:
      break
  assert len(batches) == packed.num_batches()
  assert all(set(b) == PACKED_KEYS for b in batches)
  got = [ex for b in batches for ex in split_packed(b)]
  # The same epoch unpacked, in stream order (the same seeded shuffle).
  stream = unpacked_examples(enc_dec(pack=False, batch_size=len(rows), **common).get_next())
  assert got == stream, "packed rows must hold the stream's examples once each, in order"
  assert got != sorted(got)  # the training stream is shuffled
  # Greedy: the example that starts a row did not fit in the row before it.
  segs = [(b["encoder_segment_ids"][r], b["decoder_segment_ids"][r])
          for b in batches for r in range(len(b["encoder_segment_ids"]))]
  per_row = [int(enc.max()) for enc, _ in segs]
  assert max(per_row) >= 3 and per_row[-1] == 0  # rows past the epoch's end are empty
  for row, (enc, dec) in enumerate(segs[:-1]):
    nxt = sum(per_row[:row + 1])
    if nxt < len(stream):
      enc_len, tgt_len = map(len, stream[nxt])
      assert ((enc > 0).sum() + enc_len > seq_len or (dec > 0).sum() + tgt_len > target_len), \
          f"row {row} had room for the next example"


def test_packed_stream_resumes_exactly_and_ignores_the_host_count():
  common = dict(generator=ARITHMETIC, seq_len=32, target_len=16, pack=True, seed=5)
  one = enc_dec(batch_size=4, **common)
  first = [one.get_next() for _ in range(3)]
  state = one.get_state()
  rest = [one.get_next() for _ in range(3)]
  assert state["index"] == 3 and state["cursor"] > 3 * 4  # several examples per row
  for restored_state in (state, {"index": state["index"]}):  # cursor saved, or replayed
    again = enc_dec(batch_size=4, **common)
    again.set_state(json.loads(json.dumps(restored_state)))  # checkpoints store it as JSON
    for want in rest:
      got = again.get_next()
      for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  # Two hosts reading 2 rows each make the same global batches as one host reading 4.
  hosts = [enc_dec(batch_size=2, num_infeed_hosts=2, infeed_host_index=h, **common)
           for h in (0, 1)]
  for step, want in enumerate(first + rest):
    halves = [h.get_next() for h in hosts]
    for k in want:
      np.testing.assert_array_equal(np.concatenate([x[k] for x in halves]), want[k],
                                    err_msg=f"step {step} {k}")
  assert hosts[0].get_state() == hosts[1].get_state() == one.get_state()


def test_packing_efficiency_of_packed_arithmetic_is_much_higher():
  def efficiency(seq_len: int, target_len: int, pack: bool) -> float:
    inp = enc_dec(generator=ARITHMETIC, seq_len=seq_len, target_len=target_len, pack=pack,
                  batch_size=64, seed=3)
    return float(np.mean([packing_efficiency(inp.get_next()) for _ in range(4)]))

  packed = efficiency(32, 16, True)
  unpacked = efficiency(32, 16, False)
  tight = efficiency(8, 4, False)  # unpacked rows just long enough for the longest example
  message = f"packed 32/16: {packed:.3f}, unpacked 32/16: {unpacked:.3f}, unpacked 8/4: {tight:.3f}"
  assert packed > 0.8 and packed > 3 * unpacked, message
  assert packed >= tight - 0.05, message
  # Padding rows of a finite input (all loss weights 0) count as padding.
  batch = {"encoder_input_tokens": np.array([[5, 1, 0, 0], [5, 1, 0, 0]]),
           "decoder_target_tokens": np.array([[7, 1], [7, 1]]),
           "decoder_loss_weights": np.array([[1.0, 1.0], [0.0, 0.0]])}
  assert packing_efficiency(batch) == 4 / 12


def test_bad_enc_dec_data_are_user_errors(tmp_path):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"inputs": "1+1=", "targets": "2"}\n{"inputs": "2+2=", \n')
  with pytest.raises(UserError, match=r"bad\.jsonl line 2 is not valid JSON"):
    enc_dec(file_pattern=str(bad), target_len=4)
  path = write_jsonl(tmp_path / "q.jsonl", [{"inputs": "1+1=", "targets": "2"},
                                            {"prompt": "2+2=", "targets": "4"}])
  with pytest.raises(UserError, match=r"example 1 of .*q\.jsonl has no 'inputs' field: "
                                      r"\{'prompt': '2\+2=', 'targets': '4'\}"):
    enc_dec(file_pattern=path, target_len=4)
  with pytest.raises(UserError, match="target_len > 0"):
    enc_dec(file_pattern=path)
