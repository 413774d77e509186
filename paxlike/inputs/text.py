"""A native text input (no TensorFlow): local data files (read_rows) or a generator.

Examples are either `{"inputs": ..., "targets": ...}` pairs (the loss covers
the targets and the end-of-sequence id; decode prompts with the inputs; a
training pair without its target is refused, inputs alone are for --mode=infer) or
plain text (one example per line or a "text" field; the loss covers every
token) or, given a chat template, {"messages": [...]} conversations (the loss
covers the assistant turns; paxlike.inputs.chat). Examples longer than a row
are cut, and the input logs how many once.

LM packing (feature converter "lm", pack=True), as seqio's packing of Pax's
LM inputs: each line (its tokens and EOS) is an example; a line longer than
a row is cut into pieces of seq_len + 1 tokens overlapping by one (so every
next-token prediction is kept once), each piece an example of its own.
Examples fill rows greedily in file order. Every row carries Pax's
`segment_ids` (1, 2, ... per example, 0 = padding) and `segment_pos` (the
position within its example, restarting at 0), so a model with PACKED_INPUT
keeps each example's tokens from attending to another's: a packed row gives
its examples the logits they get unpacked. Prompt/target and chat examples
are packed the same way, whole (cut to a row), their loss weights still on
the targets or assistant turns only.

The feature converter (seqio's word) says which features a batch holds:
"lm" (decoder-only: ids, labels, weights, prompt_lens) or "enc_dec"
(encoder-decoder, T5X's names: encoder_input_tokens, decoder_input_tokens,
decoder_target_tokens, decoder_loss_weights; inputs and targets each end
with EOS, and decoder inputs are the targets shifted right behind the start
id 0).

Order is global: global example k of the stream is row `perm_e[k % N]` of
epoch e = k // N, where perm_e is a seeded shuffle (training) or the identity
(eval). Host h of H takes rows [h*B, (h+1)*B) of each global batch of H*B
rows, so the global batch at a step is the same however many hosts read it,
and two hosts never emit the same example at a step. A finite input
(repeat=False) pads its last global batch with weight-0 rows.

Packing (enc_dec with pack=True, training only): each row holds several
examples, taken greedily in stream order: a row takes consecutive global
examples while both its encoder row (seq_len) and its decoder row
(target_len) have room, then the next row starts. A global batch is H*B such
rows packed from the global example cursor where the previous batch stopped,
so it is a pure function of (seed, cursor); every host packs the whole
global batch (lengths only, cheap) and materialises its own rows. The state
saved with checkpoints holds that cursor. Packed rows add T5X's
encoder_/decoder_segment_ids (1, 2, ... per example, 0 = padding) and
encoder_/decoder_positions (restarting at 0 for each example); decoder inputs
restart with the start id 0 at each example. Eval and decode inputs
(is_training=False) ignore pack and run unpacked, padded rows, as T5X does.

`packing_efficiency(batch)` gives the fraction of a batch's token positions
that hold real tokens, for the trainer to log.

For --mode=infer, which writes each prediction beside its input as the user
wrote it, an eval or decode input (is_training=False) keeps each example's
original input (`original_input(k)`: its input_key field, a chat's messages
or its plain text, and whether its row cut its prompt), and after each
get_next() `last_examples` says which example each row holds: its index in
the data, the same on every host, or -1 (a padding row, a packed row). These
stay on the host: the batch itself, and so every compiled program, is
unchanged.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import glob
import importlib
import io
import json
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from paxlike import log
from paxlike.errors import UserError
from paxlike.inputs import chat as chat_lib
from paxlike.inputs import text_metrics
from paxlike.inputs import vocabulary as vocab_lib
from paxlike.inputs.base_input import BaseInput

Example = tuple[list[int], list[bool], int]  # tokens, loss on each token?, prompt length
Piece = tuple[list[int], list[bool]]  # the tokens of one packed segment, loss on each?


def load_generator_fn(spec: str) -> Any:
  """'module:function' -> the function."""
  module_name, _, fn_name = spec.partition(":")
  try:
    return getattr(importlib.import_module(module_name), fn_name)
  except (ImportError, AttributeError):
    raise UserError(f"{spec!r} is not an importable module:function.") from None


def load_generator(spec: str, split: str) -> Iterable[dict[str, str] | str]:
  """'module:function' -> function(split)."""
  return load_generator_fn(spec)(split)


Row = dict[str, Any] | str
# A row and where it is: "<path> line" (or "<path> item", in a JSON array) and its number.
Located = tuple[str, int, Row]
_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_JSON_KIND = {list: "an array", str: "a string", int: "a number", float: "a number",
              bool: "a boolean", type(None): "null"}
_OBJECT_HINT = '{"inputs": ..., "targets": ...} or {"text": ...}'


def read_rows(pattern: str) -> list[Located]:
  """Examples from comma-separated globs of data files, each with where it is.

  By extension: .jsonl, one JSON object a line; .json, one JSON array of
  objects (Alpaca's files), one object, or JSON Lines; .csv / .tsv, a table
  whose header row names the fields (csv.DictReader); anything else, plain
  text, an example a non-blank line. A UTF-8 byte-order mark is skipped.

  Raises:
    UserError: a path or glob matches no file, or a file is unreadable or
      malformed (naming the file and line).
  """
  patterns = [pat.strip() for pat in pattern.split(",") if pat.strip()]
  matched = {pat: glob.glob(pat) for pat in patterns}
  if not any(matched.values()):
    raise UserError(f"no data file matches {pattern!r}; check the path.")
  # One listed path that matches nothing would train on the others' rows alone.
  if gone := [pat for pat in patterns if not matched[pat]]:
    raise UserError(f"no data file matches {gone[0]!r} (of {pattern!r}); check the path.")
  # A file that two globs match is read once.
  paths = sorted({p for found in matched.values() for p in found})
  out: list[Located] = []
  for path in paths:
    try:
      # utf-8-sig: the byte-order mark Windows editors write is not part of the first row.
      with open(path, encoding="utf-8-sig", newline="") as f:
        text = f.read()
    except (OSError, UnicodeDecodeError) as e:
      raise UserError(f"cannot read data file {path} ({getattr(e, 'strerror', None) or e}).") \
          from None
    ext = os.path.splitext(path)[1].lower()
    if ext in (".csv", ".tsv"):
      out.extend(_table_rows(path, text, "," if ext == ".csv" else "\t"))
    elif ext == ".json" and (whole := _json_document(path, text)) is not None:
      out.extend(whole)
    elif ext in (".jsonl", ".json"):
      out.extend(_json_lines(path, text))
    else:
      where = f"{path} line"
      # Lines end at a newline (or CR LF), not at the other breaks splitlines() knows
      # (U+2028, a form feed), which may stand inside a line of text.
      out.extend((where, n, line.removesuffix("\r"))
                 for n, line in enumerate(text.split("\n"), 1) if line.strip())
  return out


def _json_lines(path: str, text: str) -> list[Located]:
  where, out = f"{path} line", []
  # Split at newlines only: JSON may hold U+2028 and friends unescaped, which splitlines cuts.
  for n, line in enumerate(text.split("\n"), 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise UserError(f"{path} line {n} is not valid JSON ({e.msg}); write one JSON object "
                      "per line.") from None
    if not isinstance(row, dict):
      raise UserError(f"{path} line {n} is {_JSON_KIND.get(type(row), 'not an object')}, not "
                      f"a JSON object; write one object per line, such as {_OBJECT_HINT}.")
    out.append((where, n, row))
  return out


def _json_document(path: str, text: str) -> list[Located] | None:
  """A .json file's rows when the whole file is one JSON value; None for JSON Lines."""
  start = _JSON_SPACE.match(text).end()
  if start == len(text):
    return []
  try:
    value, end = json.JSONDecoder().raw_decode(text, start)
  except json.JSONDecodeError as e:
    raise UserError(f"{path} line {e.lineno} is not valid JSON ({e.msg}); write one JSON "
                    "array of objects, or one object per line.") from None
  if _JSON_SPACE.match(text, end).end() != len(text):
    return None  # more values follow the first: JSON Lines
  if isinstance(value, dict):
    return [(f"{path} line", text.count("\n", 0, start) + 1, value)]
  if not isinstance(value, list):
    raise UserError(f"{path} holds {_JSON_KIND.get(type(value), 'a JSON value')}, not JSON "
                    f"objects; write one JSON array of objects such as {_OBJECT_HINT}.")
  for n, row in enumerate(value, 1):
    if not isinstance(row, dict):
      raise UserError(f"{path} item {n} of its JSON array is "
                      f"{_JSON_KIND.get(type(row), 'not an object')}, not a JSON object; make "
                      f"every item an object such as {_OBJECT_HINT}.")
  where = f"{path} item"
  return [(where, n, row) for n, row in enumerate(value, 1)]


def _table_rows(path: str, text: str, delimiter: str) -> list[Located]:
  """A .csv / .tsv file's rows: dicts of its header row's fields."""
  # A TSV cell holds any text, quotes included (no quoting, as spreadsheets write it).
  reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter,
                          quoting=csv.QUOTE_MINIMAL if delimiter == "," else csv.QUOTE_NONE)
  where, out = f"{path} line", []
  try:
    for row in reader:
      if None in row:  # DictReader's key for the cells past the header's
        fix = ("quote the cells that hold a comma" if delimiter == "," else
               "a .tsv cell cannot hold a tab (its quotes are text): write the file as .csv, "
               "quoting that cell")
        raise UserError(f"{path} line {reader.line_num} has more cells than its header's "
                        f"{len(reader.fieldnames or ())}; {fix}.")
      # A short row's missing cells (None) and empty cells are absent fields, not text.
      out.append((where, reader.line_num, {k: v for k, v in row.items() if v}))
  except csv.Error as e:
    raise UserError(f"{path} line {reader.line_num} is not a valid table row ({e}); fix the "
                    "quoting there.") from None
  return out


