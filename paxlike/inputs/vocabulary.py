"""Vocabularies for the native text input: bytes, SentencePiece, or a Hugging Face tokenizer.

A vocabulary spec (TextInput.vocabulary, an experiment's VOCABULARY) is one of

  "byte"        UTF-8 bytes, seqio's ByteVocabulary ids: 0 = padding, 1 = end of
                sequence, 2 = unknown, byte b -> b + 3;
  a path        a SentencePiece model (spiece.model, tokenizer.model, *.model),
                a `tokenizers` tokenizer.json, or a directory holding one (a
                Hugging Face save_pretrained directory: tokenizer.json is preferred
                to spiece.model, as transformers' AutoTokenizer prefers it);
  "hf"          the tokenizer of the run's Hugging Face directory (INIT_FROM=hf:DIR
                or --init_from); see resolve();
  None          "hf" when the run has such a directory (or its job_log_dir records
                a vocabulary), else "byte".

A training run copies its file vocabulary into job_log_dir/vocabulary/ (record());
every later run of the job (eval, decode, infer, export, a resumed training run) reads
it from there with no setting repeated (for_job, resolve), and a VOCABULARY or
INIT_FROM tokenizer that gives other ids is refused (check_recorded).

Special ids of a file vocabulary come from the files beside it, as
transformers reads them: tokenizer_config.json and special_tokens_map.json name
the pad / eos / bos / unk tokens (and T5's `<extra_id_N>` sentinels, `extra_ids`);
config.json and generation_config.json give ids where no token is named; the
SentencePiece model's own ids come last. A vocabulary without a pad token pads
with its EOS id (the usual `tokenizer.pad_token = tokenizer.eos_token`).

Every vocabulary has pad_id, eos_id, bos_id (None without one), unk_id,
vocab_size, add_bos, encode and decode:

  * encode(text) is the text's ids alone, with no BOS or EOS (transformers'
    `encode(text, add_special_tokens=False)`); special tokens written in the
    text (`<extra_id_0>`) become their ids.
  * add_bos says whether the tokenizer starts a sequence with its BOS (Llama's
    tokenizer.json post-processor adds <|begin_of_text|>; tokenizer_config.json's
    add_bos_token wins where it is set). TextInput prepends it to every
    example (the LM's prompt and text, the encoder input), and appends eos_id.
  * decode(ids) stops at the first EOS and drops special and padding ids, as
    transformers' `decode(skip_special_tokens=True)` does (unknown ids too,
    since transformers counts <unk> as special); ids past the tokenizer (a
    table padded to VOCAB_SIZE) show nothing.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import re
import shutil
from collections.abc import Sequence
from typing import Any

from paxlike.errors import UserError

PAD_ID = 0
EOS_ID = 1
HF = "hf"
TOKENIZER_JSON = "tokenizer.json"
SP_FILES = ("spiece.model", "tokenizer.model")
# Files beside a tokenizer that say how transformers reads it (and renders chat rows);
# copied with it.
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                "config.json", "generation_config.json", "chat_template.jinja")
JOB_DIR = "vocabulary"  # job_log_dir/vocabulary: the run's tokenizer files (see record())


class ByteVocabulary:
  """UTF-8 bytes shifted by 3 special ids."""

  offset = 3
  pad_id = PAD_ID
  eos_id = EOS_ID
  bos_id = None
  unk_id = 2
  add_bos = False
  files: dict[str, str] = {}
  spec = "byte"

  @property
  def vocab_size(self) -> int:
    return 256 + self.offset

  def encode(self, text: str) -> list[int]:
    return [b + self.offset for b in text.encode("utf-8")]

  def decode(self, ids: Sequence[int]) -> str:
    out = bytearray()
    for i in ids:
      i = int(i)
      if i == self.eos_id:
        break
      if self.offset <= i < self.vocab_size:  # ids past the bytes (a padded vocab) show nothing
        out.append(i - self.offset)
    return out.decode("utf-8", errors="replace")


# --------------------------------------------------------- the files beside a tokenizer


def _read_json(path: str) -> dict[str, Any]:
  if not os.path.isfile(path):
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      out = json.load(f)
  except (OSError, ValueError) as e:
    raise UserError(f"{path} is not readable JSON ({e}); re-save the tokenizer.") from None
  return out if isinstance(out, dict) else {}


def _content(token: Any) -> str | None:
  """A token as tokenizer_config.json writes it: a string or {"content": ...}."""
  if isinstance(token, dict):
    token = token.get("content")
  return token if isinstance(token, str) and token else None


def _first_id(value: Any) -> int | None:
  if isinstance(value, list):
    value = value[0] if value else None
  return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Configs:
  """tokenizer_config.json, special_tokens_map.json, config.json and
  generation_config.json of the directory a tokenizer file lies in."""

  def __init__(self, directory: str) -> None:
    self.directory = directory
    self.tok = _read_json(os.path.join(directory, "tokenizer_config.json"))
    self.special = _read_json(os.path.join(directory, "special_tokens_map.json"))
    self.model = _read_json(os.path.join(directory, "config.json"))
    self.generation = _read_json(os.path.join(directory, "generation_config.json"))

  def token(self, name: str) -> str | None:
    """The content of pad_token, eos_token, ... as tokenizer_config names it."""
    return _content(self.tok.get(name)) or _content(self.special.get(name))

  def config_id(self, name: str) -> int | None:
    """eos_token_id, pad_token_id, ... from generation_config.json, then config.json."""
    for source in (self.generation, self.model):
      if (value := _first_id(source.get(name))) is not None:
        return value
    return None

  def added_tokens(self) -> dict[str, tuple[int, bool]]:
    """tokenizer_config.json's added_tokens_decoder: content -> (id, special)."""
    out = {}
    for key, tok in (self.tok.get("added_tokens_decoder") or {}).items():
      if isinstance(tok, dict) and _content(tok) and str(key).isdigit():
        out[_content(tok)] = (int(key), bool(tok.get("special", False)))
    return out

  def extra_special(self) -> list[str]:
    listed = (self.tok.get("additional_special_tokens") or self.tok.get("extra_special_tokens")
              or self.special.get("additional_special_tokens") or [])
    return [c for c in (_content(t) for t in listed) if c]

  def files(self) -> dict[str, str]:
    return {name: os.path.join(self.directory, name) for name in CONFIG_FILES
            if os.path.isfile(os.path.join(self.directory, name))}


