"""A synthetic language-model input with structure a model can learn.

Each row is a walk through a fixed random permutation of the vocabulary that
starts at a random token: after the first token, every next token is
determined by the current one, so a model drives its loss from ln(vocab)
towards zero. A fraction of tokens (noise_rate) is replaced by random ones,
so the loss floor is not exactly zero.

Rows are deterministic in (seed, global step, global row): the global batch
at a step is the same whichever host reads which slice, and a resumed run
sees exactly the batches it would have seen.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from paxlike.errors import UserError
from paxlike.inputs.base_input import BaseInput

DEFAULT_VOCAB = 256


@dataclasses.dataclass
class SyntheticLmInput(BaseInput):
  """Permutation-walk token sequences; see the module docstring."""

  vocab_size: int = 256  # DEFAULT_VOCAB
  seq_len: int = 64
  noise_rate: float = 0.05
  eval_offset: int = 1 << 30  # eval steps read a disjoint part of the stream

  def __post_init__(self) -> None:
    super().__post_init__()
    self._step = 0
    self._perm = None if self.vocab_size is None else self._permutation()

  def _permutation(self) -> np.ndarray:
    return np.random.default_rng([self.seed, 0xC0FFEE]).permutation(self.vocab_size)

  def check_model(self, model: Any) -> None:
    """The ids fit the model's table; vocab_size None (Pax's SyntheticLmData) takes it."""
    table = getattr(model, "vocab_size", None)
    if self.vocab_size is None:
      self.vocab_size = table or DEFAULT_VOCAB  # a model with no table (an MLP): ids < 256
      self._perm = self._permutation()
    elif table is not None and self.vocab_size > table:
      raise UserError(f"input {self.name!r} draws token ids below vocab_size="
                      f"{self.vocab_size}, but the model's VOCAB_SIZE is {table}; set the "
                      f"input's vocab_size to {table} or less, or raise VOCAB_SIZE.")

  def _rows(self, step: int, first_row: int, count: int) -> np.ndarray:
    """Rows first_row .. first_row+count of the global batch at `step`."""
    if self._perm is None:  # read before any model was checked against it
      self.vocab_size = self.vocab_size or DEFAULT_VOCAB
      self._perm = self._permutation()
    n = self.seq_len + 1
    starts = np.empty(count, np.int64)
    noise = np.empty((count, n), bool)
    random_toks = np.empty((count, n), np.int64)
    for r in range(count):
      rng = np.random.default_rng([self.seed, step, first_row + r])
      starts[r] = rng.integers(self.vocab_size)
      noise[r] = rng.random(n) < self.noise_rate
      random_toks[r] = rng.integers(self.vocab_size, size=n)
    out = np.empty((count, n), np.int32)
    tok = starts
    for i in range(n):
      out[:, i] = np.where(noise[:, i], random_toks[:, i], tok)
      tok = self._perm[out[:, i]]
    return out

  def batch_at(self, step: int) -> dict[str, np.ndarray]:
    """This host's slice of the global batch at `step`."""
    _, host = self.hosts
    global_step = step if self.is_training else step + self.eval_offset
    rows = self._rows(global_step, host * self.batch_size, self.batch_size)
    return {
        "ids": rows[:, :-1],
        "labels": rows[:, 1:],
        "weights": np.ones((self.batch_size, self.seq_len), np.float32),
    }

  def get_next(self) -> dict[str, np.ndarray]:
    if not self.repeat and self._step >= self.eval_loop_num_batches:
      raise StopIteration
    batch = self.batch_at(self._step)
    self._step += 1
    return batch

  def reset(self) -> None:
    self._step = 0

  def get_state(self) -> dict[str, Any]:
    return {"step": self._step}

  def set_state(self, state: dict[str, Any]) -> None:
    self._step = int(state.get("step", 0))


@dataclasses.dataclass
class SyntheticSeq2SeqInput(SyntheticLmInput):
  """Encoder-decoder features from the same walks: the target continues the input.

  The encoder reads the first seq_len tokens of a walk, the decoder predicts
  the next target_len tokens (T5X's feature names; start id 0 in front of
  the shifted targets), so the first target token is determined by the
  last input token and a model can learn the task. Ids are moved to
  [2, vocab) so that none reads as padding (0) or end of sequence (1).
  """

  target_len: int = 16

  def batch_at(self, step: int) -> dict[str, np.ndarray]:
    _, host = self.hosts
    global_step = step if self.is_training else step + self.eval_offset
    total = self.seq_len + self.target_len
    full = dataclasses.replace(self, seq_len=total - 1)._rows(
        global_step, host * self.batch_size, self.batch_size)
    full = 2 + full % (self.vocab_size - 2)  # keep clear of pad (0) and EOS (1)
    targets = full[:, self.seq_len:]
    dec_in = np.zeros_like(targets)
    dec_in[:, 1:] = targets[:, :-1]
    return {
        "encoder_input_tokens": full[:, :self.seq_len],
        "decoder_input_tokens": dec_in,
        "decoder_target_tokens": targets,
        "decoder_loss_weights": np.ones((self.batch_size, self.target_len), np.float32),
    }
