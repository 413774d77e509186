"""--export_format=hf: a Hugging Face directory (config.json + model.safetensors).

With a file vocabulary the directory also gets its tokenizer (tokenizer.json or
spiece.model, with tokenizer_config.json / special_tokens_map.json as the source
had them), so AutoTokenizer.from_pretrained reads it, and a generation_config.json
with the model's decoder start, EOS and pad ids.
"""

from __future__ import annotations

from typing import Any

from paxlike.export.job import ExportJob

GENERATION_IDS = ("decoder_start_token_id", "bos_token_id", "eos_token_id", "pad_token_id")


class HfExporter:
  """A directory transformers' from_pretrained loads (families with a Hugging Face layout)."""

  name = "hf"

  def check(self, job: ExportJob) -> Any:
    job.model.hf_config()  # a family with no Hugging Face layout raises UserError
    return job.model, job.vocab

  def write(self, plan: Any, params: Any, step: int, out_dir: str) -> None:
    import jax

    from paxlike.inputs import vocabulary
    from paxlike.interop import hf

    del step
    model, vocab = plan
    hf.export_params(jax.device_get(params), model, out_dir)
    config = model.hf_config()
    generation = {k: config.get(k) for k in GENERATION_IDS}
    if vocab is not None and vocab.add_bos:
      generation["bos_token_id"] = vocab.bos_id
    vocabulary.write_hf_files(vocab or vocabulary.ByteVocabulary(), out_dir, generation)
