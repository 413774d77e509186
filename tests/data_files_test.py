"""Fine-tuning on your own files: FilesDataset (TRAIN_FILES, EVAL_FILES, ...) end to end.

Loss masks (prompt/completion, chat), packed decoder-only rows, the chat
template against transformers', decode metrics, and the CLI path a user
takes: fine-tune a CPU experiment of each family on a jsonl task, evaluate,
infer.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import describe, run_cli

from paxlike.errors import UserError
from paxlike.inputs.text import TextInput

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + "
    "'<|end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")
CONVERSATION = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Say hi."},
                {"role": "assistant", "content": "hi"},
                {"role": "user", "content": "Again, louder."},
                {"role": "assistant", "content": "HI!"}]


def _reverse_rows(n: int, seed: int) -> list[dict[str, str]]:
  rng = random.Random(seed)
  words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 6))) for _ in range(n)]
  return [{"inputs": f"reverse: {w}", "targets": w[::-1]} for w in words]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def _text_input(path: Path, **kw) -> TextInput:
  kw.setdefault("num_infeed_hosts", 1)
  kw.setdefault("infeed_host_index", 0)
  kw.setdefault("shuffle", False)
  kw.setdefault("repeat", False)
  return TextInput(file_pattern=str(path), **kw)


def _llama(vocab: int, seq_len: int):
  import jax
  import jax.numpy as jnp

  from paxlike.models.llama import LlamaModel

  model = LlamaModel(vocab_size=vocab, model_dims=32, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=8, hidden_dims=64, max_seq_len=seq_len)
  params = model.init(jax.random.key(0), jnp.zeros((1, seq_len), jnp.int32))["params"]
  return model, params


def _xent(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
  logits = logits.astype(np.float64)
  logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  return logz - np.take_along_axis(logits, labels[..., None], -1)[..., 0]


# ------------------------------------------------------------------ loss masks


def test_a_prompt_completion_rows_loss_is_the_loss_of_its_completion_alone(tmp_path):
  rows = [{"inputs": "reverse: abcd", "targets": "dcba"},
          {"inputs": "reverse: xy", "targets": "yx"}]
  inp = _text_input(_write_jsonl(tmp_path / "d.jsonl", rows), seq_len=24, batch_size=2)
  batch = inp.get_next()
  model, params = _llama(inp.vocab.vocab_size, 24)
  logits = np.asarray(model.apply({"params": params}, batch["ids"]))
  for r, row in enumerate(rows):
    loss, _ = model.apply({"params": params}, {k: v[r:r + 1] for k, v in batch.items()},
                          method="fprop")
    p = len(inp.vocab.encode(row["inputs"]))
    completion = inp.vocab.encode(row["targets"]) + [inp.vocab.eos_id]
    # Label j is token j + 1: the completion's tokens are the labels at p - 1 .. p + c - 2.
    span = slice(p - 1, p - 1 + len(completion))
    np.testing.assert_array_equal(batch["labels"][r, span], completion)
    assert batch["weights"][r].sum() == len(completion) and batch["weights"][r, span].all()
    alone = _xent(logits[r, span], batch["labels"][r, span]).mean()
    np.testing.assert_allclose(float(loss), alone, rtol=1e-5)


@pytest.mark.parametrize("family", ["llama", "lm"])
def test_packed_prompt_completion_rows_give_each_example_its_unpacked_loss(tmp_path, family):
  import jax
  import jax.numpy as jnp

  from paxlike.models import LanguageModel

  path = _write_jsonl(tmp_path / "d.jsonl", _reverse_rows(9, seed=1))
  key = "positions" if family == "llama" else "segment_pos"
  common = dict(seq_len=48, position_key=key)
  packed = _text_input(path, pack=True, is_training=True, batch_size=9, **common).get_next()
  unpacked = _text_input(path, pack=False, batch_size=9, **common).get_next()
  assert packed["segment_ids"].max() >= 2  # rows do hold several examples
  vocab = TextInput(file_pattern=str(path)).vocab.vocab_size
  if family == "llama":
    model, params = _llama(vocab, 48)
    run = lambda b, packed: model.apply(  # noqa: E731
        {"params": params}, b["ids"], b[key] if packed else None,
        b["segment_ids"] if packed else None)
  else:
    model = LanguageModel(vocab_size=vocab, model_dims=32, num_layers=2, num_heads=4,
                          dim_per_head=8, hidden_dims=64, packed_input=True)
    params = model.init(jax.random.key(0), jnp.zeros((1, 48), jnp.int32))["params"]
    run = lambda b, packed: model.apply(  # noqa: E731
        {"params": params}, b["ids"], segment_ids=b["segment_ids"] if packed else None,
        segment_pos=b[key] if packed else None)
  xp = _xent(np.asarray(run(packed, True), np.float32), packed["labels"])
  xu = _xent(np.asarray(run(unpacked, False), np.float32), unpacked["labels"])
  alone = {tuple(unpacked["ids"][i, :int(unpacked["prompt_lens"][i])]): (
      (xu[i] * unpacked["weights"][i]).sum() / unpacked["weights"][i].sum(),
      unpacked["weights"][i].sum()) for i in range(9)}
  seen = 0
  for r in np.flatnonzero(packed["weights"].any(-1)):  # not the rows padding the batch
    for s in range(1, packed["segment_ids"][r].max() + 1):
      span = packed["segment_ids"][r] == s
      w = packed["weights"][r] * span
      prompt = packed["ids"][r][span][:int(np.argmax(w[span] > 0)) + 1]
      want, count = alone[tuple(prompt)]
      assert w.sum() == count  # the completion-only mask survives packing
      np.testing.assert_allclose((xp[r] * w).sum() / w.sum(), want, rtol=1e-5, atol=1e-5)
      seen += 1
  assert seen == 9


def test_chat_rows_put_the_loss_exactly_on_the_assistant_turns(tmp_path):
  ckpt = tmp_path / "ckpt"
  ckpt.mkdir()
  (ckpt / "tokenizer_config.json").write_text(json.dumps(
      {"chat_template": CHAT_TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"}))
  path = _write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}])
  inp = _text_input(path, seq_len=160, batch_size=1, chat_template_dir=str(ckpt))
  batch = inp.get_next()
  weighted = batch["labels"][0][batch["weights"][0] > 0]
  assert inp.vocab.decode(weighted) == "hi<|end|>\nHI!<|end|>\n"
  n = int((batch["labels"][0] != 0).sum())
  full = inp.vocab.decode(np.concatenate([batch["ids"][0, :1], batch["labels"][0, :n]]))
  assert full == ("<s><|system|>\nBe brief.<|end|>\n<|user|>\nSay hi.<|end|>\n<|assistant|>\n"
                  "hi<|end|>\n<|user|>\nAgain, louder.<|end|>\n<|assistant|>\nHI!<|end|>\n")
  # Each weighted run starts right after "<|assistant|>\n": the turn's header is the prompt.
  starts = np.flatnonzero(np.diff(np.concatenate([[0], batch["weights"][0]])) > 0)
  for s in starts:
    assert inp.vocab.decode(batch["ids"][0, s - 13:s + 1]).endswith("<|assistant|>\n")
  # Decoding it continues the last reply: the earlier one is prompt, the last the target.
  from paxlike.models.llama import LlamaModel

  (prompt,), (target,), _ = LlamaModel(512, 8, 1, 1, 1, 8, 16).prompt_and_target(batch)
  assert inp.vocab.decode(prompt).endswith("louder.<|end|>\n<|assistant|>\n")
  assert inp.vocab.decode(target) == "HI!<|end|>\n"


def test_a_conversation_ending_on_the_user_asks_for_the_assistants_reply(tmp_path):
  """What --mode=infer decodes from a chat row: the rendering up to the generation prompt."""
  from paxlike.evaluator import check_infer_file

  ckpt = tmp_path / "ckpt"
  ckpt.mkdir()
  (ckpt / "tokenizer_config.json").write_text(json.dumps(
      {"chat_template": CHAT_TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"}))
  path = _write_jsonl(tmp_path / "ask.jsonl", [{"messages": CONVERSATION[:4]}])
  assert check_infer_file(str(path), "inputs") == 1
  inp = _text_input(path, seq_len=160, batch_size=1, chat_template_dir=str(ckpt),
                    is_training=False, reset_for_eval=True)
  batch = inp.get_next()
  n = int(batch["prompt_lens"][0])
  prompt = inp.vocab.decode(np.concatenate([batch["ids"][0, :1], batch["labels"][0, :n - 1]]))
  assert prompt == ("<s><|system|>\nBe brief.<|end|>\n<|user|>\nSay hi.<|end|>\n<|assistant|>\n"
                    "hi<|end|>\n<|user|>\nAgain, louder.<|end|>\n<|assistant|>\n")
  # The earlier reply is scored (eval loss), no template token; the reply asked for is the
  # model's to write.
  assert inp.vocab.decode(batch["labels"][0][batch["weights"][0] > 0]) == "hi<|end|>\n"
  assert batch["weights"][0, n - 2:].sum() == 0
  # A chat with no reply yet: the prompt's last token marks the row as an example (as an
  # input's EOS does), for infer and eval; training on it is refused, as on inputs alone.
  path = _write_jsonl(tmp_path / "first.jsonl", [{"messages": CONVERSATION[:2]}])
  inp = _text_input(path, seq_len=160, batch_size=1, chat_template_dir=str(ckpt),
                    is_training=False, reset_for_eval=True)
  batch = inp.get_next()
  n = int(batch["prompt_lens"][0])
  assert batch["weights"][0].sum() == 1 and batch["weights"][0, n - 2] == 1
  with pytest.raises(UserError, match=r"first\.jsonl line 1 is a conversation without an "
                     "assistant turn, so it has nothing to train on"):
    _text_input(path, seq_len=160, batch_size=1, chat_template_dir=str(ckpt))
  # Messages that are no conversation are one sentence naming the row.
  for messages, problem in ((["1+1=", "2"], "message 1 is str, not an object"),
                            ([{"role": "user", "content": None}],
                             r"message 1 \(user\) has no 'content' string"),
                            ([], "'messages' is empty")):
    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"messages": CONVERSATION}, {"messages": messages}])
    with pytest.raises(UserError, match=r"bad\.jsonl line 2: " + problem):
      _text_input(bad, seq_len=160, batch_size=1, chat_template_dir=str(ckpt),
                  is_training=False, reset_for_eval=True)


def test_chat_rows_without_a_template_are_one_sentence(tmp_path):
  path = _write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}])
  with pytest.raises(UserError, match="chat template; set INIT_FROM=hf:DIR"):
    _text_input(path, seq_len=64, batch_size=1)


def test_chat_template_renders_as_transformers_apply_chat_template(tmp_path):
  pytest.importorskip("transformers")
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast

  from paxlike.inputs import chat

  tok = Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel()
  tok.train_from_iterator(["Be brief. Say hi. Again, louder. hi HI!"] * 20, trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"]))
  hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                               unk_token="<unk>")
  hf.chat_template = CHAT_TEMPLATE
  hf.save_pretrained(tmp_path / "tok")
  ours = chat.load(str(tmp_path / "tok"))
  for messages, gen in ((CONVERSATION, False), (CONVERSATION[:4], True)):
    assert ours.render(messages, add_generation_prompt=gen) == hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=gen)


def test_a_chat_row_has_the_ids_transformers_gives_the_rendered_chat(tmp_path):
  """A tokenizer that marks the start of a text (Llama 2's and SentencePiece's dummy '▁')
  marks it once, as transformers tokenizes the whole rendered chat, not once a turn; the
  loss still covers the assistant's turns alone."""
  pytest.importorskip("transformers")
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast

  from paxlike.inputs import vocabulary

  tok = Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
  tok.decoder = decoders.Metaspace(prepend_scheme="first")
  tok.train_from_iterator([" ".join(m["content"] for m in CONVERSATION)] * 20,
                          trainers.BpeTrainer(vocab_size=120, special_tokens=[
                              "<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>",
                              "<|system|>", "<|end|>"]))
  hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                               unk_token="<unk>")
  hf.chat_template = CHAT_TEMPLATE
  hf.save_pretrained(tmp_path / "tok")
  vocab = vocabulary.get(str(tmp_path / "tok"))
  # Encoded a turn at a time, the turns would start with a '▁' the whole text lacks.
  assert vocab.encode("hi") != vocab.encode("x hi")[1:]
  path = _write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}])
  inp = _text_input(path, seq_len=200, batch_size=1, chat_template_dir=str(tmp_path / "tok"),
                    vocabulary=str(tmp_path / "tok"), is_training=False, reset_for_eval=True)
  batch = inp.get_next()
  want = hf.apply_chat_template(CONVERSATION, tokenize=True)
  want = list(want if isinstance(want, list) else want["input_ids"])
  assert len(want) > 20
  assert [int(batch["ids"][0, 0]), *batch["labels"][0, :len(want) - 1].tolist()] == want
  weighted = batch["labels"][0][batch["weights"][0] > 0].tolist()
  assert hf.decode(weighted) == hf.decode(hf.encode("hi<|end|>\nHI!<|end|>\n",
                                                    add_special_tokens=False))


