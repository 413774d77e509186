"""ExportJob: what an exporter knows about the run besides the parameters' values.

The model contract names the features decode reads but not their shapes, and
nothing in it says how text becomes those features; both come from the
experiment's decode input (the input the job's own decode runs read):

  * per-row shapes and dtypes: one batch of that input (a feature the batch
    lacks is a per-row scalar, as the LM's prompt_lens is);
  * the vocabulary: a TextInput's byte, SentencePiece or tokenizer.json vocabulary; other
    inputs (synthetic streams, SeqIO) give an export over token ids only, unless the
    experiment has no decode input and its own text settings read a tokenizer (the job's
    recorded one: text_source);
  * how a prompt's text becomes ids: a per-row [L] feature holds the
    prompt's ids (padded with pad_id, cut at L), a per-row scalar holds how
    many there are, and an EOS is appended when the model's own prompts
    (model.prompt_and_target on that batch) end with one (T5's encoder
    inputs do; the LM's prompts do not).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from paxlike.errors import UserError

PLATFORMS = ("cpu", "cuda", "tpu")
MAX_EXAMPLES = 2  # prompts kept for warm-up requests and the manifest's example
EXAMPLE_PROMPTS = ("hello world", "1+1=")  # text_source's, for an experiment that decodes nothing


@dataclasses.dataclass(frozen=True)
class Feature:
  """One decode input of the exported function: per-row shape and dtype.

  text: how a prompt's text fills it: "tokens" (the ids), "num_tokens" (how
    many), or None (the export has no text path for this feature).
  """

  name: str
  shape: tuple[int, ...]
  dtype: str
  text: str | None


@dataclasses.dataclass(frozen=True)
class ExportJob:
  """Everything about one export except the restored parameter values.

  Attributes:
    experiment: the registry key of the experiment class.
    model: the model that decodes for the task's (unbound; a scanned or pipelined
      model's unrolled twin, paxlike.decoding.decoding_model).
    settings: paxlike.decoding.DecodeSettings from the --decode_* flags.
    abstract_params: model's parameters' ShapeDtypeStructs (the train state's, restacked).
    features: the model's decode_features(), in order, with per-row shapes.
    vocabulary: the manifest's vocabulary entry ({"kind": "none"} without text).
    append_eos: text prompts end with EOS before padding (None: no text path).
    examples: up to MAX_EXAMPLES rows of the decode input's features.
    example_texts: the same rows' prompts as text (empty without a vocabulary).
    platforms: what the StableHLO is lowered for.
    job_log_dir: the job exported (recorded in the manifest).
    vocab: the decode input's vocabulary object (None without one).
  """

  experiment: str
  model: Any
  settings: Any
  abstract_params: Any
  features: tuple[Feature, ...]
  vocabulary: dict[str, Any]
  append_eos: bool | None
  examples: dict[str, np.ndarray]
  example_texts: tuple[str, ...]
  platforms: tuple[str, ...]
  job_log_dir: str
  vocab: Any = None

  @property
  def has_text(self) -> bool:
    return self.append_eos is not None


def parse_platforms(spec: str) -> tuple[str, ...]:
  """'cpu,cuda,tpu' -> ('cpu', 'cuda', 'tpu'), checked."""
  names = tuple(p.strip().lower() for p in spec.split(",") if p.strip())
  unknown = [p for p in names if p not in PLATFORMS]
  if not names or unknown:
    raise UserError(f"--export_platforms={spec!r}: name one or more of {', '.join(PLATFORMS)} "
                    "(comma-separated).")
  return tuple(dict.fromkeys(names))


def vocabulary_of(inp: Any) -> dict[str, Any]:
  """The manifest's description of an input's vocabulary.

  kind "byte", "sentencepiece" (model_file: the .model) or "hf_tokenizer" (model_file:
  a tokenizer.json); file kinds add bos_id, add_bos (BOS starts every prompt), skip_ids
  (special ids decoding drops) and clean_up (transformers' clean_up_tokenization_spaces);
  a SentencePiece model with tokens past its pieces (T5's <extra_id_N>) adds added_tokens.
  """
  from paxlike.inputs import vocabulary as vocab_lib

  vocab = getattr(inp, "vocab", None)
  if isinstance(vocab, vocab_lib.ByteVocabulary):
    return {"kind": "byte", "offset": vocab.offset, "pad_id": vocab.pad_id,
            "eos_id": vocab.eos_id, "size": vocab.vocab_size}
  if isinstance(vocab, vocab_lib.SentencePieceVocabulary | vocab_lib.TokenizerJsonVocabulary):
    kind = ("sentencepiece" if isinstance(vocab, vocab_lib.SentencePieceVocabulary)
            else "hf_tokenizer")
    return {"kind": kind, "model_file": vocab.spec, "pad_id": vocab.pad_id,
            "eos_id": vocab.eos_id, "bos_id": vocab.bos_id, "add_bos": vocab.add_bos,
            "size": vocab.vocab_size, "skip_ids": sorted(vocab.skip_ids),
            "clean_up": vocab.clean_up, **({"added_tokens": dict(vocab.added_tokens)}
                                           if getattr(vocab, "added_tokens", None) else {})}
  return {"kind": "none"}


def example_prompts(split: str) -> list[dict[str, str]]:
  """The prompts text_source's input reads (a TextInput generator)."""
  del split
  return [{"inputs": p} for p in EXAMPLE_PROMPTS]


def text_source(own_input: Callable[[], Any] | None, source_dir: str | None,
                job_log_dir: str) -> list[Any]:
  """The input an export reads its text path from when the experiment decodes nothing.

  An experiment that trains on a stream of ids (LlamaTiny's synthetic data) and on
  TRAIN_FILES alike has no decode input to tell how its text becomes ids; its own text
  settings (FilesDataset.infer_input: lengths, feature converter) over EXAMPLE_PROMPTS do,
  when their vocabulary resolves to a tokenizer (the job's recorded one, VOCABULARY's or
  INIT_FROM's). Bytes are not assumed: the ids might be anything.

  Returns:
    [the TextInput config], or [] (the export then has no text path).
  """
  from paxlike.inputs import text

  if own_input is None:
    return []
  try:
    cfg = own_input()
  except UserError:  # a model template that reads no text files: an export over ids, as before
    return []
  cfg.file_pattern, cfg.generator, cfg.input_key = "", f"{__name__}:example_prompts", "inputs"
  cfg.name = "export"
  text.resolve_vocabularies([cfg], source_dir, job_log_dir)
  return [] if cfg.vocabulary in (None, "byte") else [cfg]


def _text_roles(features: list[tuple[str, tuple[int, ...]]]) -> dict[str, str] | None:
  """Per feature, how text fills it; None when some feature has no text reading."""
  roles = {}
  for name, shape in features:
    if len(shape) == 1:
      roles[name] = "tokens"
    elif len(shape) == 0:
      roles[name] = "num_tokens"
    else:
      return None
  return roles if list(roles.values()).count("tokens") == 1 else None


def describe(experiment: str, task: Any, train_input: Any, decode_inputs: list[Any],
             settings: Any, platforms: tuple[str, ...], job_log_dir: str) -> ExportJob:
  """Builds the ExportJob of a run (nothing written, nothing compiled).

  Args:
    experiment: the experiment's registry key.
    task: the built task (its model and learner).
    train_input: the training input (abstract parameters are traced from it).
    decode_inputs: the experiment's decode inputs; the first describes the
      decode features (the training input stands in when there is none).
    settings: the DecodeSettings to export.
    platforms: parse_platforms' result.
    job_log_dir: recorded in the manifest.
  """
  from paxlike import decoding, resume

  model = task.model
  source = decode_inputs[0] if decode_inputs else train_input
  batch = source.peek_specs()
  names = tuple(model.decode_features())
  shapes = [(n, tuple(np.shape(batch[n])[1:]) if n in batch else ()) for n in names]
  vocabulary = vocabulary_of(source)
  roles = _text_roles(shapes) if vocabulary["kind"] != "none" else None
  prompts, _, real = model.prompt_and_target(batch)
  rows = [int(r) for r in np.flatnonzero(real)[:MAX_EXAMPLES]] or [0]
  append_eos = None
  texts: tuple[str, ...] = ()
  if roles is not None:
    eos = vocabulary["eos_id"]
    nonempty = [p for p in prompts if len(p)]
    append_eos = bool(nonempty) and all(int(p[-1]) == eos for p in nonempty)
    texts = tuple(source.ids_to_strings(np.asarray(prompts[r])[None])[0] for r in rows)
  features = tuple(
      Feature(n, shape, np.dtype(batch[n].dtype if n in batch else np.int32).name,
              roles.get(n) if roles else None) for n, shape in shapes)
  examples = {n: (np.asarray(batch[n])[rows] if n in batch else
                  np.asarray([len(prompts[r]) for r in rows], np.int32)) for n in names}
  # A scanned or pipelined model exports as its unrolled twin: the artifact of the same
  # model trained unrolled and without a pipeline (main restacks the restored parameters
  # alike).
  model, abstract = decoding.decoding_model(
      model, resume.abstract_train_state(task, train_input).params)
  return ExportJob(experiment=experiment, model=model, settings=settings,
                   abstract_params=abstract, features=features, vocabulary=vocabulary,
                   append_eos=append_eos, examples=examples, example_texts=texts,
                   platforms=platforms, job_log_dir=job_log_dir,
                   vocab=getattr(source, "vocab", None))
