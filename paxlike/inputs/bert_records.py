"""TFRecordBertInput: MLPerf BERT pretraining TFRecords as a BaseInput (Pax's input).

paxml.tasks.lm.input_generator.TFRecordBertInput under the same fields. Each
record holds input_ids, input_mask, masked_lm_positions, masked_lm_ids and
masked_lm_weights (segment_ids and next_sentence_labels are not read). A
record becomes one row of [max_sequence_length]:

  masked_ids   input_ids as stored (the masked positions hold [MASK] etc.);
  labels       input_ids with masked_lm_ids written back at the first
               sum(masked_lm_weights) masked_lm_positions: the original text;
  masked_pos   1.0 at those positions;
  segment_ids  input_mask (1 on the tokens, 0 on padding);

then, as Pax does, the first eos_token_id ([SEP]) of labels is taken out of
every feature (the row shifts left and ends with a 0), paddings = 1 -
segment_ids and segment_pos = segment_ids * position. remask=True (training
only) draws a fresh masked-LM corruption of labels with mlm_augmenter
(paxlike.layers.masking.MlmMasking) from a numpy generator seeded by (seed,
host, batch): one independent draw per token, so masking packed rows is
masking their examples.

Training reads this host's files only (sorted; file i goes to host i %
num_infeed_hosts, so the file count must divide evenly), interleaved, shuffled
through a buffer of file_buffer_size records (seeded by seed and host) and
repeated. enable_packing puts several records in a row: records come in
chunks of prepacking_batch_size, a greedy first-fit packer written here in
numpy places each record in the first row of the chunk with room for it, and
the chunk's rows are shuffled (seeded) before they are served; tf.data packs
the next chunk in the background (numpy_function, prefetched). seqio's
trim_and_pack_dataset was not used: it infers each feature's length from its
non-zero entries, which a 0/1 masked_pos (and a real token id 0) breaks, and
runs one TF while-loop step per example. A packed row's segment_ids number
its examples 1, 2, ... (0 on padding) and segment_pos restarts at 0 for each.

Eval (is_training=False: reset_for_eval on; repeat, packing and remask off,
as Pax sets them) reads every file in order, once, in batches whose last
one is padded with all-padding rows (paddings 1, all else 0). Batch k of the
split goes to host k % num_infeed_hosts, and hosts with fewer batches add
all-padding ones, so every host serves the same count (eval_data_size is
kept for Pax's configs; the split is counted as it is read).

TensorFlow (the [seqio] extra) is imported on the first read only, never by
building the config, and files are opened then too: hosts are bound after the
config is built. get_state() is the stream position (batches served and, when
packing, the chunk and row); set_state() resumes there by skipping records
of a fresh, seeded pipeline, so it needs the same files and settings.
Pax's sharded pattern 'name@N' (name-?????-of-0000N) and globs are accepted.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from paxlike.errors import UserError
from paxlike.inputs.base_input import BaseInput
from paxlike.layers.masking import MlmMasking, numpy_samplers

RAW_KEYS = ("input_ids", "input_mask", "masked_lm_positions", "masked_lm_ids",
            "masked_lm_weights")
INT_KEYS = ("labels", "masked_ids", "segment_ids", "segment_pos")
FLOAT_KEYS = ("masked_pos", "paddings")
INTERLEAVE_FILES = 16  # files read at once; fixed, so a restart replays the same stream
_REMASK_STREAM, _PACK_STREAM = 0, 1  # numpy generator streams: (seed, host, stream, index)


def tensorflow(reader: str = "TFRecordBertInput") -> Any:
  """TensorFlow, with its GPUs hidden (JAX owns the accelerator; tf.data runs on CPU); one
  line naming the extra where it is missing (`reader` reads TFRecords with it)."""
  try:
    import tensorflow as tf
  except ImportError:
    raise UserError(f"{reader} reads TFRecords with TensorFlow: pip install -e "
                    "'.[seqio]'.") from None
  try:
    tf.config.set_visible_devices([], "GPU")
  except RuntimeError:  # TensorFlow has placed something already; its choice stands
    pass
  return tf


def sharded_pattern_to_glob(pattern: str) -> str:
  """Pax's 'dir/name@N' -> 'dir/name-?????-of-0000N'; any other pattern is returned as is."""
  m = re.fullmatch(r"(.+)@(\d+)", pattern)
  return f"{m.group(1)}-?????-of-{int(m.group(2)):05d}" if m else pattern