def test_a_text_split_in_pieces_has_the_ids_of_the_whole(tmp_path):
  import sentencepiece as spm

  from paxlike.inputs import vocabulary

  text = "Be brief. Say hi. Again, louder, é! " * 3
  spm.SentencePieceTrainer.train(sentence_iterator=iter([text] * 20), vocab_size=25,
                                 model_prefix=str(tmp_path / "spiece"), minloglevel=2)
  for vocab in (vocabulary.get(str(tmp_path / "spiece.model")), vocabulary.get("byte")):
    pieces = ["Be brief. Say", " hi. Again, louder, ", "é! ", text]
    split = vocabulary.encode_pieces(vocab, pieces)
    assert sum(split, []) == vocab.encode("".join(pieces))
    assert split[0] == vocab.encode(pieces[0])  # " hi" starts with piece 1's space


# ------------------------------------------------- file formats, missing fields


def _prompts_and_targets(inp: TextInput) -> list[tuple[str, str]]:
  """Each example's prompt and the text its loss covers (EOS not shown), as decoded."""
  batch = inp.get_next()
  return [(inp.vocab.decode(batch["ids"][r, :int(batch["prompt_lens"][r])]),
           inp.vocab.decode(batch["labels"][r][batch["weights"][r] > 0]))
          for r in range(len(batch["ids"])) if batch["weights"][r].any()]


