"""paxml.tasks.vision.input_generator: paxml's ImageNet inputs, read by paxlike.

paxml's ImageNetTrain and ImageNetValidation are lingvo input generators over
ImageNet TFRecords (`image/encoded` JPEG bytes and a 1-based
`image/class/label`, the layout of the TPU ResNet scripts' ImageNet
conversion) in IMAGENET_DATA_DIR. Here they are BaseInputs over the same
files, read with tf.data (`pip install -e '.[seqio]'` brings TensorFlow), with
the same preprocessing as paxml's resnet_preprocessing:

- training: a random crop covering 8% to 100% of the image with an aspect ratio
  in [3/4, 4/3] (10 attempts, else the eval crop), resized bicubically to
  data_shape, flipped left-right half the time;
- eval: the central crop of data_shape / (data_shape + 32/224 of it), resized;
- pixels stay float32 in [0, 255]; label_probs is the one-hot of label +
  label_id_offset; weight is 1, and 0 on the rows that pad an eval's last batch.

Training reads every host's share of the files (files[host::hosts]) shuffled,
forever, with each image's crop and flip drawn from (seed, host, its position
in the stream), so a resumed run reads what an uninterrupted one would. Their
configs also give the batch's shapes without reading anything, which is all a
dry run needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from paxlike.errors import UserError
from paxlike.pax import pax_fiddle
from paxlike.pax.base_input import BaseInput

TRAIN_EXAMPLES = 1281167  # ImageNet-1k's training images
EVAL_EXAMPLES = 50000  # and its validation images
IMAGENET_DATA_DIR = "/PATH/TO/IMAGENET_DATA/"  # paxml's placeholder: set it to your copy
CROP_PADDING = 32  # at 224 pixels: the eval crop is 224 / 256 of the shorter side


class ImageNetInput(BaseInput):
  """paxml's BaseImageNetInput (see the module docstring)."""

  file_pattern: str = ""
  num_classes: int = 1000
  data_shape: tuple[int, int, int] = (224, 224, 3)
  label_id_offset: int = -1
  shuffle_buffer_size: int = 10000
  num_samples: int = 0

  SPLIT = "train"

  @classmethod
  def Params(cls) -> pax_fiddle.Config:  # noqa: N802
    """paxml's Params(): the config, its files in IMAGENET_DATA_DIR as it is now."""
    import os

    pattern = "tfrecord:" + os.path.join(IMAGENET_DATA_DIR, f"{cls.SPLIT}-*-of-*")
    examples = TRAIN_EXAMPLES if cls.SPLIT == "train" else EVAL_EXAMPLES
    return pax_fiddle.Config(cls, file_pattern=pattern, num_samples=examples)

  def __post_init__(self) -> None:
    super().__post_init__()
    self.reset()

  # ----------------------------------------------------------------- specs

  def peek_specs(self) -> dict[str, Any]:
    rows, (h, w, d) = self.batch_size, self.data_shape
    return {"image": np.zeros((rows, h, w, d), np.float32),
            "label_probs": np.zeros((rows, self.num_classes), np.float32),
            "weight": np.zeros((rows,), np.float32)}

  # ------------------------------------------------------------- the stream

  def reset(self) -> None:
    self._it: Iterator[dict[str, np.ndarray]] | None = None
    self._served = 0

  def get_state(self) -> dict[str, Any]:
    return {"batches": self._served}

  def set_state(self, state: dict[str, Any]) -> None:
    self.reset()
    self._served = int(state.get("batches", 0))

  def __getstate__(self) -> dict[str, Any]:
    """A copy holds the position, not the open TensorFlow pipeline."""
    return {**self.__dict__, "_it": None}

  def get_next(self) -> dict[str, np.ndarray]:
    if self._it is None:
      self._it = self._batches()
    batch = next(self._it)  # StopIteration ends a finite (eval) epoch
    self._served += 1
    return batch

  def _files(self, tf: Any) -> list[str]:
    pattern = self.file_pattern.removeprefix("tfrecord:")
    files = sorted(tf.io.gfile.glob(pattern)) if pattern else []
    if not files:
      raise UserError(f"{type(self).__name__}: no files match {self.file_pattern!r}; set "
                      "input_generator.IMAGENET_DATA_DIR (or the input's file_pattern) to your "
                      "ImageNet TFRecords (train-*-of-*, validation-*-of-*).")
    hosts, host = self.hosts
    if len(files) < hosts:
      raise UserError(f"{type(self).__name__}: {len(files)} files for {hosts} hosts; each "
                      "host reads files of its own.")
    return files[host::hosts]

  def _batches(self) -> Iterator[dict[str, np.ndarray]]:
    from paxlike.inputs.bert_records import tensorflow

    tf = tensorflow(f"paxml's {type(self).__name__}")
    files = self._files(tf)
    ds = tf.data.Dataset.from_tensor_slices(files)
    if self.is_training:
      ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 16),
                         num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
      seed = int(np.random.SeedSequence([self.seed, self.hosts[1]]).generate_state(1)[0])
      ds = ds.shuffle(self.shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True)
      if self.repeat:
        ds = ds.repeat()
      ds = ds.enumerate().skip(self._served * self.batch_size)
      parse = lambda i, record: self._example(tf, record, tf.stack(  # noqa: E731
          [tf.constant(seed, tf.int64), i]))
    else:
      ds = ds.flat_map(tf.data.TFRecordDataset)
      if self.repeat:
        ds = ds.repeat()
      ds = ds.skip(self._served * self.batch_size)
      parse = lambda record: self._example(tf, record, None)  # noqa: E731
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.batch(self.batch_size, drop_remainder=self.is_training).prefetch(2)
    for image, label in ds.as_numpy_iterator():
      yield self._rows(image, label)

  def _rows(self, image: np.ndarray, label: np.ndarray) -> dict[str, np.ndarray]:
    """A batch, the rows that pad an eval's last one weighing 0."""
    n, rows = len(label), self.batch_size
    weight = np.zeros((rows,), np.float32)
    weight[:n] = 1.0
    ids = np.clip(label + self.label_id_offset, 0, self.num_classes - 1)
    probs = np.zeros((rows, self.num_classes), np.float32)
    probs[np.arange(n), ids] = 1.0
    full = np.zeros((rows, *image.shape[1:]), np.float32)
    full[:n] = image
    return {"image": full, "label_probs": probs, "weight": weight}

  def _example(self, tf: Any, record: Any, seed: Any) -> tuple[Any, Any]:
    features = tf.io.parse_single_example(record, {
        "image/encoded": tf.io.FixedLenFeature((), tf.string, default_value=""),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64, default_value=-1)})
    size = self.data_shape[0]
    encoded = features["image/encoded"]
    image = (_random_crop(tf, encoded, size, seed) if seed is not None
             else _center_crop(tf, encoded, size))
    if seed is not None:
      image = tf.image.stateless_random_flip_left_right(image, seed=seed + 1)
    image = tf.reshape(tf.cast(image, tf.float32), self.data_shape)
    return image, tf.cast(features["image/class/label"], tf.int32)


