"""SeqIOInput: a seqio task or mixture as a BaseInput (the `[seqio]` extra).

seqio and TensorFlow are imported only when such an input is built, so the
core never needs them; without the extra, building one is a UserError that
names the pip command. Hosts read disjoint shards through
seqio.ShardInfo(infeed_host_index, num_infeed_hosts). A finite eval input
pads its last batch with weight-0 rows. The stream position saved with
checkpoints is the number of batches read; restoring replays the
deterministic (seeded) stream up to it.

Feature converters: "prefix_lm" and "lm" give the decoder-only features
(ids, labels, weights, prompt_lens); "decoder" gives them as Pax's
LanguageModelFeatures does (seqio.DecoderFeatureConverter, a prefix LM when
the task has inputs, then Pax's weights: see pax_decoder_batch), with its
bos_id, eos_id, reverse_bos_padding and weights_on_targets_only; "enc_dec"
(seqio.EncDecFeatureConverter) gives T5X's encoder-decoder features under
the same names as TextInput's enc_dec converter: encoder_input_tokens,
decoder_input_tokens, decoder_target_tokens, decoder_loss_weights, and, when
packed, encoder_/decoder_segment_ids and encoder_/decoder_positions.
task_feature_lengths are then {"inputs": encoder length, "targets": decoder length}. pack=True
packs training rows with seqio's packing: a decoder-only row then also has
segment_ids (1, 2, ... per example, 0 on padding) and segment_pos; eval and
decode inputs (is_training=False) run unpacked whatever pack says, as T5X and
Pax's C4 inputs do. prepacked=True reads rows a task has already packed
(decoder_input_tokens, decoder_target_tokens, decoder_loss_weights and, when
present, decoder_segment_ids / decoder_positions), as Pax's
PackedLanguageModelFeatures does. The decoder converter's batches also carry
Pax's eval_sample_weights (per row: 1, or 0 for a row padding the last batch).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any

import numpy as np

from paxlike.errors import UserError
from paxlike.inputs.base_input import BaseInput

FEATURE_CONVERTERS = ("prefix_lm", "lm", "decoder", "enc_dec")
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


def _segments(ex: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """A packed decoder row's segment_ids and segment_pos (none for an unpacked row)."""
  if "decoder_segment_ids" not in ex:
    return {}
  return {"segment_ids": ex["decoder_segment_ids"].astype(np.int32),
          "segment_pos": ex["decoder_positions"].astype(np.int32)}


def _shift_left(x: np.ndarray, fill: float) -> np.ndarray:
  return np.concatenate([x[:, 1:], np.full_like(x[:, :1], fill)], axis=1)