def test_a_target_key_no_row_has_exits_2_naming_the_fields_the_rows_have(tmp_path):
  rows = [{"prompt": "reverse: ab", "completion": "ba"},
          {"prompt": "reverse: cd", "completion": "dc"}]
  path = _write_jsonl(tmp_path / "pc.jsonl", rows)
  said = "line 1 has no 'targets' field (its fields: ['completion', 'prompt'])"
  # Training on EOS alone, as the rows' targets were read as empty: refused, nothing written.
  proc = run_cli(["--exp=LlamaTiny", f"--job_log_dir={tmp_path / 'job'}", "--set",
                  "VOCAB_SIZE=264", "--set", f"TRAIN_FILES={path}", "--set", "INPUT_KEY=prompt"],
                 tmp_path)
  assert proc.returncode == 2, describe(proc)
  assert f"pc.jsonl {said}, so it has no target to train on; set TARGET_KEY" in proc.stderr
  assert not (tmp_path / "job").exists()
  with pytest.raises(UserError, match=re.escape(said)):
    _text_input(path, input_key="prompt", feature_converter="enc_dec", target_len=8,
                batch_size=2, is_training=True)
  # As EVAL_FILES (eval accuracy 1.0 on EOS, the decode set dropped): refused too.
  with pytest.raises(UserError, match=re.escape(f"EVAL_FILES {path} {said}") + ".*--mode=infer"):
    _configs("LlamaArithmeticTiny", [f"EVAL_FILES={path}", "INPUT_KEY=prompt"])
  c = _configs("LlamaArithmeticTiny", [f"EVAL_FILES={path}", "INPUT_KEY=prompt",
                                       "TARGET_KEY=completion"])
  assert [d.name for d in c.decode_datasets] == ["pc"]
  # Inputs alone are what --mode=infer reads (a non-training input): still read.
  asks = _write_jsonl(tmp_path / "asks.jsonl", [{"prompt": r["prompt"]} for r in rows])
  inp = _text_input(asks, input_key="prompt", batch_size=2, is_training=False,
                    reset_for_eval=True)
  assert [p for p, _ in _prompts_and_targets(inp)] == ["reverse: ab", "reverse: cd"]