def empty_batch(rows: int, length: int) -> dict[str, np.ndarray]:
  """rows all-padding rows: paddings 1, every other feature 0."""
  batch = {k: np.zeros((rows, length), np.int32) for k in INT_KEYS}
  batch["masked_pos"] = np.zeros((rows, length), np.float32)
  batch["paddings"] = np.ones((rows, length), np.float32)
  return batch


def _drop_column(x: np.ndarray, col: np.ndarray) -> np.ndarray:
  """Each row of x without its entry at col[row] (none where col is x's width), 0 at the end."""
  width = x.shape[1]
  j = np.arange(width)[None, :]
  src = j + (j >= col[:, None])
  padded = np.concatenate([x, np.zeros_like(x[:, :1])], axis=1)
  return np.take_along_axis(padded, src, axis=1)


def records_to_rows(raw: dict[str, np.ndarray], eos_id: int) -> dict[str, np.ndarray]:
  """Parsed records [n, ...] -> unpacked rows with Pax's features (module docstring).

  A record without eos_id keeps all its tokens.
  """
  masked_ids = raw["input_ids"].astype(np.int32)
  n, length = masked_ids.shape
  count = np.rint(raw["masked_lm_weights"].sum(axis=1)).astype(np.int64)
  taken = np.arange(raw["masked_lm_positions"].shape[1])[None, :] < count[:, None]
  rows = np.broadcast_to(np.arange(n)[:, None], taken.shape)[taken]
  cols = raw["masked_lm_positions"][taken].astype(np.int64)
  labels = masked_ids.copy()
  labels[rows, cols] = raw["masked_lm_ids"][taken]
  masked_pos = np.zeros((n, length), np.float32)
  masked_pos[rows, cols] = 1.0
  is_eos = labels == eos_id
  first_eos = np.where(is_eos.any(axis=1), is_eos.argmax(axis=1), length)
  out = {k: _drop_column(v, first_eos) for k, v in (
      ("labels", labels), ("masked_ids", masked_ids), ("masked_pos", masked_pos),
      ("segment_ids", raw["input_mask"].astype(np.int32)))}
  out["paddings"] = (1 - out["segment_ids"]).astype(np.float32)
  out["segment_pos"] = (out["segment_ids"] * np.arange(length)).astype(np.int32)
  return out


