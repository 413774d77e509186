"""Vocabularies for the native text input: bytes, or a SentencePiece model file.

Ids follow seqio's ByteVocabulary convention, so the same task reads the same
ids through SeqIO: 0 = padding, 1 = end of sequence, 2 = unknown, byte b -> b + 3.
"""

from __future__ import annotations

from collections.abc import Sequence

from paxlike.errors import UserError

PAD_ID = 0
EOS_ID = 1


class ByteVocabulary:
  """UTF-8 bytes shifted by 3 special ids."""

  offset = 3
  pad_id = PAD_ID
  eos_id = EOS_ID

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


class SentencePieceVocabulary:
  """A SentencePiece model file (needs `pip install sentencepiece`)."""

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
    self.pad_id = max(self._sp.pad_id(), 0)
    self.eos_id = self._sp.eos_id()

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    return list(self._sp.encode(text))

  def decode(self, ids: Sequence[int]) -> str:
    ids = [int(i) for i in ids]
    if self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    return self._sp.decode([i for i in ids if i != self.pad_id])


def get(spec: str) -> ByteVocabulary | SentencePieceVocabulary:
  """'byte' or the path of a SentencePiece .model file."""
  if spec == "byte":
    return ByteVocabulary()
  return SentencePieceVocabulary(spec)