ALPACA = [{"instruction": "Reverse ab.", "input": "", "output": "ba"},
          {"instruction": "Reverse xyz.", "input": "", "output": "zyx"},
          {"instruction": "Say hi, twice.", "input": "", "output": "hi hi"}]


@pytest.mark.parametrize("indent", [None, 2])
def test_a_json_array_file_gives_its_objects_as_rows(tmp_path, indent):
  path = tmp_path / "alpaca.json"
  path.write_text(json.dumps(ALPACA, indent=indent))
  inp = _text_input(path, input_key="instruction", target_key="output", batch_size=4)
  assert inp.num_examples == 3
  assert _prompts_and_targets(inp) == [(r["instruction"], r["output"]) for r in ALPACA]
  # JSON Lines in a .json file, and one whole object, are rows as before.
  lines = _write_jsonl(tmp_path / "lines.json", ALPACA)
  assert _text_input(lines, input_key="instruction", target_key="output",
                     batch_size=4).num_examples == 3
  one = tmp_path / "one.json"
  one.write_text(json.dumps(ALPACA[1], indent=indent))
  assert _prompts_and_targets(_text_input(one, input_key="instruction", target_key="output",
                                          batch_size=1)) == [("Reverse xyz.", "zyx")]


def test_rows_that_are_not_json_objects_are_refused_naming_file_and_line(tmp_path):
  bad = tmp_path / "d.jsonl"
  bad.write_text('{"inputs": "a", "targets": "b"}\n\n7\n')
  with pytest.raises(UserError, match=r"d\.jsonl line 3 is a number, not a JSON object; write "
                                      "one object per line"):
    _text_input(bad, batch_size=1)
  bad.write_text('["a", "b"]\n')
  with pytest.raises(UserError, match=r"d\.jsonl line 1 is an array, not a JSON object"):
    _text_input(bad, batch_size=1)
  array = tmp_path / "a.json"
  array.write_text(json.dumps([ALPACA[0], "text"]))
  with pytest.raises(UserError, match=r"a\.json item 2 of its JSON array is a string, not a "
                                      "JSON object"):
    _text_input(array, batch_size=1)
  array.write_text(json.dumps(ALPACA, indent=2)[:-2])  # cut short
  with pytest.raises(UserError, match=r"a\.json line 16 is not valid JSON \("):
    _text_input(array, batch_size=1)


