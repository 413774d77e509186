"""--export_format=hf: a Hugging Face directory (config.json + model.safetensors).

With a file vocabulary the directory also gets its tokenizer (tokenizer.json or
spiece.model, with tokenizer_config.json / special_tokens_map.json as the source
had them), so AutoTokenizer.from_pretrained reads it; with the byte vocabulary, a
tokenizer_config.json naming transformers' ByT5Tokenizer, whose ids are paxlike's
(vocabulary.byte_tokenizer_config). Every export gets a
generation_config.json with the model's decoder start, EOS and pad ids, the --decode_*
flags, and the length paxlike decodes to (decode_length), so generate() with no
arguments decodes as far as paxlike does, not to transformers' default max_length 20.
"""

from __future__ import annotations

from typing import Any

from paxlike import log
from paxlike.export.job import ExportJob

GENERATION_IDS = ("decoder_start_token_id", "bos_token_id", "eos_token_id", "pad_token_id")


class HfExporter:
  """A directory transformers' from_pretrained loads (families with a Hugging Face layout)."""

  name = "hf"

  def check(self, job: ExportJob) -> Any:
    job.model.hf_config()  # a family with no Hugging Face layout raises UserError
    return job.model, job.vocab, job.settings, decode_length(job)

  def write(self, plan: Any, params: Any, step: int, out_dir: str) -> None:
    import jax

    from paxlike.inputs import vocabulary
    from paxlike.interop import hf

    del step
    model, vocab, settings, length = plan
    hf.export_params(jax.device_get(params), model, out_dir, source_positions(vocab))
    config = model.hf_config()
    generation = {k: config.get(k) for k in GENERATION_IDS}
    if vocab is not None and vocab.add_bos:
      generation["bos_token_id"] = vocab.bos_id
    generation.update(generation_settings(settings, length))
    vocabulary.write_hf_files(vocab, out_dir, generation, config.get("vocab_size"))


def source_positions(vocab: Any) -> int | None:
  """max_position_embeddings of the config.json the job's tokenizer came with (the source
  checkpoint's, recorded in job_log_dir/vocabulary/), or None."""
  import json

  path = (getattr(vocab, "files", None) or {}).get("config.json")
  if not path:
    return None
  try:
    with open(path) as f:
      return json.load(f).get("max_position_embeddings")
  except (OSError, ValueError, AttributeError):
    return None


def decode_length(job: ExportJob) -> dict[str, int]:
  """generation_config.json's length field for the length paxlike decodes to.

  --decode_max_length: max_new_tokens of it. Without it, T5 decodes MAX_TARGET_LEN
  positions (max_new_tokens), and a decoder-only model fills the rest of its row: prompt
  and generation share the decode input's ids (MAX_SEQ_LEN), transformers' max_length.
  With the flag, a prompt longer than MAX_SEQ_LEN - --decode_max_length gets fewer tokens
  in paxlike (it warns) than in transformers, which has no field for both limits at once.
  """
  settings = job.settings
  if settings is not None and settings.max_decode_length is not None:
    return {"max_new_tokens": settings.max_decode_length}
  if job.model.hf_config().get("is_encoder_decoder"):
    return {"max_new_tokens": job.model.max_target_len}
  shapes = {f.name: f.shape for f in job.features}
  if "prompt_lens" in shapes and len(shapes.get("ids", ())) == 1:
    return {"max_length": shapes["ids"][0]}
  return {}


def generation_settings(settings: Any, length: dict[str, int] | None = None) -> dict[str, Any]:
  """The --decode_* flags as generation_config.json's fields: beams, sampling, and length
  (decode_length's; the flag's max_new_tokens when not given).
  T5X's brevity penalty ((5 + length) / 6) ** alpha has no field there (transformers'
  length_penalty is another formula): with beams, that is said in the log."""
  out: dict[str, Any] = dict(length or {})
  if settings is None:
    return out
  if not out and settings.max_decode_length is not None:
    out["max_new_tokens"] = settings.max_decode_length
  if settings.num_beams > 1:
    out["num_beams"] = settings.num_beams
    log.info("generation_config.json: num_beams %d; transformers scores beams with its own "
             "length_penalty, not paxlike's brevity penalty (alpha %g)", settings.num_beams,
             settings.alpha)
  elif settings.temperature > 0:
    out.update(do_sample=True, temperature=settings.temperature, top_k=settings.top_k,
               top_p=settings.top_p)
  return out