def _special_ids(configs: _Configs, token_id: Any, own: dict[str, int | None],
                 where: str) -> dict[str, int | None]:
  """pad / eos / bos / unk ids: named tokens, else config ids, else the model's own."""
  out: dict[str, int | None] = {}
  for role in ("pad", "eos", "bos", "unk"):
    name = configs.token(f"{role}_token")
    value = token_id(name) if name is not None else None
    if value is None:
      value = configs.config_id(f"{role}_token_id")
    if value is None:
      value = own.get(role)
    out[role] = value
  if out["eos"] is None:
    raise UserError(f"cannot tell the end-of-sequence token of {where}; add a "
                    "tokenizer_config.json with eos_token beside it.")
  if out["pad"] is None:
    out["pad"] = out["eos"]
  return out


CLEANUPS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def clean_up_tokenization(text: str) -> str:
  """transformers' clean_up_tokenization_spaces (spaces before punctuation and contractions)."""
  for old, new in CLEANUPS:
    text = text.replace(old, new)
  return text


class _FileVocabulary:
  """What the SentencePiece and tokenizer.json vocabularies share."""

  pad_id: int
  eos_id: int
  bos_id: int | None
  unk_id: int | None
  add_bos: bool
  files: dict[str, str]  # name in a vocabulary directory -> the file it is copied from
  spec: str
  _skip: frozenset[int]
  _clean_up: bool

  def _cut(self, ids: Sequence[int]) -> list[int]:
    """ids before the first EOS, without special, padding or out-of-vocabulary ids."""
    ids = [int(i) for i in ids]
    if self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    return [i for i in ids if 0 <= i < self.vocab_size and i not in self._skip]

  @property
  def skip_ids(self) -> frozenset[int]:
    """The ids decode drops (special tokens, padding, unknown)."""
    return self._skip

  @property
  def clean_up(self) -> bool:
    """Whether decode applies transformers' clean_up_tokenization_spaces."""
    return self._clean_up

  def _finish(self, text: str) -> str:
    return clean_up_tokenization(text) if self._clean_up else text

  @property
  def vocab_size(self) -> int:
    raise NotImplementedError

  def decode(self, ids: Sequence[int]) -> str:
    raise NotImplementedError