def lacks_target(row: Any, input_key: str, target_key: str) -> bool:
  """Whether a row is an (input, target) row without its target (chat and text rows have none)."""
  return (isinstance(row, dict) and "messages" not in row and input_key in row
          and row.get(target_key) is None)


def _original(row: Row, input_key: str, text_key: str) -> Any:
  """A row's input as its data holds it, the fields TextInput prompts with in its order: a
  chat's messages, the input_key field, or the plain text (the text_key field, or the line)."""
  if isinstance(row, dict) and "messages" in row:
    return row["messages"]
  if isinstance(row, dict) and input_key in row:
    return row[input_key]
  return row.get(text_key, row) if isinstance(row, dict) else row


ENC_DEC_TOKENS = ("encoder_input_tokens", "decoder_target_tokens")
ENC_DEC_WEIGHTS = "decoder_loss_weights"


def packing_efficiency(batch: dict[str, np.ndarray], pad_id: int = 0) -> float:
  """The fraction of a batch's token positions that hold a real token of a real example.

  Counts the positions of encoder_input_tokens and decoder_target_tokens
  together (an LM batch: of labels) that a segment holds, where the batch has
  segment ids (packed rows), else the ids other than pad_id. Decoder
  *targets*, not inputs: decoder inputs start each example with the start id
  0, which is real work but equal to the pad id. A row whose loss weights are
  all 0 (the padding rows that end a finite input) counts as padding
  throughout.

  Args:
    batch: a batch as get_next() returns it (numpy arrays, batch leading).
    pad_id: the vocabulary's padding id (a tokenizer without a pad token pads
      with its EOS).

  Returns:
    A number in [0, 1]; 0.0 for an empty batch.
  """
  if all(k in batch for k in ENC_DEC_TOKENS):
    keys, weights = ENC_DEC_TOKENS, batch.get(ENC_DEC_WEIGHTS)
    segments = ("encoder_segment_ids", "decoder_segment_ids")
  elif "labels" in batch:
    keys, weights, segments = ("labels",), batch.get("weights"), ("segment_ids",)
  else:
    raise ValueError("packing_efficiency needs encoder_input_tokens and decoder_target_tokens "
                     f"(or labels); the batch has {sorted(batch)}.")
  live = None if weights is None else np.asarray(weights).reshape(len(weights), -1).any(axis=1)
  real = total = 0
  for k, segment in zip(keys, segments, strict=True):
    tokens = np.asarray(batch[k])
    nonpad = np.asarray(batch[segment]) > 0 if segment in batch else tokens != pad_id
    if live is not None:
      nonpad &= live.reshape((-1,) + (1,) * (tokens.ndim - 1))
    real += int(nonpad.sum())
    total += tokens.size
  return real / total if total else 0.0


