"""The --export_format registry."""

from __future__ import annotations

from paxlike.errors import UserError
from paxlike.export.base import Exporter
from paxlike.export.hf import HfExporter
from paxlike.export.savedmodel import SavedModelExporter
from paxlike.export.stablehlo import StableHloExporter

EXPORTERS: dict[str, Exporter] = {
    e.name: e for e in (HfExporter(), StableHloExporter(), SavedModelExporter())}


def get(name: str) -> Exporter:
  if name not in EXPORTERS:
    raise UserError(f"--export_format={name} is not one of {', '.join(EXPORTERS)}.")
  return EXPORTERS[name]
