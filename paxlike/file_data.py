"""FilesDataset: train, evaluate and decode on your own files, no code.

Every shipped data mixin is a FilesDataset, so every shipped experiment
takes these settings (`--set` or a subclass):

    TRAIN_FILES = ["data/train.jsonl"]   # paths or globs: .jsonl, .json, .csv, .tsv, or text
    EVAL_FILES = ["data/test.jsonl"]     # the eval set; the decode set too if all rows have targets
    INPUT_KEY, TARGET_KEY                # the fields of (input, target) rows
    METRICS = ["rouge", "bleu"]          # decode metrics besides exact match (the metrics extra)
    PACK = True                          # several examples per training row
    VOCABULARY                           # "byte", a SentencePiece .model file, or a checkpoint dir

With TRAIN_FILES set the files replace the experiment's own training data
(its synthetic stream or generator); with EVAL_FILES set they replace its
eval and decode sets. A file is read by its extension
(paxlike.inputs.text.read_rows: JSON Lines, a JSON array of objects, a CSV /
TSV table with a header row, or text lines). A row is
`{INPUT_KEY, TARGET_KEY}` (encoder-decoder: inputs -> targets; decoder-only:
prompt + completion, the loss on the completion and EOS), plain text (a
`.txt` line or a `text` field; the loss everywhere) or, decoder-only,
`{"messages": [...]}` rendered with the checkpoint's chat template (the
loss on the assistant turns). The template comes from the Hugging Face
directory of VOCABULARY or INIT_FROM (hf:DIR).

A family template says how its model reads text (feature converter and
lengths) in `file_input_settings()` (this mixin comes before it in the MRO
and defines none); a data mixin keeps its own data in
`own_datasets()` / `own_decode_datasets()` and names, in
`_replaced_by_files`, the settings that only its own data reads.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

import fiddle as fdl

from paxlike.errors import UserError
from paxlike.experiment import BaseExperiment
from paxlike.inputs import chat as chat_lib
from paxlike.inputs.text import TextInput, lacks_target, read_rows

FILE_SETTINGS = ("INPUT_KEY", "TARGET_KEY", "METRICS", "VOCABULARY")
FILE_LISTS = ("TRAIN_FILES", "EVAL_FILES")  # paths or globs (file_list)


def file_list(value: Any, name: str) -> list[str]:
  """TRAIN_FILES / EVAL_FILES as a list of paths or globs.

  Takes a list, one path, or the bare-word list `--set TRAIN_FILES=[a.jsonl,b.jsonl]`
  leaves as a string.
  """
  if isinstance(value, str):
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
      text = text[1:-1]
    value = [p.strip().strip("'\"") for p in text.split(",")]
  if not isinstance(value, list | tuple) or not all(isinstance(p, str) for p in value):
    raise UserError(f"{name} must be a list of paths or globs, got {value!r}.")
  paths = [os.path.expanduser(p) for p in value if p]
  if not paths:
    raise UserError(f"{name} is empty; give at least one path, e.g. --set "
                    f"{name}='[\"data/{name.split('_')[0].lower()}.jsonl\"]'.")
  return paths


def _name_of(paths: list[str]) -> str:
  """The eval input's name: the file's stem for one file, else 'eval'."""
  if len(paths) == 1 and not glob.has_magic(paths[0]):
    stem = os.path.splitext(os.path.basename(paths[0]))[0]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem) or "eval"
  return "eval"


class FilesDataset(BaseExperiment):
  """Data mixin: TRAIN_FILES / EVAL_FILES, read with the model family's text settings."""

  TRAIN_FILES: list[str] | None = None
  EVAL_FILES: list[str] | None = None
  INPUT_KEY = "inputs"
  TARGET_KEY = "targets"
  METRICS: list[str] = []  # noqa: RUF012  ("rouge", "bleu"; a hyperparameter, not state)
  PACK = False
  # None: the tokenizer this job recorded, else INIT_FROM's Hugging Face directory's, else
  # bytes; or "byte", "hf", a tokenizer.json / SentencePiece .model path or a directory.
  VOCABULARY: str | None = None

  # The settings only the mixin's own data reads (declared unused when the files replace it).
  _replaced_by_files: tuple[str, ...] = ()

  def own_datasets(self) -> list[fdl.Config]:
    """The mixin's own training (and eval) inputs."""
    return []

  def own_decode_datasets(self) -> list[fdl.Config]:
    return []

  def datasets(self) -> list[fdl.Config]:
    train, evals = self.TRAIN_FILES, self.EVAL_FILES
    if train is None and evals is None:
      self.not_used(*FILE_SETTINGS, "PACK", reason="TRAIN_FILES and EVAL_FILES are not set")
      return self.own_datasets()
    if train is None:
      out = [c for c in self.own_datasets() if c.is_training]
    else:
      self.not_used(*self._replaced_by_files, reason="TRAIN_FILES replaces the experiment's "
                    "own data")
      out = [self.file_input("train", file_list(train, "TRAIN_FILES"), training=True)]
    if evals is not None:
      paths = file_list(evals, "EVAL_FILES")
      out.append(self.file_input(_name_of(paths), paths, training=False))
    return out

  def decode_datasets(self) -> list[fdl.Config]:
    if self.TRAIN_FILES is None and self.EVAL_FILES is None:
      return self.own_decode_datasets()
    if self.EVAL_FILES is None:
      return []
    paths = file_list(self.EVAL_FILES, "EVAL_FILES")
    if not _decodes(paths, self.INPUT_KEY, self.TARGET_KEY):
      return []
    return [self.file_input(_name_of(paths), paths, training=False)]

  def file_input(self, name: str, paths: list[str], training: bool) -> fdl.Config[TextInput]:
    """A TextInput config reading these files with this experiment's settings."""
    return fdl.Config(
        TextInput, name=name, file_pattern=",".join(paths), vocabulary=self.vocabulary_spec(),
        input_key=self.INPUT_KEY, target_key=self.TARGET_KEY, pack=bool(self.PACK) and training,
        metrics=tuple(self.METRICS or ()), chat_template_dir=self.chat_template_dir(),
        batch_size=self.per_host_batch_size() if training else self.per_host_eval_batch_size(),
        is_training=training, repeat=training, shuffle=training, reset_for_eval=not training,
        seed=self.TRAINING_SEED, **self._family_settings())

  def _family_settings(self) -> dict[str, Any]:
    # The model template defines file_input_settings(); this mixin precedes it in the MRO,
    # so it must not define a default of its own.
    settings = getattr(self, "file_input_settings", None)
    if settings is None:
      raise UserError(f"{type(self).__name__}'s model template does not say how it reads "
                      "text files (file_input_settings()); TRAIN_FILES / EVAL_FILES need one.")
    return settings()

  def infer_input(self) -> fdl.Config[TextInput]:
    """The input --mode=infer reads --infer_input with, when the experiment decodes nothing."""
    self.not_used("PACK", "METRICS", reason="--mode=infer only predicts")
    return self.file_input("infer", [], training=False)

  def _hf_dir(self) -> str:
    """INIT_FROM's Hugging Face directory, or ''."""
    spec = self.INIT_FROM or ""
    return os.path.expanduser(spec[3:]) if spec.startswith("hf:") else ""

  def vocabulary_spec(self) -> str | None:
    """VOCABULARY as TextInput reads it (main resolves None and "hf" before building)."""
    return self.VOCABULARY

  def chat_template_dir(self) -> str:
    """Where chat rows' template is read: VOCABULARY's directory, else INIT_FROM's (hf:).

    With neither, main gives the input the directory of the tokenizer it resolves
    (paxlike.inputs.text.resolve_vocabularies), --init_from's included.
    """
    vocab = self.VOCABULARY if self.VOCABULARY not in (None, "hf", "byte") else ""
    for d in (vocab, os.path.dirname(vocab), self._hf_dir()):
      if chat_lib.has_template(d):
        return d
    return ""