def resolve_vocabularies(cfgs: Sequence[Any], source_dir: str | None,
                         job_log_dir: str | None, tokenizerless_source: str | None = None
                         ) -> None:
  """Sets the concrete vocabulary on each TextInput config whose spec is 'hf' or None.

  See paxlike.inputs.vocabulary.resolve; the configs are changed in place, so the
  run's model_params.txt shows the tokenizer it read. tokenizerless_source: the
  INIT_FROM of a run whose initial weights come with no tokenizer (a T5X
  checkpoint), where 'hf' or None has nothing to read.

  Raises:
    UserError: an input's vocabulary is not the tokenizer the job recorded, or
      names the tokenizer of a source that has none.
  """
  import fiddle as fdl

  for cfg in cfgs:
    fn = fdl.get_callable(cfg) if isinstance(cfg, fdl.Buildable) else None
    if isinstance(fn, type) and issubclass(fn, TextInput):
      if (tokenizerless_source and cfg.vocabulary in (None, vocab_lib.HF)
          and vocab_lib.recorded(job_log_dir) is None):
        raise UserError(f"input {cfg.name!r} reads text with the tokenizer of INIT_FROM, but "
                        f"{tokenizerless_source} holds none; set VOCABULARY to the model's "
                        "SentencePiece file (T5X's sentencepiece.model) or a Hugging Face "
                        "directory with its tokenizer.")
      cfg.vocabulary = vocab_lib.resolve(cfg.vocabulary, source_dir, job_log_dir)
      vocab_lib.check_recorded(cfg.vocabulary, job_log_dir,
                               f"the vocabulary {cfg.vocabulary} of input {cfg.name!r}")
      where = cfg.vocabulary if os.path.isdir(cfg.vocabulary or "") else os.path.dirname(
          cfg.vocabulary or "")
      if not cfg.chat_template_dir and chat_lib.has_template(where):
        cfg.chat_template_dir = where  # chat rows render with the tokenizer's own template