@pytest.mark.parametrize("first", ["with", "without"])
def test_eval_files_mixing_rows_with_and_without_targets_are_refused_in_any_order(tmp_path,
                                                                                 first):
  pairs, plain = _reverse_rows(2, 0), [{"text": "just some text"}]
  rows = pairs + plain if first == "with" else plain + pairs
  path = _write_jsonl(tmp_path / "mixed.jsonl", rows)
  line = 3 if first == "with" else 1
  with pytest.raises(UserError, match=re.escape(
      f"EVAL_FILES {path} line {line} (plain text) has no target to decode against but")):
    _configs("LlamaArithmeticTiny", [f"EVAL_FILES={path}"])
  asks, replies = [{"messages": CONVERSATION[:2]}], [{"messages": CONVERSATION}]
  chats = _write_jsonl(tmp_path / "chats.jsonl",
                       asks + replies if first == "without" else replies + asks)
  with pytest.raises(UserError, match=r"line \d \(a conversation that ends on the user's "
                                      "turn\\) has no target to decode against but .* line \\d "
                                      "has one; give every row of EVAL_FILES a target, or none"):
    _configs("LlamaArithmeticTiny", [f"EVAL_FILES={chats}"])


def test_a_jsonl_file_with_a_byte_order_mark_and_crlf_lines_is_read(tmp_path):
  path = tmp_path / "excel.jsonl"
  rows = _reverse_rows(2, 3)
  path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\r\n" for r in rows).encode())
  inp = _text_input(path, batch_size=2)
  assert _prompts_and_targets(inp) == [(r["inputs"], r["targets"]) for r in rows]


def test_csv_and_tsv_files_are_tables_whose_header_row_names_the_fields(tmp_path):
  csv_file = tmp_path / "qa.csv"
  csv_file.write_bytes(b'\xef\xbb\xbfprompt,completion\r\n"Reverse a, b.","b, a"\r\n'
                       b'"Two\nlines",ok\r\n')
  tsv_file = tmp_path / "qa.tsv"  # a TSV cell's quotes are its text
  tsv_file.write_text('prompt\tcompletion\nReverse a, b.\tb, a\n"5 inches\t"six"\n')
  want = [("Reverse a, b.", "b, a"), ("Two\nlines", "ok")]
  for path, rows in ((csv_file, want), (tsv_file, [want[0], ('"5 inches', '"six"')])):
    inp = _text_input(path, input_key="prompt", target_key="completion", batch_size=2,
                      is_training=True)
    assert _prompts_and_targets(inp) == rows  # the header is no example
  c = _configs("LlamaArithmeticTiny", [f"EVAL_FILES={csv_file}", "INPUT_KEY=prompt",
                                       "TARGET_KEY=completion"])
  assert [d.name for d in c.decode_datasets] == ["qa"]
  with pytest.raises(UserError, match=re.escape(
      "qa.csv line 2 has no 'targets' field (its fields: ['completion', 'prompt'])")):
    _text_input(csv_file, input_key="prompt", batch_size=2, is_training=True)
  with pytest.raises(UserError, match=r"has none of the fields 'inputs', 'text' or 'messages' "
                                      r"\(its fields: \['completion', 'prompt'\]\)"):
    _text_input(csv_file, batch_size=2)
  # An empty cell, and a JSON null, are no target; an object is no text.
  empty = tmp_path / "empty.csv"
  empty.write_text("inputs,targets\n1+1=,2\n4+4=,\n")
  with pytest.raises(UserError, match=r"empty\.csv line 3 has no 'targets' field"):
    _text_input(empty, batch_size=2, is_training=True)
  null = _write_jsonl(tmp_path / "null.jsonl", [{"inputs": "1+1=", "targets": None}])
  with pytest.raises(UserError, match=r"null\.jsonl line 1 has no 'targets' field"):
    _text_input(null, batch_size=2, is_training=True)
  nested = _write_jsonl(tmp_path / "nested.jsonl", [{"inputs": {"q": "1+2"}, "targets": "3"}])
  with pytest.raises(UserError, match=r'has inputs=\{"q": "1\+2"\}, not text; write its '
                                      r"'inputs' as a string"):
    _text_input(nested, batch_size=2)
  # A number or a boolean is its JSON text, as the file shows it.
  scalars = _write_jsonl(tmp_path / "scalars.jsonl", [{"inputs": True, "targets": False},
                                                      {"inputs": 2.5e-07, "targets": 12}])
  assert _prompts_and_targets(_text_input(scalars, batch_size=2, is_training=True)) == [
      ("true", "false"), ("2.5e-07", "12")]
  # Any other extension is plain text, a line an example (the loss on all of it).
  txt = tmp_path / "qa.txt"
  txt.write_text("prompt,completion\nReverse a,b\n")
  batch = _text_input(txt, batch_size=2).get_next()
  assert [TextInput(file_pattern=str(txt)).vocab.decode(r) for r in batch["ids"]] == [
      "prompt,completion", "Reverse a,b"]