class SentencePieceVocabulary(_FileVocabulary):
  """A SentencePiece model file (spiece.model), with the special tokens the files beside it
  add (T5's <extra_id_N> after the model's pieces)."""

  def __init__(self, model_path: str) -> None:
    try:
      import sentencepiece as spm
    except ImportError:
      raise UserError("a SentencePiece vocabulary needs the sentencepiece package; "
                      "run pip install sentencepiece.") from None
    try:
      self._sp = spm.SentencePieceProcessor(model_file=model_path)
    except (OSError, RuntimeError) as e:
      raise UserError(f"cannot load the SentencePiece model {model_path} ({e}).") from None
    sp = self._sp
    size = sp.get_piece_size()
    configs = _Configs(os.path.dirname(os.path.abspath(model_path)))
    added = self._added_tokens(configs, size)
    pieces = {**{sp.id_to_piece(i): i for i in range(size)}, **added}
    own = {"pad": max(sp.pad_id(), 0), "eos": sp.eos_id(), "unk": sp.unk_id(),
           "bos": sp.bos_id() if sp.bos_id() >= 0 else None}
    ids = _special_ids(configs, pieces.get, own, model_path)
    self.pad_id, self.eos_id, self.bos_id, self.unk_id = (ids["pad"], ids["eos"], ids["bos"],
                                                          ids["unk"])
    self._size = max([size - 1, *added.values()]) + 1
    self._added = added
    self._split = (re.compile("(" + "|".join(map(re.escape, sorted(added, key=len, reverse=True)))
                              + ")") if added else None)
    controls = {i for i in range(size) if sp.is_control(i) or sp.is_unknown(i)}
    self._skip = frozenset({*controls, *added.values(),
                            *(v for v in ids.values() if v is not None)})
    self.add_bos = bool(configs.tok.get("add_bos_token", False)) and self.bos_id is not None
    self._clean_up = bool(configs.tok.get("clean_up_tokenization_spaces", False))
    self.spec = os.path.abspath(model_path)
    self.files = {SP_FILES[0]: self.spec, **configs.files()}

  @staticmethod
  def _added_tokens(configs: _Configs, size: int) -> dict[str, int]:
    """Tokens past the model's pieces: T5's extra_ids (<extra_id_0> is the last id) and
    tokenizer_config's added tokens."""
    added = {c: i for c, (i, _) in configs.added_tokens().items() if i >= size}
    extra = configs.tok.get("extra_ids")
    if extra is None and configs.extra_special():
      extra = sum(1 for t in configs.extra_special() if t.startswith("<extra_id_"))
    for n in range(int(extra or 0)):
      added.setdefault(f"<extra_id_{n}>", size + int(extra) - 1 - n)
    return added

  @property
  def vocab_size(self) -> int:
    return self._size

  @property
  def added_tokens(self) -> dict[str, int]:
    """Tokens past the model's pieces (T5's <extra_id_N>) -> their ids."""
    return dict(self._added)

  def encode(self, text: str) -> list[int]:
    if self._split is None:
      return list(self._sp.encode(text))
    out: list[int] = []
    for part in self._split.split(text):
      if part in self._added:
        out.append(self._added[part])
      elif part.strip():
        out.extend(self._sp.encode(part))
    return out

  def encode_with_starts(self, text: str) -> list[tuple[int, int]]:
    """encode(text)'s ids, each with the character of text it starts at."""
    char_at = _char_of_byte(text)
    out: list[tuple[int, int]] = []
    at = base = 0  # the character and the UTF-8 byte this part starts at
    for part in (self._split.split(text) if self._split else [text]):
      if part in self._added:
        out.append((self._added[part], at))
      elif part.strip():
        out += [(p.id, char_at[base + p.begin])
                for p in self._sp.encode(part, out_type="proto").pieces]
      at, base = at + len(part), base + len(part.encode("utf-8"))
    return out

  def decode(self, ids: Sequence[int]) -> str:
    ids = self._cut(ids)
    # SentencePiece drops every leading space; transformers' Metaspace decoder only the
    # dummy prefix (the first '▁'), so text whose first word was an unknown (dropped)
    # piece keeps its space there.
    lead = 0
    for i in ids:
      piece = self._sp.id_to_piece(i)
      lead += len(piece) - len(piece.lstrip("\u2581"))
      if piece.strip("\u2581"):
        break
    return self._finish(" " * max(lead - 1, 0) + self._sp.decode(ids))


