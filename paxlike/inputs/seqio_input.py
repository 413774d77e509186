"""SeqIOInput: a seqio task or mixture as a BaseInput (the `[seqio]` extra).

seqio and TensorFlow are imported only when such an input is built, so the
core never needs them; without the extra, building one is a UserError that
names the pip command. Hosts read disjoint shards through
seqio.ShardInfo(infeed_host_index, num_infeed_hosts). A finite eval input
pads its last batch with weight-0 rows. The stream position saved with
checkpoints is the number of batches read; restoring replays the
deterministic (seeded) stream up to it.

Feature converters: "prefix_lm" and "lm" give the decoder-only features
(ids, labels, weights, prompt_lens); "enc_dec" (seqio.EncDecFeatureConverter)
gives T5X's encoder-decoder features under the same names as TextInput's
enc_dec converter: encoder_input_tokens, decoder_input_tokens,
decoder_target_tokens, decoder_loss_weights, and, when packed,
encoder_/decoder_segment_ids and encoder_/decoder_positions. task_feature_lengths
are then {"inputs": encoder length, "targets": decoder length}. pack=True
packs training rows with seqio's packing (enc_dec only); eval and decode
inputs (is_training=False) run unpacked whatever pack says, as T5X does.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any

import numpy as np

from paxlike.errors import UserError
from paxlike.inputs.base_input import BaseInput

FEATURE_CONVERTERS = ("prefix_lm", "lm", "enc_dec")
# The enc_dec features a batch carries (the segment ids and positions only when packed);
# seqio may pass others through, which the model would not read.
ENC_DEC_FEATURES = {
    "encoder_input_tokens": np.int32, "decoder_input_tokens": np.int32,
    "decoder_target_tokens": np.int32, "decoder_loss_weights": np.float32,
    "encoder_segment_ids": np.int32, "decoder_segment_ids": np.int32,
    "encoder_positions": np.int32, "decoder_positions": np.int32}


def _seqio(what: str = "this experiment reads SeqIO data"):
  try:
    return importlib.import_module("seqio")
  except ImportError:
    raise UserError(f"{what}, which needs the seqio extra; run pip install -e '.[seqio]'.") \
        from None


def set_tfds_data_dir(path: str) -> str:
  """--tfds_data_dir (Pax's flag): every SeqIO TFDS source reads this directory, whatever
  data dir its task names (seqio's override; a gs:// path is read by TensorFlow).

  Returns:
    The directory, made absolute when local.

  Raises:
    UserError: no seqio extra, or a local path that is not a directory.
  """
  seqio = _seqio("--tfds_data_dir points SeqIO's TFDS sources at a directory")
  if "://" not in path:
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
      raise UserError(f"--tfds_data_dir {path} is not a directory; pass the folder that "
                      "holds the TFDS datasets (<dataset>/<version>/...).")
  seqio.set_tfds_data_dir_override(path)
  return path


@dataclasses.dataclass
class SeqIOInput(BaseInput):
  """Reads `mixture_name` (a seqio task or mixture) at `split_name`."""

  mixture_name: str = ""
  split_name: str = "train"
  task_feature_lengths: dict[str, int] = dataclasses.field(
      default_factory=lambda: {"inputs": 32, "targets": 32})
  feature_converter: str = "prefix_lm"
  task_module: str = ""  # imported first: the module that registers the task
  shuffle: bool | None = None  # None: shuffle training data only
  use_cached: bool = False
  pack: bool = False  # enc_dec training only: several examples per row

  def __post_init__(self) -> None:
    super().__post_init__()
    if self.feature_converter not in FEATURE_CONVERTERS:
      raise UserError(f"feature_converter {self.feature_converter!r} is not one of "
                      f"{FEATURE_CONVERTERS}.")
    if self.pack and self.feature_converter != "enc_dec":
      raise UserError(f"input {self.name!r}: pack=True is supported with the enc_dec feature "
                      f"converter only, not {self.feature_converter!r}; set pack=False.")
    self._seqio = _seqio()
    if self.task_module:
      importlib.import_module(self.task_module)
    try:
      self._task = self._seqio.get_mixture_or_task(self.mixture_name)
    except ValueError:
      raise UserError(f"no seqio task or mixture named {self.mixture_name!r}; check "
                      "mixture_name and task_module.") from None
    self._iter = None
    self._read = 0

  @property
  def packed(self) -> bool:
    """Whether rows hold several examples: pack=True on a training input (eval never packs)."""
    return self.pack and self.is_training

  def _converter(self):
    if self.feature_converter == "enc_dec":
      return self._seqio.EncDecFeatureConverter(pack=self.packed)
    if self.feature_converter == "prefix_lm":
      return self._seqio.PrefixLMFeatureConverter(pack=False, loss_on_targets_only=True)
    return self._seqio.LMFeatureConverter(pack=False)

  def _dataset(self):
    num_hosts, host = self.hosts
    shuffle = self.is_training if self.shuffle is None else self.shuffle
    try:
      ds = self._seqio.get_dataset(
          self.mixture_name, task_feature_lengths=dict(self.task_feature_lengths),
          dataset_split=self.split_name, shuffle=shuffle,
          num_epochs=None if self.repeat else 1, feature_converter=self._converter(),
          shard_info=self._seqio.ShardInfo(index=host, num_shards=num_hosts),
          use_cached=self.use_cached, seed=self.seed)
    except Exception as e:
      # TFDS's: no such dataset in that dir, or (its builder known) no data generated there.
      if not (type(e).__name__ == "DatasetNotFoundError"
              or (isinstance(e, KeyError) and "not been generated" in str(e))):
        raise
      raise UserError(self._tfds_not_found(e)) from None
    return ds.batch(self.batch_size, drop_remainder=self.repeat).as_numpy_iterator()

  def _tfds_not_found(self, error: Exception) -> str:
    tasks = getattr(self._task, "tasks", None) or [self._task]
    where = [f"{s.tfds_dataset.name} from {s.tfds_dataset.data_dir or 'the default TFDS dir'}"
             for s in (t.source for t in tasks) if hasattr(s, "tfds_dataset")]
    text = str(error).strip().strip("\"'")
    first = text.splitlines()[0] if text else type(error).__name__
    return (f"input {self.name!r}: SeqIO task {self.mixture_name!r} reads TFDS "
            f"{', '.join(where) or 'data'}, and it is not there ({first}); pass "
            "--tfds_data_dir=DIR for a folder that has it.")

  def get_next(self) -> dict[str, np.ndarray]:
    if self._iter is None:
      self._iter = self._dataset()
      for _ in range(self._read):
        next(self._iter)
    ex = next(self._iter)  # StopIteration ends a finite input
    self._read += 1
    if self.feature_converter == "enc_dec":
      weight_key = "decoder_loss_weights"
      batch = {k: ex[k].astype(dtype) for k, dtype in ENC_DEC_FEATURES.items() if k in ex}
    else:
      weight_key = "weights"
      weights = ex["decoder_loss_weights"].astype(np.float32)
      batch = {"ids": ex["decoder_input_tokens"].astype(np.int32),
               "labels": ex["decoder_target_tokens"].astype(np.int32), "weights": weights,
               "prompt_lens": (np.argmax(weights > 0, axis=1) + 1).astype(np.int32)}
    n = len(batch[weight_key])
    if n < self.batch_size:  # the last batch of a finite input: pad with weight-0 rows
      pad = self.batch_size - n
      batch = {k: np.concatenate([v, np.repeat(v[-1:], pad, axis=0)]) for k, v in batch.items()}
      batch[weight_key][n:] = 0
    return batch

  def reset(self) -> None:
    self._iter, self._read = None, 0

  def get_state(self) -> dict[str, Any]:
    return {"batches_read": self._read}

  def set_state(self, state: dict[str, Any]) -> None:
    self._iter, self._read = None, int(state.get("batches_read", 0))

  def peek_specs(self) -> dict[str, np.ndarray]:
    clone = dataclasses.replace(self)
    return clone.get_next()

  def ids_to_strings(self, ids: np.ndarray, lengths: np.ndarray | None = None) -> list[str]:
    """Detokenises rows of inputs or targets (up to a length, or to end-of-sequence).

    Uses the targets' vocabulary (an encoder-decoder task's inputs share it, as
    seqio's T5 tasks and the arithmetic tasks do), or the inputs' if the task
    has no targets.
    """
    features = self._task.output_features
    vocab = features["targets" if "targets" in features else "inputs"].vocabulary
    out = []
    for i, row in enumerate(np.asarray(ids)):
      row = row[:int(lengths[i])] if lengths is not None else row
      row = [int(t) for t in row if t != 0]
      out.append(vocab.decode(row))
    return out

  def score(self, targets: list[str], predictions: list[str]) -> dict[str, float]:
    """The task's own metric functions (fn(targets, predictions) -> dict)."""
    out: dict[str, float] = {}
    for fn in self._task.metric_fns:
      out.update({k: float(v) for k, v in fn(targets, predictions).items()})
    return out
