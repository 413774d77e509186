"""--mode=export: a trained experiment written out in another format.

    hf          a Hugging Face directory (config.json + model.safetensors)
    stablehlo   the decode as jax.export StableHLO + params.safetensors + manifest + run.py
    savedmodel  a TF SavedModel over the same program (jax2tf), for TF Serving

Each format is an Exporter (base.py): `check(job)` runs before the job
writes anything and refuses what cannot be exported; `write(plan, params,
step, out_dir)` writes one restored step into a fresh directory that
`publish` moves into place.
"""

from paxlike.export.base import (
    Exporter,
    check_free,
    directory_size,
    is_export,
    out_dir,
    publish,
)
from paxlike.export.formats import EXPORTERS, get
from paxlike.export.hf import HfExporter
from paxlike.export.job import PLATFORMS, ExportJob, describe, parse_platforms, text_source
from paxlike.export.loading import load
from paxlike.export.savedmodel import SavedModelExporter
from paxlike.export.stablehlo import StableHloExporter

__all__ = [
    "EXPORTERS", "PLATFORMS", "ExportJob", "Exporter", "HfExporter", "SavedModelExporter",
    "StableHloExporter", "check_free", "describe", "directory_size", "get", "is_export",
    "load", "out_dir", "parse_platforms", "publish", "text_source",
]