def _center_crop(tf: Any, encoded: Any, size: int) -> Any:
  """The central square of size / (size + padding) of the shorter side, resized to size."""
  shape = tf.image.extract_jpeg_shape(encoded)
  height, width = shape[0], shape[1]
  padding = round(size * CROP_PADDING / 224)
  side = tf.cast(size / (size + padding) * tf.cast(tf.minimum(height, width), tf.float32),
                 tf.int32)
  window = tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])
  image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
  return tf.image.resize([image], [size, size], method="bicubic")[0]


def _random_crop(tf: Any, encoded: Any, size: int, seed: Any) -> Any:
  """A crop of 8% to 100% of the image, aspect ratio 3/4 to 4/3, resized to size; the
  center crop where 10 draws found none (the draw is then the whole image)."""
  shape = tf.image.extract_jpeg_shape(encoded)
  begin, extent, _ = tf.image.stateless_sample_distorted_bounding_box(
      shape, bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seed,
      min_object_covered=0.1, aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0),
      max_attempts=10, use_image_if_no_bounding_boxes=True)
  window = tf.stack([begin[0], begin[1], extent[0], extent[1]])
  whole = tf.reduce_all(tf.equal(extent[:2], shape[:2]))
  return tf.cond(
      whole, lambda: _center_crop(tf, encoded, size),
      lambda: tf.image.resize([tf.image.decode_and_crop_jpeg(encoded, window, channels=3)],
                              [size, size], method="bicubic")[0])


class ImageNetTrain(ImageNetInput):
  """paxml's ImageNetTrain: train-*-of-* in IMAGENET_DATA_DIR."""

  SPLIT = "train"


class ImageNetValidation(ImageNetInput):
  """paxml's ImageNetValidation: validation-*-of-* in IMAGENET_DATA_DIR."""

  SPLIT = "validation"


__all__ = ["EVAL_EXAMPLES", "IMAGENET_DATA_DIR", "TRAIN_EXAMPLES", "ImageNetInput",
           "ImageNetTrain", "ImageNetValidation"]