class TokenizerJsonVocabulary(_FileVocabulary):
  """A `tokenizers` tokenizer.json (what transformers' fast tokenizers save)."""

  def __init__(self, path: str) -> None:
    try:
      from tokenizers import Tokenizer
    except ImportError:
      raise UserError("a tokenizer.json vocabulary needs the tokenizers package; "
                      "run pip install tokenizers.") from None
    try:
      self._tok = tok = Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
      raise UserError(f"cannot load the tokenizer {path} ({str(e).splitlines()[0]}).") from None
    configs = _Configs(os.path.dirname(os.path.abspath(path)))
    ids = _special_ids(configs, lambda t: tok.token_to_id(t) if t else None, {}, path)
    self.pad_id, self.eos_id, self.bos_id, self.unk_id = (ids["pad"], ids["eos"], ids["bos"],
                                                          ids["unk"])
    specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    self._skip = frozenset({tok.token_to_id(t) for t in specials}
                           | {v for v in ids.values() if v is not None})
    if "add_bos_token" in configs.tok:
      self.add_bos = bool(configs.tok["add_bos_token"]) and self.bos_id is not None
    else:  # what the post-processor does to a sequence
      probe = tok.encode("a", add_special_tokens=True).ids
      self.add_bos = self.bos_id is not None and probe[:1] == [self.bos_id]
    model = json.loads(tok.to_str()).get("model", {}).get("type")
    # transformers 5 cleans up decoded spaces only where asked, and never for BPE.
    self._clean_up = bool(configs.tok.get("clean_up_tokenization_spaces", False)) and \
        model != "BPE"
    self.spec = os.path.abspath(path)
    self.files = {TOKENIZER_JSON: self.spec, **configs.files()}

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str) -> list[int]:
    return list(self._tok.encode(text, add_special_tokens=False).ids)

  def encode_with_starts(self, text: str) -> list[tuple[int, int]]:
    """encode(text)'s ids, each with the character of text it starts at."""
    enc = self._tok.encode(text, add_special_tokens=False)
    return [(i, start) for i, (start, _) in zip(enc.ids, enc.offsets, strict=True)]

  def decode(self, ids: Sequence[int]) -> str:
    return self._finish(self._tok.decode(self._cut(ids), skip_special_tokens=True))


Vocabulary = ByteVocabulary | SentencePieceVocabulary | TokenizerJsonVocabulary


def _char_of_byte(text: str) -> list[int]:
  """For each UTF-8 byte of text (and its end), the character it belongs to."""
  out: list[int] = []
  for i, c in enumerate(text):
    out += [i] * len(c.encode("utf-8"))
  return out + [len(text)]


def encode_pieces(vocab: Vocabulary, pieces: Sequence[str]) -> list[list[int]]:
  """The ids of the pieces' concatenation, split where each piece starts.

  The text is tokenized whole, as transformers tokenizes a rendered chat:
  a tokenizer that marks the start of a text (SentencePiece's and Llama 2's
  dummy-prefix '▁') would mark every piece encoded on its own. A token that
  spans a boundary goes with the piece it starts in.
  """
  if isinstance(vocab, ByteVocabulary):  # bytes: the pieces' ids are the whole's
    return [vocab.encode(p) for p in pieces]
  starts = list(itertools.accumulate((len(p) for p in pieces[:-1]), initial=0))
  out: list[list[int]] = [[] for _ in pieces]
  k = 0
  for token, at in vocab.encode_with_starts("".join(pieces)):
    k = max(k, bisect.bisect_right(starts, at) - 1)
    out[k].append(token)
  return out


def tokenizer_file(directory: str) -> str:
  """The tokenizer file of a directory: tokenizer.json, else spiece.model / tokenizer.model."""
  for name in (TOKENIZER_JSON, *SP_FILES):
    if os.path.isfile(os.path.join(directory, name)):
      return os.path.join(directory, name)
  raise UserError(f"{directory} holds no {TOKENIZER_JSON} or {SP_FILES[0]}; point VOCABULARY "
                  "at a tokenizer file or a directory that has one.")


def get(spec: str | None) -> Vocabulary:
  """'byte' (or None), a tokenizer.json / SentencePiece path, or a directory holding one."""
  if spec in (None, "byte"):
    return ByteVocabulary()
  if spec == HF:
    raise UserError("VOCABULARY='hf' reads the tokenizer of the run's Hugging Face directory, "
                    "but there is none; set INIT_FROM=hf:DIR (or --init_from=hf:DIR), or name "
                    "the tokenizer's path.")
  path = os.path.abspath(os.path.expanduser(spec))
  if os.path.isdir(path):
    path = tokenizer_file(path)
  elif not os.path.isfile(path):
    raise UserError(f"the vocabulary {spec} does not exist; use 'byte', 'hf', or the path of "
                    "a tokenizer.json, a SentencePiece .model or a directory with one.")
  if path.endswith(".json"):
    return TokenizerJsonVocabulary(path)
  return SentencePieceVocabulary(path)