def first_fit(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
  """Greedy first-fit: each length, in order, goes to the first row with room for it.

  Returns:
    (row, offset) of each length: its row index and the column where it starts.
  """
  free = np.full(max(len(lengths), 1), capacity, np.int64)
  used = 0
  row = np.empty(len(lengths), np.int64)
  offset = np.empty(len(lengths), np.int64)
  for i, n in enumerate(lengths):
    r = int(np.argmax(free[:used] >= n)) if used else 0
    if not used or free[r] < n:
      r, used = used, used + 1
    row[i], offset[i] = r, capacity - free[r]
    free[r] -= n
  return row, offset


def pack_rows(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Unpacked rows (tokens first, then padding) -> rows holding several of them each.

  segment_ids numbers a packed row's examples 1, 2, ... in column order, and
  segment_pos counts from 0 within each; rows without tokens are dropped.
  """
  length = rows["labels"].shape[1]
  lens = rows["segment_ids"].sum(axis=1).astype(np.int64)
  keep = np.flatnonzero(lens)
  lens = lens[keep]
  row, offset = first_fit(lens, length)
  num_rows = int(row.max()) + 1 if len(row) else 0
  out = empty_batch(num_rows, length)
  token_row, within = np.repeat(row, lens), np.arange(lens.sum()) - np.repeat(
      np.cumsum(lens) - lens, lens)
  token_col = np.repeat(offset, lens) + within
  real = np.arange(length)[None, :] < rows["segment_ids"].sum(axis=1)[keep][:, None]
  for k in ("labels", "masked_ids", "masked_pos"):
    out[k][token_row, token_col] = rows[k][keep][real]
  # Examples of a row in column order: the rank of its offset among the row's offsets.
  order = np.lexsort((offset, row))
  rank = np.empty(len(row), np.int64)
  starts = np.searchsorted(row[order], np.arange(num_rows))
  rank[order] = np.arange(len(row)) - starts[row[order]]
  out["segment_ids"][token_row, token_col] = np.repeat(rank + 1, lens)
  out["segment_pos"][token_row, token_col] = within
  out["paddings"] = (out["segment_ids"] == 0).astype(np.float32)
  return out


class TFRecordBertInput(BaseInput):
  """MLPerf BERT TFRecords (see the module docstring); Pax's fields and defaults.

  Attributes:
    input_file: a path, glob or 'name@N' pattern, or a list of them.
    max_sequence_length: the records' (and rows') length.
    max_predictions_per_seq: the length of the records' masked_lm_* features.
    eos_token_id: the id whose first occurrence is taken out of each row ([SEP]).
    eval_data_size: examples in the eval split (Pax's accounting; counted as read here).
    file_buffer_size: records in the training shuffle buffer.
    enable_packing: training: several records a row.
    prepacking_batch_size: records packed together (a chunk).
    remask: training: draw a fresh masking with mlm_augmenter.
    mlm_augmenter: the masked-LM corruption remask draws.
    num_samples: for accounting only.
  """

  input_file: str | list[str] | None = None
  max_sequence_length: int = 512
  max_predictions_per_seq: int = 76
  eos_token_id: int = 102
  eval_data_size: int = 10000
  file_buffer_size: int = 10000
  enable_packing: bool = False
  prepacking_batch_size: int = 1 << 14
  remask: bool = False
  mlm_augmenter: MlmMasking = dataclasses.field(default_factory=MlmMasking)
  num_samples: int = -1

  def __post_init__(self) -> None:
    if not self.is_training:  # Pax's eval input: one padded pass, as stored
      self.reset_for_eval, self.repeat = True, False
      self.enable_packing = self.remask = False
    super().__post_init__()
    if self.remask:
      self.mlm_augmenter.check(f"input {self.name!r}")
    self.reset()

  def validate(self) -> None:
    super().validate()
    where = f"input {self.name!r}"
    for field in ("max_sequence_length", "max_predictions_per_seq", "file_buffer_size",
                  "prepacking_batch_size"):
      if getattr(self, field) <= 0:
        raise UserError(f"{where}: {field} must be positive, got {getattr(self, field)}.")

  def check_model(self, model: Any) -> None:
    """The ids remask draws must be rows of the model's table: one line if not."""
    vocab = getattr(model, "vocab_size", None)
    if not self.remask or vocab is None:
      return
    m = self.mlm_augmenter
    if m.vocab_size > vocab or m.mask_token_id >= vocab:
      raise UserError(f"input {self.name!r}: remask draws ids below {m.vocab_size} and masks "
                      f"with id {m.mask_token_id} (mlm_augmenter), but the model's VOCAB_SIZE "
                      f"is {vocab}; raise VOCAB_SIZE or set mlm_augmenter.vocab_size.")

  # ------------------------------------------------------------------ files

  def _patterns(self) -> list[str]:
    if not self.input_file:
      raise UserError(f"input {self.name!r}: input_file is not set; point it at the MLPerf "
                      "BERT TFRecord files.")
    return [self.input_file] if isinstance(self.input_file, str) else list(self.input_file)

  def _files(self, tf: Any) -> list[str]:
    """The files this host reads, in order."""
    patterns = self._patterns()
    files = sorted({f for p in patterns for f in tf.io.gfile.glob(sharded_pattern_to_glob(p))})
    if not files:
      raise UserError(f"input {self.name!r}: no TFRecord file matches {', '.join(patterns)}; "
                      "set input_file to the MLPerf BERT records.")
    if not self.is_training:
      return files
    num_hosts, host = self.hosts
    if len(files) % num_hosts:
      raise UserError(f"input {self.name!r}: {len(files)} training files cannot be split "
                      f"evenly among {num_hosts} hosts, each reading whole files; use a file "
                      "count divisible by num_infeed_hosts.")
    return files[host::num_hosts]

  # --------------------------------------------------------------- pipelines

  def _parse(self, tf: Any) -> Any:
    """A function: a batch of serialized records -> their features."""
    s, p = self.max_sequence_length, self.max_predictions_per_seq
    spec = {"input_ids": tf.io.FixedLenFeature([s], tf.int64),
            "input_mask": tf.io.FixedLenFeature([s], tf.int64),
            "masked_lm_positions": tf.io.FixedLenFeature([p], tf.int64),
            "masked_lm_ids": tf.io.FixedLenFeature([p], tf.int64),
            "masked_lm_weights": tf.io.FixedLenFeature([p], tf.float32)}
    return lambda records: tf.io.parse_example(records, spec)

  def _seed(self, *more: int) -> int:
    """A 32-bit seed from seed, this host and `more`."""
    return int(np.random.SeedSequence([self.seed, self.hosts[1], *more]).generate_state(1)[0])

  def _train_dataset(self, tf: Any, records: int, skip: int) -> Any:
    """Parsed batches of `records` training records, the first `skip` records skipped."""
    files = self._files(tf)
    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, cycle_length=min(len(files), INTERLEAVE_FILES),
        block_length=1, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.shuffle(self.file_buffer_size, seed=self._seed(), reshuffle_each_iteration=True)
    if self.repeat:
      ds = ds.repeat()
    ds = ds.skip(skip).batch(records, drop_remainder=True)
    return ds.map(self._parse(tf), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

  def _packed_chunks(self, tf: Any, first: int) -> Iterator[dict[str, np.ndarray]]:
    """Packed chunks from chunk `first` on; tf.data packs the next one while one is served."""
    p = self.prepacking_batch_size
    keys = INT_KEYS + FLOAT_KEYS

    def pack(index: np.ndarray, *raw: np.ndarray) -> tuple[np.ndarray, ...]:
      rows = self._pack_chunk(int(index), dict(zip(RAW_KEYS, raw, strict=True)))
      return tuple(rows[k].astype(np.int32 if k in INT_KEYS else np.float32) for k in keys)

    types = [tf.int32 if k in INT_KEYS else tf.float32 for k in keys]
    ds = self._train_dataset(tf, p, first * p).enumerate(first).map(
        lambda i, raw: tf.numpy_function(pack, [i, *(raw[k] for k in RAW_KEYS)], types))
    return (dict(zip(keys, rows, strict=True)) for rows in ds.prefetch(1).as_numpy_iterator())

  def _eval_batches(self, tf: Any) -> Iterator[dict[str, np.ndarray]]:
    """This host's eval batches: split batches k = host (mod hosts), then padding ones.

    Only this host's batches are parsed; the others are counted as they pass.
    """
    num_hosts, host = self.hosts
    ds = tf.data.TFRecordDataset(self._files(tf)).batch(self.batch_size).enumerate()
    parse, total = self._parse(tf), [0]

    def mine(k: Any, raw: Any) -> Any:
      total[0] = max(total[0], int(k) + 1)
      return int(k) % num_hosts == host

    own = ds.filter(lambda k, raw: tf.py_function(mine, [k, raw], tf.bool))
    for _, raw in own.map(lambda k, raw: (k, parse(raw))).as_numpy_iterator():
      yield self._pad(records_to_rows(raw, self.eos_token_id))
    served = len(range(host, total[0], num_hosts))
    for _ in range(-(-total[0] // num_hosts) - served):
      yield empty_batch(self.batch_size, self.max_sequence_length)

  def _pad(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The last eval batch filled up with all-padding rows."""
    missing = self.batch_size - len(batch["labels"])
    if not missing:
      return batch
    filler = empty_batch(missing, self.max_sequence_length)
    return {k: np.concatenate([v, filler[k]]) for k, v in batch.items()}

  def _open(self) -> None:
    """Starts the stream at the saved position (nothing is read before the first batch)."""
    tf = tensorflow()
    if not self.is_training:
      self._it = self._eval_batches(tf)
      for _ in range(self._served):
        next(self._it)
    elif self.enable_packing:
      self._it = self._packed_chunks(tf, self._chunk)
    else:
      ds = self._train_dataset(tf, self.batch_size, self._served * self.batch_size)
      self._it = ds.prefetch(tf.data.AUTOTUNE).as_numpy_iterator()

  # ------------------------------------------------------------------ batches

  def get_next(self) -> dict[str, np.ndarray]:
    """The next [batch_size, max_sequence_length] batch; StopIteration ends an eval pass."""
    if self._it is None:
      self._open()
    if not self.is_training:
      batch = next(self._it)
    elif self.enable_packing:
      batch = self._next_packed()
    else:
      batch = records_to_rows(next(self._it), self.eos_token_id)
    if self.remask:
      rng = np.random.default_rng(self._seed(_REMASK_STREAM, self._served))
      batch["masked_ids"], batch["masked_pos"] = self.mlm_augmenter.apply(
          batch["labels"], batch["paddings"], *numpy_samplers(rng))
    self._served += 1
    return {k: batch[k].astype(np.int32 if k in INT_KEYS else np.float32)
            for k in INT_KEYS + FLOAT_KEYS}

  def _next_packed(self) -> dict[str, np.ndarray]:
    """batch_size packed rows, taken in order from the current chunk and the next ones."""
    parts, need = [], self.batch_size
    while need:
      if self._rows is None:
        self._rows = next(self._it)
      left = len(self._rows["labels"]) - self._offset
      if left <= 0:  # this chunk is served: the next one
        self._rows, self._chunk, self._offset = None, self._chunk + 1, 0
        continue
      take = min(left, need)
      parts.append({k: v[self._offset:self._offset + take] for k, v in self._rows.items()})
      self._offset, need = self._offset + take, need - take
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  def _pack_chunk(self, index: int, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Chunk `index`'s records packed into rows, the rows shuffled (seeded)."""
    rows = pack_rows(records_to_rows(raw, self.eos_token_id))
    order = np.random.default_rng(self._seed(_PACK_STREAM, index)).permutation(
        len(rows["labels"]))
    return {k: v[order] for k, v in rows.items()}

  def reset(self) -> None:
    self._it: Iterator[dict[str, np.ndarray]] | None = None
    self._rows: dict[str, np.ndarray] | None = None
    self._served = self._chunk = self._offset = 0

  def get_state(self) -> dict[str, Any]:
    state = {"batches": self._served}
    if self.enable_packing:
      state.update(chunk=self._chunk, row=self._offset)
    return state

  def set_state(self, state: dict[str, Any]) -> None:
    self.reset()
    self._served = int(state.get("batches", 0))
    self._chunk, self._offset = int(state.get("chunk", 0)), int(state.get("row", 0))

  def __getstate__(self) -> dict[str, Any]:
    """A copy (deepcopy, pickle) holds the position, not the open TensorFlow pipeline; it
    reopens there when read."""
    state = dict(self.__dict__)
    state["_it"] = state["_rows"] = None
    return state

  def peek_specs(self) -> dict[str, np.ndarray]:
    """An all-padding batch of get_next's shapes and dtypes, from the settings alone (a dry
    run needs neither the files nor TensorFlow)."""
    return empty_batch(self.batch_size, self.max_sequence_length)

  def packing_efficiency(self, batch: dict[str, np.ndarray]) -> float | None:
    """The fraction of the batch's positions holding a token (1 - mean paddings)."""
    return float(1.0 - np.mean(batch["paddings"]))