@dataclasses.dataclass
class TextInput(BaseInput):
  """See the module docstring. Exactly one of file_pattern and generator is set."""

  file_pattern: str = ""
  generator: str = ""  # "module:function"; called with `split`
  split: str = "train"
  # "byte", a tokenizer path, or "hf" / None: the run's Hugging Face directory's
  # (paxlike.inputs.vocabulary; main resolves those two before building, None -> "byte")
  vocabulary: str | None = None
  seq_len: int = 64
  pack: bool = False  # lm: plain-text lines into blocks; enc_dec: several examples per row
  shuffle: bool = True
  input_key: str = "inputs"
  target_key: str = "targets"
  text_key: str = "text"
  scorer: str = ""  # "module:function(targets, predictions) -> metrics" for decode
  feature_converter: str = "lm"  # or "enc_dec"; see the module docstring
  target_len: int = 0  # enc_dec: decoder positions (seq_len is then the encoder's)
  metrics: tuple[str, ...] = ()  # decode metrics besides exact match: "rouge", "bleu"
  chat_template_dir: str = ""  # a Hugging Face directory whose chat template renders chat rows
  position_key: str = "segment_pos"  # packed LM rows' positions (the Llama family: "positions")

  def __post_init__(self) -> None:
    super().__post_init__()
    if bool(self.file_pattern) == bool(self.generator):
      raise UserError(f"input {self.name!r}: set exactly one of file_pattern and generator.")
    if self.feature_converter not in ("lm", "enc_dec"):
      raise UserError(f"input {self.name!r}: feature_converter {self.feature_converter!r} is "
                      "not 'lm' or 'enc_dec'.")
    if self.feature_converter == "enc_dec" and self.target_len <= 0:
      raise UserError(f"input {self.name!r}: the enc_dec feature converter needs "
                      "target_len > 0 (MAX_TARGET_LEN).")
    self.metrics = text_metrics.check(self.metrics)
    self.vocab = vocab_lib.get(self.vocabulary)
    # A tokenizer that starts sequences with BOS (Llama's) gets it on every example.
    self._bos = [self.vocab.bos_id] if self.vocab.add_bos else []
    located = read_rows(self.file_pattern) if self.file_pattern else None
    raw = ([row for _, _, row in located] if located is not None
           else list(load_generator(self.generator, self.split)))
    self._check_chats(raw, located)
    if self.is_training:
      self._check_targets(raw, located)
    # Whether each example's row cut its prompt (the feature builders set it).
    self._prompt_cut = np.zeros(len(raw), bool)
    if self.feature_converter == "enc_dec":
      self._features, self._weight_key = self._enc_dec_features(raw), ENC_DEC_WEIGHTS
    else:
      self._features, self._weight_key = self._lm_features(raw), "weights"
    if not len(self._features[self._weight_key]):
      raise UserError(f"input {self.name!r} has no examples.")
    # Row k of the feature table is example k (raw[k]), except in packed LM rows.
    self._rows_are_examples = not (self.feature_converter == "lm" and self.pack)
    # What --mode=infer writes beside each prediction; a training input keeps no copy.
    self._originals = ([_original(ex, self.input_key, self.text_key) for ex in raw]
                       if self._rows_are_examples and not self.is_training else None)
    self._last_examples = np.full(0, -1, np.int32)
    self._orders: dict[int, np.ndarray] = {}
    self._flat_cache: dict[str, np.ndarray] = {}
    self._num_packed_batches: int | None = None
    self._index = 0  # global batches read
    # The global example the next global batch starts at: what a checkpoint records, so a
    # run resumed with another global batch neither skips nor repeats examples.
    self._cursor = 0

  @property
  def packed(self) -> bool:
    """Whether rows hold several examples: enc_dec training with pack=True (eval never packs)."""
    return self.feature_converter == "enc_dec" and self.pack and self.is_training

  @property
  def num_examples(self) -> int:
    return len(self._features[self._weight_key])

  @property
  def last_examples(self) -> np.ndarray:
    """[batch_size] int32: the example each row of the batch get_next() last returned
    holds, as its index in the data (file or generator order, the same on every host),
    or -1 for a row that holds no one example (the padding rows that end a finite input,
    a packed row)."""
    return self._last_examples

  def original_input(self, example: int) -> tuple[Any, bool] | None:
    """Example `example`'s input as its data holds it (its input_key field, a chat's
    messages, or its plain text) and whether its row cut its prompt; None for -1 and
    where the input keeps none (a training input, packed LM rows)."""
    if self._originals is None or example < 0:
      return None
    return self._originals[example], bool(self._prompt_cut[example])

  def _where(self, i: int, located: list[Located] | None) -> str:
    """Where example i is: its file and line, or its index in the generator."""
    return (f"{located[i][0]} {located[i][1]}" if located is not None
            else f"example {i} of {self.generator}")

  def _check_chats(self, raw: Sequence[Any], located: list[Located] | None) -> None:
    """Refuses a chat row whose messages are not role/content objects, naming it."""
    for i, ex in enumerate(raw):
      if isinstance(ex, dict) and "messages" in ex and (
          problem := chat_lib.messages_problem(ex["messages"])):
        raise UserError(f"input {self.name!r}: {self._where(i, located)}: {problem}; write "
                        '\'messages\' as a list of {"role": ..., "content": "text"} objects.')

  def _check_targets(self, raw: Sequence[Any], located: list[Located] | None) -> None:
    """Refuses a training row with an input but no target: it would train on EOS alone.

    (Rows of inputs alone are what --mode=infer reads; FilesDataset checks EVAL_FILES.)
    """
    for i, ex in enumerate(raw):
      if isinstance(ex, dict) and isinstance(ex.get("messages"), list) and not any(
          isinstance(m, dict) and m.get("role") == "assistant" for m in ex["messages"]):
        raise UserError(f"input {self.name!r}: {self._where(i, located)} is a conversation "
                        "without an assistant turn, so it has nothing to train on "
                        "(conversations that ask for a reply are for --mode=infer "
                        "--infer_input).")
      if lacks_target(ex, self.input_key, self.target_key):
        raise UserError(f"input {self.name!r}: {self._where(i, located)} has no "
                        f"{self.target_key!r} field (its fields: {sorted(ex)}), so it has no "
                        "target to train on; set TARGET_KEY to the field that holds the "
                        "target.")

  def _lm_features(self, raw: Sequence[Any]) -> dict[str, np.ndarray]:
    examples, pieces = self._lm_examples(raw)
    if not self.pack:
      return self._lm_rows(examples)
    return self._pack_lm_pieces(pieces + [(seq[:self.seq_len + 1], flags[:self.seq_len + 1])
                                          for seq, flags, _ in examples])

  def _lm_examples(self, raw: Sequence[Any]) -> tuple[list[Example], list[Piece]]:
    """Each example's tokens, loss flags and prompt length; with pack, plain-text lines go
    to the returned pieces instead (cut into rows, see the module docstring)."""
    n = self.seq_len + 1
    examples, pieces, cut = [], [], 0
    for k, ex in enumerate(raw):
      seq, flags, prompt_len = self._example_tokens(ex)
      plain = prompt_len is None
      if plain and self.pack:
        pieces.extend((seq[i:i + n], flags[i:i + n]) for i in range(0, len(seq) - 1, n - 1))
        continue
      cut += len(seq) > n
      self._prompt_cut[k] = not plain and prompt_len > self.seq_len
      examples.append((seq, flags, min(prompt_len or 0, self.seq_len)))
    self._log_cut(cut, len(raw), f"were longer than MAX_SEQ_LEN={self.seq_len} tokens")
    return examples, pieces

  def _example_tokens(self, ex: Any) -> tuple[list[int], list[bool], int | None]:
    """(tokens, whether the loss covers each token, prompt length) of one example.

    A {"messages": [...]} row is rendered with the chat template (loss on the
    assistant turns; the prompt, what decoding continues, runs to the last
    assistant turn, or to the end when the user has the last word), an
    (inputs, targets) row puts the loss on the targets and EOS, and plain
    text (a line, or the text_key field; prompt length None) everywhere.
    """
    if isinstance(ex, dict) and "messages" in ex:
      seq: list[int] = []
      flags: list[bool] = []
      last_turn = 0
      pieces = self._chat().pieces(ex["messages"])
      # Tokenized whole, as transformers tokenizes the rendered chat, then split by piece.
      for (_, weighted), ids in zip(pieces, vocab_lib.encode_pieces(
          self.vocab, [text for text, _ in pieces]), strict=True):
        last_turn = len(seq) if weighted else last_turn
        seq += ids
        flags += [weighted] * len(ids)
      if chat_lib.ends_on_reply(ex["messages"]):
        return seq, flags, last_turn
      # Asks for a reply. Where no earlier assistant turn carries loss, the generation
      # prompt's last token carries a weight, so that --mode=infer (and an eval) counts the
      # row as an example; never in training, which would learn a template token.
      if seq and not self.is_training and not any(flags):
        flags[-1] = True
      return seq, flags, len(seq)
    if isinstance(ex, dict) and self.input_key in ex:
      prompt = self._bos + self.vocab.encode(self._text(ex, self.input_key))
      target = self.vocab.encode(self._text(ex, self.target_key)) + [self.vocab.eos_id]
      return prompt + target, [False] * len(prompt) + [True] * len(target), len(prompt)
    if isinstance(ex, dict) and self.text_key not in ex:
      raise UserError(f"input {self.name!r}: an example of {self.file_pattern or self.generator} "
                      f"has none of the fields {self.input_key!r}, {self.text_key!r} or "
                      f"'messages' (its fields: {sorted(ex)}); set INPUT_KEY / TARGET_KEY to "
                      "your field names.")
    text = self._text(ex, self.text_key) if isinstance(ex, dict) else str(ex)
    seq = self._bos + self.vocab.encode(text) + [self.vocab.eos_id]
    return seq, [True] * len(seq), None

  def _text(self, ex: dict[str, Any], key: str) -> str:
    """A row's field as text ("" when absent): a string, or a number or boolean as JSON
    writes it (true, not Python's True).

    Raises:
      UserError: a null, an object or an array, which would train on its Python repr.
    """
    value = ex.get(key, "")
    if value is None or isinstance(value, (dict, list)):
      shown = json.dumps(value)
      shown = shown if len(shown) <= 60 else shown[:57] + "..."
      raise UserError(f"input {self.name!r}: a row of {self.file_pattern or self.generator} has "
                      f"{key}={shown}, not text; write its {key!r} as a string.")
    return value if isinstance(value, str) else json.dumps(value)

  def _chat(self) -> Any:
    if not self.chat_template_dir:
      raise UserError(f"input {self.name!r} has chat rows ({{\"messages\": ...}}) but no "
                      "chat template; set INIT_FROM=hf:DIR (or VOCABULARY to the Hugging Face "
                      "checkpoint directory) so its tokenizer_config.json can be read.")
    return chat_lib.load(self.chat_template_dir)

  def _log_cut(self, cut: int, total: int, what: str) -> None:
    if cut:
      log.warning("input %r: %d of %d examples %s and were cut", self.name, cut, total,
                  what)

  def _lm_rows(self, examples: list[Example]) -> dict[str, np.ndarray]:
    """One example a row: seq_len + 1 tokens (padded), cut to the row."""
    n = self.seq_len + 1
    shape = (len(examples), self.seq_len)
    tokens = np.full((len(examples), n), self.vocab.pad_id, np.int32)
    weights = np.zeros(shape, np.float32)
    for r, (seq, flags, _) in enumerate(examples):
      seq, flags = seq[:n], flags[:n]
      tokens[r, :len(seq)] = seq
      weights[r, :len(seq) - 1] = flags[1:]  # label j is token j + 1
    return {"ids": tokens[:, :-1], "labels": tokens[:, 1:], "weights": weights,
            "prompt_lens": np.asarray([e[2] for e in examples], np.int32).reshape(-1)}

  def _pack_lm_pieces(self, pieces: list[Piece]) -> dict[str, np.ndarray]:
    """Token pieces (at most seq_len + 1 each) -> greedily packed LM rows with segments."""
    rows: list[list[Piece]] = []
    used = self.seq_len  # positions taken in the last row; a full one starts the first
    for piece in pieces:
      if used + len(piece[0]) - 1 > self.seq_len:
        rows.append([])
        used = 0
      rows[-1].append(piece)
      used += len(piece[0]) - 1
    shape = (len(rows), self.seq_len)
    out = {"ids": np.full(shape, self.vocab.pad_id, np.int32),
           "labels": np.full(shape, self.vocab.pad_id, np.int32),
           "weights": np.zeros(shape, np.float32), "prompt_lens": np.zeros(len(rows), np.int32),
           "segment_ids": np.zeros(shape, np.int32), self.position_key: np.zeros(shape, np.int32)}
    for r, row in enumerate(rows):
      col = 0
      for segment, (piece, flags) in enumerate(row, 1):
        m, span = len(piece) - 1, slice(col, col + len(piece) - 1)
        out["ids"][r, span], out["labels"][r, span] = piece[:-1], piece[1:]
        out["weights"][r, span] = flags[1:]
        out["segment_ids"][r, span] = segment
        out[self.position_key][r, span] = np.arange(m)
        col += m
    return out

  def _enc_dec_features(self, raw: Sequence[Any]) -> dict[str, np.ndarray]:
    """(inputs, targets) pairs -> T5X's encoder-decoder features, padded, unpacked.

    Also records each example's encoder and decoder length (self._enc_lens,
    self._dec_lens): packing needs them, and the pad id cannot tell them
    (a SentencePiece model without a pad piece uses 0 for a real token).
    """
    n = len(raw)
    enc = np.zeros((n, self.seq_len), np.int32)
    dec_in = np.zeros((n, self.target_len), np.int32)
    dec_tgt = np.zeros((n, self.target_len), np.int32)
    wts = np.zeros((n, self.target_len), np.float32)
    self._enc_lens = np.zeros(n, np.int64)
    self._dec_lens = np.zeros(n, np.int64)
    where = self.file_pattern or self.generator
    cut_in = cut_out = 0
    for i, ex in enumerate(raw):
      if not isinstance(ex, dict) or self.input_key not in ex:
        shown = repr(ex) if len(repr(ex)) <= 80 else repr(ex)[:77] + "..."
        raise UserError(f"input {self.name!r}: example {i} of {where} has no "
                        f"{self.input_key!r} field: {shown}; the enc_dec feature converter "
                        "needs (inputs, targets) pairs (set INPUT_KEY / TARGET_KEY, the input's "
                        "input_key / target_key, to your field names).")
      x = self._bos + self.vocab.encode(self._text(ex, self.input_key))
      y = self.vocab.encode(self._text(ex, self.target_key))
      self._prompt_cut[i] = len(x) >= self.seq_len  # no room for it and its EOS
      cut_in, cut_out = cut_in + self._prompt_cut[i], cut_out + (len(y) >= self.target_len)
      # Cut, then the EOS (seqio's append_eos_after_trim, as T5X trains): a cut example
      # still ends, and the model learns to end a long target.
      x = x[:self.seq_len - 1] + [self.vocab.eos_id]
      y = y[:self.target_len - 1] + [self.vocab.eos_id]
      enc[i, :len(x)] = x
      dec_tgt[i, :len(y)] = y
      # The whole padded row shifted right behind the start id 0, as seqio, T5X and
      # transformers do: the EOS lands on the first padding position (loss weight 0).
      dec_in[i, 1:] = dec_tgt[i, :-1]
      wts[i, :len(y)] = 1.0
      self._enc_lens[i], self._dec_lens[i] = len(x), len(y)
    self._log_cut(cut_in, n, f"were longer than MAX_INPUT_LEN={self.seq_len} tokens")
    self._log_cut(cut_out, n, f"had targets longer than MAX_TARGET_LEN={self.target_len} tokens")
    return {"encoder_input_tokens": enc, "decoder_input_tokens": dec_in,
            "decoder_target_tokens": dec_tgt, "decoder_loss_weights": wts}

  def _order(self, epoch: int) -> np.ndarray:
    """Epoch `epoch`'s permutation of the examples (cached: a stream needs one or two)."""
    if not (self.shuffle and self.is_training):
      return np.arange(self.num_examples)
    if epoch not in self._orders:
      if len(self._orders) >= 2:
        self._orders.pop(min(self._orders))
      self._orders[epoch] = np.random.default_rng([self.seed, epoch]).permutation(
          self.num_examples)
    return self._orders[epoch]

  def _rows(self, ks: np.ndarray) -> np.ndarray:
    """Global example indices -> rows of the example table."""
    epochs = ks // self.num_examples
    rows = np.empty(len(ks), np.int64)
    for e in np.unique(epochs):
      sel = epochs == e
      rows[sel] = self._order(int(e))[ks[sel] % self.num_examples]
    return rows

  def num_batches(self) -> int | None:
    """Batches per epoch of a finite input (the same on every host); None if repeating."""
    if self.repeat:
      return None
    if not self.packed:
      return -(-self.num_examples // self.get_global_batch_size())
    if self._num_packed_batches is None:  # how many global batches the epoch packs into
      count, cursor = 0, 0
      while cursor < self.num_examples:
        cursor = self._pack_plan(cursor)[-1]
        count += 1
      self._num_packed_batches = count
    return self._num_packed_batches

  @functools.cached_property
  def _mean_fill(self) -> int:
    """About how many examples a packed row holds (the mean lengths, both sides)."""
    return int(min(self.seq_len / self._enc_lens.mean(), self.target_len / self._dec_lens.mean()))

  def _pack_plan(self, cursor: int) -> np.ndarray:
    """Greedy packing of one global batch from global example `cursor`.

    Returns:
      [G + 1] global example indices: row r of the global batch holds
      examples [plan[r], plan[r + 1]); plan[-1] is the next batch's cursor.
      A finite input's rows past the end of its epoch are empty.
    """
    g = self.get_global_batch_size()
    # Every example has at least one token on each side, so a row holds at most
    # `per_row`; read twice the rows' average fill first, and more only if a row
    # could reach the end of what was read.
    per_row = min(self.seq_len, self.target_len)
    window = g * min(per_row, 2 * self._mean_fill + 1)
    while True:
      end = cursor + window
      if not self.repeat:
        end = min(end, self.num_examples)
      rows = self._rows(np.arange(cursor, end))
      cum_enc = np.concatenate([[0], np.cumsum(self._enc_lens[rows])])
      cum_dec = np.concatenate([[0], np.cumsum(self._dec_lens[rows])])
      plan = np.empty(g + 1, np.int64)
      plan[0] = at = 0  # offsets into `rows` here; global indices on return
      for r in range(g):
        # The row takes examples at..stop-1: the longest prefix that fits on both sides.
        stop = min(np.searchsorted(cum_enc, cum_enc[at] + self.seq_len, side="right"),
                   np.searchsorted(cum_dec, cum_dec[at] + self.target_len, side="right")) - 1
        plan[r + 1] = at = stop
      if at < len(rows) or window >= g * per_row or (
          not self.repeat and end == self.num_examples):
        break
      window = min(2 * window, g * per_row)
    return plan + cursor

  def _packed_rows(self, plan: np.ndarray, first_row: int) -> dict[str, np.ndarray]:
    """This host's batch_size packed rows, starting at global row first_row of `plan`."""
    b = self.batch_size
    bounds = plan[first_row:first_row + b + 1]
    examples = self._rows(np.arange(bounds[0], bounds[-1]))
    row_first = bounds[:-1] - bounds[0]  # index (into examples) of each row's first example
    counts = np.diff(bounds)
    row_of = np.repeat(np.arange(b), counts)
    segment_of = np.arange(len(examples)) - row_first[row_of] + 1
    out: dict[str, np.ndarray] = {}
    for side, lens, n, keys in (
        ("encoder", self._enc_lens[examples], self.seq_len, ("encoder_input_tokens",)),
        ("decoder", self._dec_lens[examples], self.target_len,
         ("decoder_input_tokens", "decoder_target_tokens"))):
      starts = np.concatenate([[0], np.cumsum(lens)])  # in the concatenated token stream
      col_start = starts[:-1] - starts[row_first][row_of]  # each example's column in its row
      positions = np.arange(starts[-1]) - np.repeat(starts[:-1], lens)
      tok_rows, tok_cols = np.repeat(row_of, lens), np.repeat(col_start, lens) + positions
      # Gather from the unpadded token stream: a padded row is mostly padding when packing.
      src = np.repeat(self._flat_starts(side)[examples] - starts[:-1], lens) + np.arange(
          starts[-1])
      for k, values in [*((k, self._flat(k)[src]) for k in keys),
                        (f"{side}_segment_ids", np.repeat(segment_of, lens)),
                        (f"{side}_positions", positions)]:
        out[k] = np.zeros((b, n), np.int32)
        out[k][tok_rows, tok_cols] = values
    out[ENC_DEC_WEIGHTS] = (out["decoder_segment_ids"] > 0).astype(np.float32)
    return out

  def _flat_starts(self, side: str) -> np.ndarray:
    """Where each example's tokens start in the unpadded stream of one side's features."""
    key = f"{side}:starts"
    if key not in self._flat_cache:
      lens = self._enc_lens if side == "encoder" else self._dec_lens
      self._flat_cache[key] = np.concatenate([[0], np.cumsum(lens)[:-1]])
    return self._flat_cache[key]

  def _flat(self, key: str) -> np.ndarray:
    """Feature `key`'s real tokens, unpadded, example after example (built once)."""
    if key not in self._flat_cache:
      lens = self._enc_lens if key.startswith("encoder") else self._dec_lens
      table = self._features[key]
      self._flat_cache[key] = table[np.arange(table.shape[1])[None, :] < lens[:, None]]
    return self._flat_cache[key]

  def get_next(self) -> dict[str, np.ndarray]:
    num_hosts, host = self.hosts
    g = self.get_global_batch_size()
    if self.packed:
      if not self.repeat and self._cursor >= self.num_examples:
        raise StopIteration
      plan = self._pack_plan(self._cursor)
      self._index, self._cursor = self._index + 1, int(plan[-1])
      self._last_examples = np.full(self.batch_size, -1, np.int32)
      return self._packed_rows(plan, host * self.batch_size)
    if not self.repeat and self._cursor >= self.num_examples:
      raise StopIteration
    first = self._cursor + host * self.batch_size
    ks = np.arange(first, first + self.batch_size)
    valid = ks < self.num_examples if not self.repeat else np.ones_like(ks, bool)
    rows = self._rows(ks)
    self._index, self._cursor = self._index + 1, self._cursor + g
    del num_hosts
    batch = {k: v[rows] for k, v in self._features.items()}
    batch[self._weight_key] = (batch[self._weight_key] * valid[:, None]).astype(np.float32)
    self._last_examples = np.where(valid & self._rows_are_examples, rows, -1).astype(np.int32)
    return batch

  def reset(self) -> None:
    self._index, self._cursor = 0, 0

  def peek_specs(self) -> dict[str, np.ndarray]:
    """The first batch, read in place with the position put back: the generic peek
    deep-copies the input, and with it every tokenized example of the user's files."""
    position = self._index, self._cursor, self._last_examples
    self._index, self._cursor = 0, 0
    try:
      return self.get_next()
    finally:
      self._index, self._cursor, self._last_examples = position

  def get_state(self) -> dict[str, Any]:
    return {"index": self._index, "cursor": self._cursor}

  def set_state(self, state: dict[str, Any]) -> None:
    self._index = int(state.get("index", 0))
    if "cursor" in state:
      self._cursor = int(state["cursor"])
    elif not self.packed:  # a state from before the cursor: batches of this run's size
      self._cursor = self._index * self.get_global_batch_size()
    else:  # a state saved unpacked before the cursor: replay the packing up to its batch
      self._cursor = 0
      for _ in range(self._index):
        self._cursor = int(self._pack_plan(self._cursor)[-1])

  def packing_efficiency(self, batch: dict[str, np.ndarray]) -> float | None:
    return packing_efficiency(batch, self.vocab.pad_id)

  def score(self, targets: list[str], predictions: list[str]) -> dict[str, float]:
    metrics = (dict(load_generator_fn(self.scorer)(targets, predictions)) if self.scorer
               else super().score(targets, predictions))
    return {**metrics, **text_metrics.compute(self.metrics, targets, predictions)}

  def ids_to_strings(self, ids: np.ndarray, lengths: np.ndarray | None = None) -> list[str]:
    """Detokenises each row (up to its length, or to end-of-sequence)."""
    out = []
    for i, row in enumerate(np.asarray(ids)):
      if lengths is not None:
        row = row[:int(lengths[i])]
      out.append(self.vocab.decode(row))
    return out