# ------------------------------------------------ which vocabulary a run reads


def resolve(spec: str | None, source_dir: str | None, job_log_dir: str | None) -> str | None:
  """The concrete spec for 'hf' and None (see the module docstring).

  Args:
    spec: the input's vocabulary setting.
    source_dir: the directory of the run's INIT_FROM (a Hugging Face directory, or a
      paxlike job's recorded vocabulary), or None.
    job_log_dir: this run's job_log_dir; the vocabulary it recorded when it trained
      comes first, so a later eval, infer or export reads what the checkpoints learned.
  """
  if spec not in (None, HF):
    return spec
  for candidate in (recorded(job_log_dir), source_dir):
    if _has_tokenizer(candidate):
      return candidate
  return spec if spec == HF else "byte"


def _has_tokenizer(directory: str | None) -> bool:
  return bool(directory) and os.path.isdir(directory) and any(
      os.path.isfile(os.path.join(directory, n)) for n in (TOKENIZER_JSON, *SP_FILES))


# ------------------------------------------------ the tokenizer a job recorded


def recorded(job_log_dir: str | None) -> str | None:
  """job_log_dir/vocabulary when a training run of the job recorded a tokenizer there."""
  path = os.path.join(job_log_dir, JOB_DIR) if job_log_dir else None
  return path if _has_tokenizer(path) else None


def _describe(vocab: Vocabulary) -> str:
  if isinstance(vocab, ByteVocabulary):
    return "the byte vocabulary"
  if isinstance(vocab, TokenizerJsonVocabulary):
    return "a tokenizer.json"
  return "a SentencePiece model"


def _main_file(vocab: Vocabulary) -> bytes:
  name = TOKENIZER_JSON if isinstance(vocab, TokenizerJsonVocabulary) else SP_FILES[0]
  with open(vocab.files[name], "rb") as f:
    return f.read()


def difference(a: Vocabulary, b: Vocabulary) -> str | None:
  """How b tokenizes otherwise than a (the kind, the tokenizer file, the special ids), or
  None when they give the same ids."""
  if type(a) is not type(b):
    return f"it is {_describe(b)}, the job's is {_describe(a)}"
  if a.files and _main_file(a) != _main_file(b):
    return "its tokenizer file differs"
  for role in ("pad_id", "eos_id", "bos_id", "unk_id", "add_bos", "vocab_size"):
    if getattr(a, role) != getattr(b, role):
      return f"its {role} is {getattr(b, role)}, the job's {getattr(a, role)}"
  return None


def check_recorded(spec: str, job_log_dir: str | None, what: str) -> None:
  """Refuses a tokenizer other than the one the job recorded (nothing to check without one).

  Args:
    spec: a vocabulary spec ("byte", a tokenizer path or directory).
    job_log_dir: the job whose record it must match.
    what: the setting that names spec, for the message ("VOCABULARY=...").

  Raises:
    UserError: spec tokenizes otherwise than the recorded tokenizer.
  """
  job = recorded(job_log_dir)
  if job is None or spec in (None, HF):
    return
  path = os.path.abspath(os.path.expanduser(spec))
  if spec != "byte" and job in (path, os.path.dirname(path)):
    return  # the record itself
  reason = difference(get(job), get(spec))
  if reason is not None:
    raise UserError(f"{what} is not the tokenizer this job trained with ({job}): {reason}; "
                    "drop it (every later run of a job reads the tokenizer the job recorded) "
                    "or use another --job_log_dir.")


def for_job(setting: str | None, source_dir: str | None, job_log_dir: str | None) -> str | None:
  """VOCABULARY for a run of a job: the tokenizer the job recorded, when it recorded one.

  Args:
    setting: the experiment's VOCABULARY (None and "hf": the run's INIT_FROM directory's).
    source_dir: the directory of the run's INIT_FROM tokenizer (InitFrom.vocabulary_dir), or
      None.
    job_log_dir: this run's job_log_dir.

  Returns:
    setting when it names a tokenizer or the job recorded none; else the recorded directory.

  Raises:
    UserError: setting, or for None and "hf" the INIT_FROM tokenizer, is not the recorded one.
  """
  if recorded(job_log_dir) is None:
    return setting
  if setting not in (None, HF):
    check_recorded(setting, job_log_dir, f"VOCABULARY={setting}")
    return setting
  if _has_tokenizer(source_dir):
    check_recorded(source_dir, job_log_dir, f"the tokenizer of INIT_FROM ({source_dir})")
  return recorded(job_log_dir)