# ----------------------------------------------------------- truncation, metrics


def test_examples_longer_than_the_row_are_counted_and_logged_once(tmp_path, monkeypatch):
  from paxlike.inputs import text

  said = []
  monkeypatch.setattr(text.log, "warning", lambda msg, *a: said.append(msg % a))
  rows = [{"inputs": "x" * n, "targets": "y"} for n in (3, 40, 50, 5)]
  path = _write_jsonl(tmp_path / "d.jsonl", rows)
  _text_input(path, seq_len=16, target_len=8, batch_size=2, feature_converter="enc_dec",
              name="train")
  assert said == ["input 'train': 2 of 4 examples were longer than MAX_INPUT_LEN=16 tokens "
                  "and were cut"]
  said.clear()
  _text_input(path, seq_len=16, batch_size=2, name="lm")
  assert said == ["input 'lm': 2 of 4 examples were longer than MAX_SEQ_LEN=16 tokens and "
                  "were cut"]


def test_rouge_and_bleu_give_the_hand_checked_values():
  pytest.importorskip("rouge_score")
  pytest.importorskip("sacrebleu")
  from paxlike.inputs import text_metrics

  # LCS "the cat sat on mat": 5 of 6 words each way, F = 5/6. BLEU: clipped 1..4-gram
  # precisions 5/6, 3/5, 2/4, 1/3, equal lengths (no brevity penalty).
  got = text_metrics.compute(["rouge", "bleu"], ["the cat sat on the mat"],
                             ["the cat sat on a mat"])
  assert got["rougeL"] == pytest.approx(100 * 5 / 6, abs=1e-6)
  assert got["bleu"] == pytest.approx(100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25, abs=1e-3)


def test_metrics_without_the_extra_name_the_install_command(monkeypatch):
  import importlib.util

  from paxlike.inputs import text_metrics

  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "sacrebleu" else real(name, *a))
  with pytest.raises(UserError, match=r"pip install -e '\.\[metrics\]'"):
    text_metrics.check(["rouge", "bleu"])
  with pytest.raises(UserError, match="the decode metrics are"):
    text_metrics.check(["meteor"])


# ------------------------------------------------------- hyperparameters, names


def _configs(name: str, sets: list[str]):
  from paxlike import experiment, registry

  exp = experiment.instantiate(registry.get(name), sets)
  return experiment.build_checked(exp)


@pytest.mark.parametrize("name", ["FlanT5Base", "Llama31_8B", "LmCloudSpmd2B", "C4SpmdAdam",
                                  "FlanT5ArithmeticTiny", "ArithmeticAdditionTiny",
                                  "LlamaArithmeticTiny"])