def _decodes(paths: list[str], input_key: str, target_key: str) -> bool:
  """Whether EVAL_FILES are a decode set too: all their rows have a target to decode
  against (a TARGET_KEY field, or a conversation that ends on the assistant's turn), or
  none has (plain text, conversations that ask for a reply: evaluated, not decoded).

  Raises:
    UserError: an (input, target) row without its target, or rows with targets and rows
      without in one set, naming the first row without.
  """
  with_target, without = "", ""
  for where, n, row in read_rows(",".join(paths)):
    if lacks_target(row, input_key, target_key):
      raise UserError(f"EVAL_FILES {where} {n} has no {target_key!r} field (its fields: "
                      f"{sorted(row)}), so it has no target to evaluate or decode against; set "
                      "TARGET_KEY to the field that holds the target (inputs alone are for "
                      "--mode=infer --infer_input=FILE).")
    if isinstance(row, dict) and "messages" in row:
      if isinstance(row["messages"], list) and chat_lib.ends_on_reply(row["messages"]):
        with_target = with_target or f"{where} {n}"
      else:
        without = without or f"{where} {n} (a conversation that ends on the user's turn)"
    elif isinstance(row, dict) and input_key in row:
      with_target = with_target or f"{where} {n}"
    elif isinstance(row, str) or "text" in row:
      without = without or f"{where} {n} (plain text)"
    # Any other row: TextInput refuses it, naming its fields.
  if with_target and without:
    raise UserError(f"EVAL_FILES {without} has no target to decode against but {with_target} "
                    "has one; give every row of EVAL_FILES a target, or none (then it is "
                    "evaluated, not decoded).")
  return bool(with_target)
