"""A native text input (no TensorFlow): local text / JSONL files or a generator.

Examples are either `{"inputs": ..., "targets": ...}` pairs (the loss covers
the targets and the end-of-sequence id; decode prompts with the inputs) or
plain text (one example per line or, with pack=True, lines packed into
MAX_SEQ_LEN blocks; the loss covers every token).

Order is global: global example k of the stream is row `perm_e[k % N]` of
epoch e = k // N, where perm_e is a seeded shuffle (training) or the identity
(eval). Host h of H takes rows [h*B, (h+1)*B) of each global batch of H*B
rows, so the global batch at a step is the same however many hosts read it,
and two hosts never emit the same example at a step. A finite input
(repeat=False) pads its last global batch with weight-0 rows.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from paxlike.errors import UserError
from paxlike.inputs import vocabulary as vocab_lib
from paxlike.inputs.base_input import BaseInput


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


def read_files(pattern: str) -> list[dict[str, str] | str]:
  """Examples from comma-separated globs of .jsonl (one object per line) or text files."""
  paths = sorted({p for pat in pattern.split(",") if pat for p in glob.glob(pat.strip())})
  if not paths:
    raise UserError(f"no data file matches {pattern!r}; check the path.")
  out: list[dict[str, str] | str] = []
  for path in paths:
    try:
      with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
      raise UserError(f"cannot read data file {path} ({getattr(e, 'strerror', None) or e}).") \
          from None
    if path.endswith((".jsonl", ".json")):
      for n, line in enumerate(lines, 1):
        if not line.strip():
          continue
        try:
          out.append(json.loads(line))
        except json.JSONDecodeError:
          raise UserError(f"{path} line {n} is not valid JSON.") from None
    else:
      out.extend(line for line in lines if line.strip())
  return out


@dataclasses.dataclass
class TextInput(BaseInput):
  """See the module docstring. Exactly one of file_pattern and generator is set."""

  file_pattern: str = ""
  generator: str = ""  # "module:function"; called with `split`
  split: str = "train"
  vocabulary: str = "byte"  # or the path of a SentencePiece .model file
  seq_len: int = 64
  pack: bool = False
  shuffle: bool = True
  input_key: str = "inputs"
  target_key: str = "targets"
  text_key: str = "text"
  scorer: str = ""  # "module:function(targets, predictions) -> metrics" for decode

  def __post_init__(self) -> None:
    super().__post_init__()
    if bool(self.file_pattern) == bool(self.generator):
      raise UserError(f"input {self.name!r}: set exactly one of file_pattern and generator.")
    self.vocab = vocab_lib.get(self.vocabulary)
    raw = (read_files(self.file_pattern) if self.file_pattern
           else list(load_generator(self.generator, self.split)))
    self._tokens, self._weights, self._prompt_lens = self._tokenize(raw)
    if not len(self._tokens):
      raise UserError(f"input {self.name!r} has no examples.")
    self._index = 0

  @property
  def num_examples(self) -> int:
    return len(self._tokens)

  def _tokenize(self, raw: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = self.seq_len + 1
    seqs, wts, plens, stream = [], [], [], []
    for ex in raw:
      if isinstance(ex, dict) and self.input_key in ex:
        prompt = self.vocab.encode(str(ex[self.input_key]))
        target = self.vocab.encode(str(ex.get(self.target_key, ""))) + [self.vocab.eos_id]
        seq = (prompt + target)[:n]
        w = [1.0 if j + 1 >= len(prompt) else 0.0 for j in range(len(seq) - 1)]
        plens.append(min(len(prompt), self.seq_len))
      else:
        text = ex[self.text_key] if isinstance(ex, dict) else str(ex)
        seq = self.vocab.encode(text) + [self.vocab.eos_id]
        if self.pack:
          stream.extend(seq)
          continue
        seq = seq[:n]
        w = [1.0] * (len(seq) - 1)
        plens.append(0)
      seqs.append(seq + [self.vocab.pad_id] * (n - len(seq)))
      wts.append(w + [0.0] * (self.seq_len - len(w)))
    if stream:
      count = len(stream) // n
      seqs.extend(np.asarray(stream[:count * n], np.int32).reshape(count, n).tolist())
      wts.extend([[1.0] * self.seq_len] * count)
      plens.extend([0] * count)
    return (np.asarray(seqs, np.int32).reshape(-1, n), np.asarray(wts, np.float32).reshape(
        -1, self.seq_len), np.asarray(plens, np.int32))

  def _order(self, epoch: int) -> np.ndarray:
    if self.shuffle and self.is_training:
      return np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)
    return np.arange(self.num_examples)

  def num_batches(self) -> int | None:
    """Batches per epoch of a finite input (the same on every host); None if repeating."""
    if self.repeat:
      return None
    return -(-self.num_examples // self.get_global_batch_size())

  def get_next(self) -> dict[str, np.ndarray]:
    num_hosts, host = self.hosts
    g = self.get_global_batch_size()
    if not self.repeat and self._index >= self.num_batches():
      raise StopIteration
    first = self._index * g + host * self.batch_size
    ks = np.arange(first, first + self.batch_size)
    valid = ks < self.num_examples if not self.repeat else np.ones_like(ks, bool)
    epochs = ks // self.num_examples
    rows = np.empty(self.batch_size, np.int64)
    for e in np.unique(epochs):
      sel = epochs == e
      rows[sel] = self._order(int(e))[ks[sel] % self.num_examples]
    self._index += 1
    tokens = self._tokens[rows]
    weights = self._weights[rows] * valid[:, None]
    del num_hosts
    return {"ids": tokens[:, :-1], "labels": tokens[:, 1:], "weights": weights.astype(np.float32),
            "prompt_lens": self._prompt_lens[rows].astype(np.int32)}

  def reset(self) -> None:
    self._index = 0

  def get_state(self) -> dict[str, Any]:
    return {"index": self._index}

  def set_state(self, state: dict[str, Any]) -> None:
    self._index = int(state.get("index", 0))

  def score(self, targets: list[str], predictions: list[str]) -> dict[str, float]:
    if self.scorer:
      return dict(load_generator_fn(self.scorer)(targets, predictions))
    return super().score(targets, predictions)

  def ids_to_strings(self, ids: np.ndarray, lengths: np.ndarray | None = None) -> list[str]:
    """Detokenises each row (up to its length, or to end-of-sequence)."""
    out = []
    for i, row in enumerate(np.asarray(ids)):
      if lengths is not None:
        row = row[:int(lengths[i])]
      out.append(self.vocab.decode(row))
    return out