def pax_decoder_batch(ex: dict[str, np.ndarray], weights_on_targets_only: bool | None,
                      reverse_bos_padding: bool, eos_id: int) -> dict[str, np.ndarray]:
  """A batch of seqio decoder features as Pax's LanguageModelFeatures makes it.

  weights are 1 on every non-padding position, a prefix LM's inputs included;
  weights_on_targets_only None or True zeroes positions whose label is negative,
  True also every position outside the targets. Negative ids count as their
  absolute values. reverse_bos_padding: ids are the labels (no BOS in front),
  and labels and weights move one to the left, the last label eos_id with weight 0.
  """
  loss = ex["decoder_loss_weights"] > 0
  causal = ex.get("decoder_causal_attention")
  weights = (loss if causal is None else loss | (causal > 0)).astype(np.float32)
  labels = ex["decoder_target_tokens"].astype(np.int32)
  if weights_on_targets_only is None or weights_on_targets_only:
    weights *= labels >= 0
  if weights_on_targets_only:
    weights *= loss
  ids, labels = np.abs(ex["decoder_input_tokens"].astype(np.int32)), np.abs(labels)
  if causal is not None:  # a prefix LM's prompt: BOS and the inputs
    prompt_lens = np.sum(causal > 0, axis=1)
  else:
    prompt_lens = np.argmax(loss, axis=1) + 1
  if reverse_bos_padding:
    ids, labels, weights = labels, _shift_left(labels, eos_id), _shift_left(weights, 0.0)
    prompt_lens = prompt_lens - 1
  return {"ids": ids, "labels": labels, "weights": weights,
          "prompt_lens": prompt_lens.astype(np.int32), **_segments(ex)}


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
  pack: bool = False  # training only: several examples per row
  prepacked: bool = False  # decoder: the task's rows are packed already (no converter)
  # The "decoder" converter's settings, Pax's LanguageModelFeatures' (see pax_decoder_batch).
  weights_on_targets_only: bool | None = None
  bos_id: int = 0
  eos_id: int = 1
  reverse_bos_padding: bool = False

  def __post_init__(self) -> None:
    super().__post_init__()
    if self.feature_converter not in FEATURE_CONVERTERS:
      raise UserError(f"feature_converter {self.feature_converter!r} is not one of "
                      f"{FEATURE_CONVERTERS}.")
    if self.prepacked and (self.feature_converter != "decoder" or self.pack):
      raise UserError(f"input {self.name!r}: prepacked=True reads rows the task packed "
                      "already, with the decoder converter and pack=False.")
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
    """Whether rows hold several examples: pack=True on a training input (eval never packs),
    or rows the task packed."""
    return (self.pack and self.is_training) or self.prepacked

  def _converter(self):
    if self.feature_converter == "enc_dec":
      return self._seqio.EncDecFeatureConverter(pack=self.packed)
    if self.feature_converter == "prefix_lm":
      return self._seqio.PrefixLMFeatureConverter(pack=self.packed, loss_on_targets_only=True)
    if self.feature_converter == "decoder":
      if self.prepacked:
        return self._seqio.PassThroughFeatureConverter()
      return self._seqio.DecoderFeatureConverter(pack=self.packed, loss_on_targets_only=True,
                                                 bos_id=self.bos_id)
    return self._seqio.LMFeatureConverter(pack=self.packed)

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
    elif self.feature_converter == "decoder":
      weight_key = "weights"
      batch = pax_decoder_batch(ex, self.weights_on_targets_only, self.reverse_bos_padding,
                                self.eos_id)
      if self.prepacked and "segment_ids" not in batch:  # one example a row, as Pax reads it
        batch["segment_ids"] = (ex["decoder_loss_weights"] > 0).astype(np.int32)
        batch["segment_pos"] = batch["segment_ids"] * np.arange(
            batch["ids"].shape[1], dtype=np.int32)
      # Pax's per-row weight: 1 for a row read, 0 for a row padding the last eval batch.
      batch["eval_sample_weights"] = np.ones(len(batch["ids"]), np.float32)
    else:
      weight_key = "weights"
      weights = ex["decoder_loss_weights"].astype(np.float32)
      batch = {"ids": ex["decoder_input_tokens"].astype(np.int32),
               "labels": ex["decoder_target_tokens"].astype(np.int32), "weights": weights,
               "prompt_lens": (np.argmax(weights > 0, axis=1) + 1).astype(np.int32),
               **_segments(ex)}
    n = len(batch[weight_key])
    if n < self.batch_size:  # the last batch of a finite input: pad with weight-0 rows
      pad = self.batch_size - n
      batch = {k: np.concatenate([v, np.repeat(v[-1:], pad, axis=0)]) for k, v in batch.items()}
      batch[weight_key][n:] = 0
      if "eval_sample_weights" in batch:
        batch["eval_sample_weights"][n:] = 0
    return batch

  def reset(self) -> None:
    self._iter, self._read = None, 0

  def get_state(self) -> dict[str, Any]:
    return {"batches_read": self._read}

  def set_state(self, state: dict[str, Any]) -> None:
    self._iter, self._read = None, int(state.get("batches_read", 0))

  def peek_specs(self) -> dict[str, np.ndarray]:
    """A batch of zeros with the shapes and dtypes get_next gives, from the settings alone
    (a dry run reads no data: a TFDS copy of C4 need not be on the machine that plans)."""
    lengths = self.task_feature_lengths
    rows = self.batch_size
    if self.feature_converter == "enc_dec":
      shapes = {k: lengths["inputs" if k.startswith("encoder") else "targets"]
                for k in ENC_DEC_FEATURES if self.packed or not k.endswith(
                    ("segment_ids", "positions"))}
      return {k: np.zeros((rows, n), ENC_DEC_FEATURES[k]) for k, n in shapes.items()}
    prefix = self.feature_converter == "prefix_lm" or (
        self.feature_converter == "decoder" and "inputs" in lengths)
    length = int(lengths["targets"]) + (int(lengths["inputs"]) if prefix else 0)
    keys = ("ids", "labels", "weights") + (("segment_ids", "segment_pos") if self.packed
                                           else ())
    specs = {k: np.zeros((rows, length), np.float32 if k == "weights" else np.int32)
             for k in keys}
    specs["prompt_lens"] = np.zeros((rows,), np.int32)
    if self.feature_converter == "decoder":
      specs["eval_sample_weights"] = np.zeros((rows,), np.float32)
    return specs

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
