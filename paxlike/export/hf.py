"""--export_format=hf: a Hugging Face directory (config.json + model.safetensors)."""

from __future__ import annotations

from typing import Any

from paxlike.export.job import ExportJob


class HfExporter:
  """A directory transformers' from_pretrained loads (families with a Hugging Face layout)."""

  name = "hf"

  def check(self, job: ExportJob) -> Any:
    job.model.hf_config()  # a family with no Hugging Face layout raises UserError
    return job.model

  def write(self, plan: Any, params: Any, step: int, out_dir: str) -> None:
    import jax

    from paxlike.interop import hf

    del step
    hf.export_params(jax.device_get(params), plan, out_dir)