def test_every_shipped_family_reads_train_and_eval_files(tmp_path, name):
  train = _write_jsonl(tmp_path / "train.jsonl", _reverse_rows(4, 0))
  test = _write_jsonl(tmp_path / "test.jsonl", _reverse_rows(4, 1))
  c = _configs(name, [f"TRAIN_FILES=[{train}]", f"EVAL_FILES=['{test}']",
                      "METRICS=['rouge']", "VOCAB_SIZE=32128"])
  assert [(d.name, d.is_training, d.file_pattern) for d in c.datasets] == [
      ("train", True, str(train)), ("test", False, str(test))]
  assert [(d.name, d.metrics) for d in c.decode_datasets] == [("test", ("rouge",))]
  converter = "enc_dec" if "T5" in name else "lm"
  assert {d.feature_converter for d in c.datasets} == {converter}


def test_eval_files_alone_keep_the_experiments_training_data(tmp_path):
  plain = tmp_path / "plain.txt"
  plain.write_text("some text\nmore text\n")
  c = _configs("LlamaArithmeticTiny", [f"EVAL_FILES={plain}"])
  assert [(d.name, d.generator) for d in c.datasets] == [
      ("train", "tasks.arithmetic:examples"), ("plain", "")]
  assert c.decode_datasets == []  # plain text has no targets to decode against
  chat = _write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATION}])
  asks = _write_jsonl(tmp_path / "asks.jsonl", [{"messages": CONVERSATION[:2]}])
  for path, decoded in ((chat, ["chat"]), (asks, [])):  # decoded: its last reply is a target
    c = _configs("LlamaArithmeticTiny", [f"EVAL_FILES={path}"])
    assert [d.name for d in c.decode_datasets] == decoded


def test_file_settings_without_files_are_refused_and_a_small_vocab_size_is_named(tmp_path):
  with pytest.raises(UserError, match="--set INPUT_KEY='question': nothing reads it; "
                     "TRAIN_FILES and EVAL_FILES are not set"):
    _configs("FlanT5Tiny", ["INPUT_KEY=question"])
  with pytest.raises(UserError, match="--set GENERATOR='x:y': nothing reads it; TRAIN_FILES "
                     "replaces"):
    _configs("FlanT5ArithmeticTiny", ["GENERATOR=x:y", f"TRAIN_FILES={tmp_path}/a.jsonl"])
  (tmp_path / "a.jsonl").write_text('{"inputs": "ab", "targets": "ba"}\n')
  proc = run_cli(["--exp=LlamaTiny", f"--job_log_dir={tmp_path / 'job'}", "--set",
                  f"TRAIN_FILES={tmp_path}/a.jsonl"], tmp_path)
  assert proc.returncode == 2, describe(proc)
  assert "has 259 tokens but the model's VOCAB_SIZE is 256; set VOCAB_SIZE=259" in proc.stderr
  assert not (tmp_path / "job").exists()


def test_set_none_is_taken_by_hyperparameters_that_may_be_unset():
  from paxlike import experiment, registry

  exp = experiment.instantiate(registry.get("FlanT5SubtractionFromAddition"),
                               ["INIT_FROM=None", "TRAIN_FILES=None"])
  assert exp.INIT_FROM is None and exp.TRAIN_FILES is None
  with pytest.raises(UserError, match="SCORER expects str"):
    experiment.instantiate(registry.get("FlanT5ArithmeticTiny"), ["SCORER=None"])


def test_a_class_of_ones_own_module_needs_its_module_name():
  from paxlike import registry

  with pytest.raises(UserError, match=r"--exp=your_module\.MyFineTune"):
    registry.get("MyFineTune")


# ------------------------------------------------------------------ the CLI path

# 30 steps (each evaluated) keep the last eval loss well under half the first (last/first
# measured 0.41 FlanT5Tiny, 0.40 LlamaTiny on both Pythons; 60 steps: 0.41, 0.39) with half
# the steps and evals of 60.
STEPS = 30
ARGS = ["--peak_tflops_per_device=1", "--set", "VOCAB_SIZE=264", "--set",
        f"NUM_TRAIN_STEPS={STEPS}", "--set", "EVAL_INTERVAL_STEPS=1", "--set",
        f"CHECKPOINT_EVERY_N_STEPS={STEPS}", "--set", "SUMMARY_INTERVAL_STEPS=10"]
FAMILIES = {
    "FlanT5Tiny": ["--set", "MAX_INPUT_LEN=12", "--set", "MAX_TARGET_LEN=8",
                   "--set", "PERCORE_BATCH_SIZE=16"],
    "LlamaTiny": ["--set", "MAX_SEQ_LEN=24", "--set", "PERCORE_BATCH_SIZE=16",
                  "--set", "PACK=True", "--set", "LEARNING_RATE=3e-3"],
}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
  root = tmp_path_factory.mktemp("data")
  return {"train": _write_jsonl(root / "train.jsonl", _reverse_rows(400, 0)),
          "test": _write_jsonl(root / "test.jsonl", _reverse_rows(24, 1)), "root": root}