def check_fits(vocab: Vocabulary, model: Any) -> None:
  """The vocabulary's ids fit the model's table, and its EOS is the one the model stops at.

  Raises:
    UserError: a tokenizer larger than VOCAB_SIZE, or another end-of-sequence id.
  """
  size, table = vocab.vocab_size, getattr(model, "vocab_size", None)
  if table is not None and size > table:
    raise UserError(f"the vocabulary {vocab.spec} has {size} tokens but the model's VOCAB_SIZE "
                    f"is {table}; set VOCAB_SIZE={size} or more, or use a smaller vocabulary.")
  eos = model.special_ids().get("eos_id")
  if eos is not None and vocab.eos_id != eos and vocab.files:
    raise UserError(f"the vocabulary {vocab.spec} ends sequences with id {vocab.eos_id} but "
                    f"the model stops decoding at {eos}; set EOS_ID={vocab.eos_id} (and PAD_ID="
                    f"{vocab.pad_id}) in the experiment.")


def record(vocab: Vocabulary, job_log_dir: str) -> str | None:
  """Copies a file vocabulary into job_log_dir/vocabulary/ (what later runs of the job read).

  Returns:
    The directory, or None for a vocabulary with no files (bytes).
  """
  if not vocab.files:
    return None
  out = os.path.join(job_log_dir, JOB_DIR)
  if all(os.path.dirname(p) == out for p in vocab.files.values()):
    return out  # it is read from there already
  staging = out + ".tmp"
  shutil.rmtree(staging, ignore_errors=True)
  os.makedirs(staging)
  for name, path in vocab.files.items():
    shutil.copyfile(path, os.path.join(staging, name))
  shutil.rmtree(out, ignore_errors=True)
  os.replace(staging, out)
  return out


# transformers' tokenizer of UTF-8 bytes: pad 0, EOS 1, unk 2, byte b -> b + 3, as
# ByteVocabulary; its extra_ids <extra_id_N> (N = 0, 1, ...) follow at ids 259 + N.
BYT5_CLASS = "ByT5Tokenizer"


def byte_tokenizer_config(vocab: ByteVocabulary, table_size: int | None) -> dict[str, Any]:
  """tokenizer_config.json for a byte-vocabulary export: transformers' ByT5Tokenizer, whose
  ids are ByteVocabulary's. The table's ids past the 259 (VOCAB_SIZE 264 pads them) are its
  extra_ids: special tokens, which decode(skip_special_tokens=True) drops as paxlike's
  decode does; so len(tokenizer) is the model's vocab_size and every id it emits decodes."""
  return {"tokenizer_class": BYT5_CLASS, "pad_token": "<pad>", "eos_token": "</s>",
          "unk_token": "<unk>", "extra_ids": max(0, (table_size or 0) - vocab.vocab_size),
          "clean_up_tokenization_spaces": False}


def write_hf_files(vocab: Vocabulary | None, out_dir: str, generation: dict[str, Any],
                   table_size: int | None = None) -> None:
  """The tokenizer files of a Hugging Face export (AutoTokenizer.from_pretrained reads them).

  Args:
    vocab: the run's vocabulary: a file vocabulary's files are copied; bytes get a
      tokenizer_config.json naming ByT5Tokenizer (byte_tokenizer_config); None (no text
      input) gets none.
    out_dir: the export directory (its config.json is the export's own).
    generation: generation_config.json's ids (decoder_start_token_id, eos, pad, bos).
    table_size: the model's vocab_size (config.json's), for the byte tokenizer's extra_ids.
  """
  if isinstance(vocab, ByteVocabulary):
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
      json.dump(byte_tokenizer_config(vocab, table_size), f, indent=2)
      f.write("\n")
  for name, path in (vocab.files if vocab is not None else {}).items():
    if name not in ("config.json", "generation_config.json"):
      shutil.copyfile(path, os.path.join(out_dir, name))
  with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
    json.dump({k: v for k, v in generation.items() if v is not None}, f, indent=2)
    f.write("\n")
