#!/usr/bin/env python3
"""Runs a paxlike StableHLO export with jax, numpy, safetensors and flatbuffers (no paxlike).

Text exports also need sentencepiece (a SentencePiece vocabulary) or tokenizers (a
Hugging Face tokenizer.json); the manifest's vocabulary kind says which.

--mode=export --export_format=stablehlo copies this file into the export as
run.py, next to model.stablehlo, params.safetensors and manifest.json:

    python run.py EXPORT_DIR "37+45=" "12+30="     # text prompts, when the export has text
    python run.py EXPORT_DIR --ids '{"ids": [[54, 58, 46, 55, 56, 64, 0, 0]], "prompt_lens": [6]}'
    python run.py EXPORT_DIR --seed 7 "37+45="    # exports that sample draw with this seed

It prints one JSON object per row: the prompt, the generation (text when
the export has a vocabulary), its token ids and score, and every beam
under beam search. As a module:

    import run
    decode = run.load(EXPORT_DIR)
    tokens, scores = decode({"ids": ids, "prompt_lens": lens}, seed=0)
    rows = decode.generate(["37+45="])

Everything this file does is what manifest.json says: the program's
arguments in order (the parameters first, as a flat list in the manifest's
order), each input's name, dtype and shape ("b" is the batch size, any
value), and how text becomes those inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

FORMAT = "paxlike.stablehlo"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
BATCH_DIM = "b"


# What run.py needs besides numpy (jax.export reads the program with flatbuffers), and per
# vocabulary kind: sentencepiece or tokenizers.
REQUIRES = ("jax", "safetensors", "flatbuffers")
# transformers' clean_up_tokenization_spaces, for exports whose tokenizer asks for it.
CLEANUPS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


class ExportError(ValueError):
  """The export directory or the inputs given to it are not usable."""


def _require(name: str, why: str) -> Any:
  """import name, or an ExportError saying which package to install."""
  import importlib

  try:
    return importlib.import_module(name)
  except ImportError:
    raise ExportError(f"{why} and needs the {name} package; pip install {name}.") from None


def read_manifest(export_dir: str) -> dict[str, Any]:
  """manifest.json of an export, checked to be one this runner understands."""
  path = os.path.join(export_dir, MANIFEST)
  try:
    with open(path) as f:
      manifest = json.load(f)
  except FileNotFoundError:
    raise ExportError(f"{export_dir} has no {MANIFEST}; is it a paxlike StableHLO "
                      "export?") from None
  if manifest.get("format") != FORMAT:
    raise ExportError(f"{path} describes a {manifest.get('format')!r} export, not {FORMAT}.")
  if int(manifest.get("format_version", 0)) > FORMAT_VERSION:
    raise ExportError(f"{path} has format_version {manifest['format_version']}; this runner "
                      f"reads up to {FORMAT_VERSION}: use the run.py inside that export.")
  return manifest


class Decoder:
  """A loaded export: call it on token ids, or generate() from text.

  Attributes:
    manifest: the export's manifest.json.
    exported: the jax.export.Exported program.
    params: its parameters, on the default device, in the manifest's order.
  """

  def __init__(self, export_dir: str) -> None:
    for name in REQUIRES:
      _require(name, "run.py runs the exported program")
    import jax
    from safetensors.numpy import load_file

    self.export_dir = export_dir
    self.manifest = read_manifest(export_dir)
    function = self.manifest["function"]
    with open(os.path.join(export_dir, function["file"]), "rb") as f:
      self.exported = jax.export.deserialize(bytearray(f.read()))
    weights = load_file(os.path.join(export_dir, self.manifest["params"]["file"]))
    self.params = []
    for t in self.manifest["params"]["tensors"]:
      if t["name"] not in weights:
        raise ExportError(f"{self.manifest['params']['file']} has no tensor {t['name']!r}.")
      w = weights[t["name"]]
      if list(w.shape) != list(t["shape"]) or w.dtype != np.dtype(t["dtype"]):
        raise ExportError(f"tensor {t['name']!r} is {w.dtype}{list(w.shape)}; the manifest "
                          f"says {t['dtype']}{t['shape']}.")
      self.params.append(jax.device_put(w))
    self.inputs = {i["name"]: i for i in self.manifest["inputs"]}
    self.arguments = function["arguments"]
    self._call = jax.jit(self.exported.call)  # one compile per batch size
    self._tok: Any = None

  # ----------------------------------------------------------- token ids

  def __call__(self, features: Mapping[str, Any] | None = None, seed: int = 0,
               **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
    """Decodes a batch of token-id features.

    Args:
      features: the manifest's inputs (all but the seed) by name.
      seed: the sampling seed (unused by greedy and beam-search exports).
      **kwargs: more features by name.

    Returns:
      (tokens [b, K, T] int32, scores [b, K] float32), numpy.
    """
    given = {**(features or {}), **kwargs}
    seed_name = self.manifest["function"]["seed"]
    given[seed_name] = seed
    unknown = sorted(set(given) - set(self.inputs))
    if unknown:
      raise ExportError(f"unknown inputs {unknown}; the export takes {sorted(self.inputs)}.")
    arrays, batch = {}, None
    for name, spec in self.inputs.items():
      if name not in given:
        raise ExportError(f"missing input {name!r} ({spec['dtype']}{spec['shape']}).")
      a = np.asarray(given[name])
      if a.ndim != len(spec["shape"]) or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
        raise ExportError(f"input {name!r} must be integers of shape {spec['shape']}, got "
                          f"{a.dtype}{list(a.shape)}.")
      for dim, want in zip(a.shape, spec["shape"], strict=True):
        if want == BATCH_DIM:
          if batch not in (None, dim):
            raise ExportError(f"inputs disagree on the batch size ({batch} vs {dim}).")
          batch = dim
        elif dim != want:
          raise ExportError(f"input {name!r} must have shape {spec['shape']}, got "
                            f"{list(a.shape)}.")
      arrays[name] = a.astype(spec["dtype"])
    if batch == 0:
      raise ExportError("the batch is empty; the program is exported for batch sizes >= 1.")
    args = [self.params if a == "params" else arrays[a] for a in self.arguments]
    tokens, scores = self._call(*args)
    return np.asarray(tokens), np.asarray(scores)

  # ---------------------------------------------------------------- text

  @property
  def has_text(self) -> bool:
    return self.manifest.get("text") is not None

  def _tokenizer(self) -> Any:
    """The export's SentencePiece processor or `tokenizers` Tokenizer (loaded once)."""
    if self._tok is None:
      vocab = self.manifest["vocabulary"]
      path = os.path.join(self.export_dir, vocab["model_file"])
      if vocab["kind"] == "sentencepiece":
        spm = _require("sentencepiece", "this export's vocabulary is SentencePiece")
        self._tok = spm.SentencePieceProcessor(model_file=path)
      else:
        tokenizers = _require("tokenizers", "this export's vocabulary is a tokenizer.json")
        self._tok = tokenizers.Tokenizer.from_file(path)
    return self._tok

  def tokenize(self, text: str) -> list[int]:
    """A prompt's ids (BOS first where the tokenizer adds one; before the EOS the export
    may append)."""
    vocab = self.manifest["vocabulary"]
    if vocab["kind"] == "byte":
      return [b + vocab["offset"] for b in text.encode("utf-8")]
    bos = [vocab["bos_id"]] if vocab.get("add_bos") else []
    if vocab["kind"] == "sentencepiece":
      added = vocab.get("added_tokens") or {}
      if not added:
        return bos + list(self._tokenizer().encode(text))
      ids = list(bos)  # T5's <extra_id_N> written in the text are their ids, the rest pieces
      pattern = "(" + "|".join(map(re.escape, sorted(added, key=len, reverse=True))) + ")"
      for part in re.split(pattern, text):
        if part in added:
          ids.append(added[part])
        elif part.strip():
          ids.extend(self._tokenizer().encode(part))
      return ids
    if vocab["kind"] == "hf_tokenizer":
      return bos + list(self._tokenizer().encode(text, add_special_tokens=False).ids)
    raise ExportError("this export has no vocabulary; pass token ids (--ids).")

  def detokenize(self, ids: Sequence[int]) -> str:
    """Ids up to the first EOS as text (pad and special ids dropped)."""
    vocab = self.manifest["vocabulary"]
    ids = [int(i) for i in ids]
    if vocab["eos_id"] in ids:
      ids = ids[:ids.index(vocab["eos_id"])]
    if vocab["kind"] == "byte":
      off = vocab["offset"]
      return bytes(i - off for i in ids if off <= i < off + 256).decode("utf-8", "replace")
    skip = {vocab["pad_id"], *vocab.get("skip_ids", ())}
    ids = [i for i in ids if i not in skip and 0 <= i < vocab["size"]]
    if vocab["kind"] == "sentencepiece":
      sp = self._tokenizer()
      # As transformers' Metaspace decoder: only the first leading '\u2581' is dropped.
      lead = 0
      for i in ids:
        piece = sp.id_to_piece(i)
        lead += len(piece) - len(piece.lstrip("\u2581"))
        if piece.strip("\u2581"):
          break
      text = " " * max(lead - 1, 0) + sp.decode(ids)
    elif vocab["kind"] == "hf_tokenizer":
      text = self._tokenizer().decode(ids, skip_special_tokens=True)
    else:
      raise ExportError("this export has no vocabulary.")
    for old, new in CLEANUPS if vocab.get("clean_up") else ():
      text = text.replace(old, new)
    return text

  def encode(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
    """Text prompts -> the export's input features, as the experiment's input builds them."""
    if not self.has_text:
      raise ExportError("this export has no text path (its experiment reads no vocabulary "
                        "paxlike knows); pass token ids (--ids).")
    vocab, text = self.manifest["vocabulary"], self.manifest["text"]
    width = next(s["shape"][1] for s in self.inputs.values() if s.get("text") == "tokens")
    # The prompt's ids (+ EOS where the experiment's input appends one), cut at the width.
    full = [self.tokenize(t) + ([vocab["eos_id"]] if text["append_eos"] else []) for t in texts]
    cut = sum(len(ids) > width for ids in full)
    if cut:  # as --mode=infer says it
      print(f"warning: {cut} of {len(full)} prompts were longer than the export's {width} "
            "input tokens and were cut", file=sys.stderr)
    # A cut prompt keeps its EOS, as the experiment's input (seqio's append_eos_after_trim).
    rows = [ids if len(ids) <= width else ids[:width - 1] + ids[-1:] if text["append_eos"]
            else ids[:width] for ids in full]
    out = {}
    for name, spec in self.inputs.items():
      if spec.get("text") == "tokens":
        out[name] = np.full((len(rows), width), vocab["pad_id"], spec["dtype"])
        for r, ids in enumerate(rows):
          out[name][r, :len(ids)] = ids
      elif spec.get("text") == "num_tokens":
        out[name] = np.asarray([len(ids) for ids in rows], spec["dtype"])
    return out

  def generate(self, texts: Sequence[str], seed: int = 0) -> list[dict[str, Any]]:
    """Decodes text prompts; one dict per prompt (see the module docstring)."""
    tokens, scores = self(self.encode(texts), seed=seed)
    return [self._row(t, tokens[r], scores[r]) for r, t in enumerate(texts)]

  def _row(self, prompt: Any, tokens: np.ndarray, scores: np.ndarray) -> dict[str, Any]:
    text = self.has_text
    row = {"prompt": prompt, "tokens": tokens[0].tolist(), "score": float(scores[0])}
    if text:
      row["generation"] = self.detokenize(tokens[0])
    if len(tokens) > 1:
      row["beams"] = [{"tokens": t.tolist(), "score": float(s),
                       **({"generation": self.detokenize(t)} if text else {})}
                      for t, s in zip(tokens, scores, strict=True)]
    return row


def load(export_dir: str) -> Decoder:
  """Loads an export directory; the result decodes (see Decoder)."""
  return Decoder(os.path.abspath(os.path.expanduser(export_dir)))


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("export_dir", help="the export directory (holds manifest.json)")
  parser.add_argument("prompts", nargs="*", help="text prompts")
  parser.add_argument("--ids", help="a JSON object of token-id inputs by name")
  parser.add_argument("--seed", type=int, default=0, help="sampling seed")
  args = parser.parse_args(argv)
  try:
    decoder = load(args.export_dir)
    if args.ids:
      given = json.loads(args.ids)
      if not isinstance(given, dict):
        raise ExportError(f"--ids must be a JSON object of token-id inputs by name, e.g. "
                          f'{{"ids": [[1, 2]], "prompt_lens": [2]}}, not a {type(given).__name__}.')
      features = {k: np.asarray(v) for k, v in given.items()}
      tokens, scores = decoder(features, seed=args.seed)
      rows = [decoder._row({k: v[r].tolist() for k, v in features.items()}, tokens[r],
                           scores[r]) for r in range(len(tokens))]
    elif args.prompts:
      rows = decoder.generate(args.prompts, seed=args.seed)
    else:
      parser.error("give text prompts or --ids")
  except (ExportError, json.JSONDecodeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  for row in rows:
    print(json.dumps(row))
  return 0


if __name__ == "__main__":
  sys.exit(main())
