"""--export_format=stablehlo: the decode program as jax.export StableHLO, weights beside it.

    model.stablehlo      Exported.serialize() of serve (paxlike.export.serving)
    params.safetensors   its first argument, float32, one tensor per parameter
    manifest.json        how to call it: argument order, inputs, outputs, vocabulary
    run.py               a runner that needs jax, numpy, safetensors and flatbuffers (plus
                         sentencepiece or tokenizers for text), not paxlike
    vocabulary.model     the SentencePiece model, for exports with one
    tokenizer.json       the Hugging Face tokenizer (manifest kind "hf_tokenizer"), for
                         exports with one
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import jax
import numpy as np

from paxlike.export import runner, serving
from paxlike.export.job import ExportJob

PROGRAM_FILE = "model.stablehlo"
PARAMS_FILE = "params.safetensors"
RUNNER_FILE = "run.py"
SP_MODEL_FILE = "vocabulary.model"
TOKENIZER_FILE = "tokenizer.json"
VOCAB_FILES = {"sentencepiece": SP_MODEL_FILE, "hf_tokenizer": TOKENIZER_FILE}


def _dim(d: Any) -> Any:
  """A shape entry as the manifest writes it: an int, or the symbolic batch's name."""
  return d if isinstance(d, int) else str(d)


def _avals(avals: Any, names: list[str]) -> list[dict[str, Any]]:
  return [{"name": n, "dtype": np.dtype(a.dtype).name, "shape": [_dim(d) for d in a.shape]}
          for n, a in zip(names, avals, strict=True)]


def manifest(job: ExportJob, exported: jax.export.Exported, step: int) -> dict[str, Any]:
  """manifest.json of a StableHLO export, read off the Exported it describes.

  The inputs and outputs are the Exported's own in_avals / out_avals, so the
  manifest cannot disagree with the program.
  """
  import jaxlib

  names = serving.param_names(job.abstract_params)
  num_params = len(names)
  input_names = [f.name for f in job.features] + [serving.SEED_NAME]
  inputs = _avals(exported.in_avals[num_params:], input_names)
  roles = {f.name: f.text for f in job.features}
  for spec in inputs:
    spec["text"] = roles.get(spec["name"])
  model = job.model
  vocabulary = dict(job.vocabulary)
  if vocabulary["kind"] in VOCAB_FILES:
    vocabulary["model_file"] = VOCAB_FILES[vocabulary["kind"]]
  return {
      "format": runner.FORMAT,
      "format_version": runner.FORMAT_VERSION,
      "experiment": job.experiment,
      "step": step,
      "job_log_dir": job.job_log_dir,
      "model": {"family": type(model).__name__,
                "class": f"{type(model).__module__}.{type(model).__qualname__}",
                "decode_features": list(model.decode_features())},
      "vocabulary": vocabulary,
      "text": {"append_eos": job.append_eos} if job.has_text else None,
      "function": {
          "file": PROGRAM_FILE,
          "serialization": "jax.export",
          "calling_convention_version": exported.calling_convention_version,
          "platforms": list(exported.platforms),
          # exported.call(*arguments): "params" is the flat list in params.tensors order.
          "arguments": ["params", *input_names],
          "seed": serving.SEED_NAME,
      },
      "params": {
          "file": PARAMS_FILE,
          "passed_as": "the first argument: a list of arrays in this order",
          "count": num_params,
          "tensors": _avals(exported.in_avals[:num_params], names),
      },
      "inputs": inputs,
      "outputs": _avals(exported.out_avals, [n for n, _ in serving.OUTPUTS]),
      "decode_settings": job.settings.record(),
      "example": {"texts": list(job.example_texts),
                  "inputs": {k: v.tolist() for k, v in job.examples.items()}},
      "versions": {"jax": jax.__version__, "jaxlib": jaxlib.__version__},
  }


def write_weights(path: str, names: list[str], values: list[np.ndarray]) -> None:
  """params.safetensors; written by us, not save_file, which leaves it readable by owner only."""
  from safetensors.numpy import save

  with open(path, "wb") as f:
    f.write(save(dict(zip(names, values, strict=True)), metadata={"format": "np"}))


class StableHloExporter:
  """jax.export StableHLO of the decode, for any model family (see the module docstring)."""

  name = "stablehlo"

  def check(self, job: ExportJob) -> tuple[ExportJob, jax.export.Exported]:
    """Lowers the decode now: settings it cannot export fail before anything is written."""
    return job, serving.lower(job)

  def write(self, plan: tuple[ExportJob, jax.export.Exported], params: Any, step: int,
            out_dir: str) -> None:
    job, exported = plan
    values = serving.flat_params(params, job.abstract_params)
    with open(os.path.join(out_dir, PROGRAM_FILE), "wb") as f:
      f.write(exported.serialize())
    write_weights(os.path.join(out_dir, PARAMS_FILE), serving.param_names(job.abstract_params),
                  values)
    shutil.copyfile(runner.__file__, os.path.join(out_dir, RUNNER_FILE))
    if job.vocabulary["kind"] in VOCAB_FILES:
      shutil.copyfile(job.vocabulary["model_file"],
                      os.path.join(out_dir, VOCAB_FILES[job.vocabulary["kind"]]))
    with open(os.path.join(out_dir, runner.MANIFEST), "w") as f:
      json.dump(manifest(job, exported, step), f, indent=2)
      f.write("\n")