@pytest.fixture(scope="module")
def fine_tuned(data) -> dict[str, tuple[Path, object]]:
  jobs = {}
  for exp, extra in FAMILIES.items():
    job = data["root"] / f"job_{exp}"
    proc = run_cli([f"--exp={exp}", f"--job_log_dir={job}", *ARGS, *extra,
                    "--set", f"TRAIN_FILES=[{data['train']}]",
                    "--set", f"EVAL_FILES=[{data['test']}]"], data["root"], timeout=600)
    jobs[exp] = (job, proc)
  return jobs


@pytest.mark.parametrize("exp", list(FAMILIES))
def test_a_cli_fine_tune_on_jsonl_files_lowers_the_eval_loss(fine_tuned, exp):
  job, proc = fine_tuned[exp]
  assert proc.returncode == 0, describe(proc)
  # Evaluated after every step: the first is the barely trained model's, the last the final.
  losses = [float(x) for x in re.findall(r"eval test at step \d+: loss ([\d.]+)", proc.stderr)]
  assert len(losses) == STEPS and losses[-1] < 0.5 * losses[0], losses
  assert f"test at step {STEPS}: loss" in proc.stdout and "accuracy" in proc.stdout
  rows = [json.loads(x) for x in (job / "decoder_out" / "test" /
                                  f"decode_{STEPS:08d}.jsonl").read_text().splitlines()]
  assert len(rows) == 24 and rows[0]["target"] == _reverse_rows(24, 1)[0]["targets"]
  if exp == "FlanT5Tiny":  # "reverse: abcdef" + EOS is 16 ids: the longer inputs were cut
    assert "were longer than MAX_INPUT_LEN=12 tokens and were cut" in proc.stderr


def test_infer_reads_a_file_for_an_experiment_without_decode_datasets(fine_tuned, data):
  job, proc = fine_tuned["FlanT5Tiny"]
  assert proc.returncode == 0, describe(proc)
  src = _write_jsonl(data["root"] / "ask.jsonl", [{"inputs": "reverse: abc"},
                                                  {"inputs": "reverse: hgf"}])
  # The plain FlanT5Tiny (synthetic data, no decode datasets) with the fine-tuned weights.
  proc = run_cli(["--exp=FlanT5Tiny", f"--job_log_dir={job}", "--mode=infer",
                  f"--infer_input={src}", "--decode_num_beams=2", "--set", "VOCAB_SIZE=264",
                  "--set", "MAX_INPUT_LEN=12", "--set", "MAX_TARGET_LEN=8"], data["root"])
  assert proc.returncode == 0, describe(proc)
  out = job / "infer_out" / "ask" / f"infer_{STEPS:08d}_beams2_a0.6.jsonl"
  rows = [json.loads(x) for x in out.read_text().splitlines()]
  assert [r["input"] for r in rows] == ["reverse: abc", "reverse: hgf"]
  assert all(isinstance(r["log_prob"], float) and len(r["beams"]) == 2 for r in rows)


def test_eval_files_score_imported_weights_before_fine_tuning(fine_tuned, data, tmp_path):
  job, proc = fine_tuned["LlamaTiny"]
  assert proc.returncode == 0, describe(proc)
  fresh = tmp_path / "score"
  proc = run_cli(["--exp=LlamaTiny", f"--job_log_dir={fresh}", "--mode=eval",
                  f"--init_from=paxlike:{job}", *FAMILIES["LlamaTiny"], "--set",
                  "VOCAB_SIZE=264", "--set", f"EVAL_FILES=[{data['test']}]"], tmp_path)
  assert proc.returncode == 0, describe(proc)
  assert "eval test at step 0: loss" in proc.stdout


def test_a_refused_run_creates_no_job_directory(tmp_path, data):
  job = tmp_path / "never"
  src = _write_jsonl(tmp_path / "q.jsonl", [{"inputs": "reverse: abc"}])
  proc = run_cli(["--exp=FlanT5Tiny", f"--job_log_dir={job}", "--mode=infer",
                  f"--infer_input={src}", "--set", "VOCAB_SIZE=264"], tmp_path)
  assert proc.returncode == 2 and "no checkpoint to predict with" in proc.stderr, describe(proc)
  assert not job.exists()
