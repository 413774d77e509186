"""paxml.contrib.gpu.scripts_gpu.llama_utils: BaseLLaMA, importable and refused when run."""

from __future__ import annotations

from paxlike.lm_experiments import TransformerLmSpmdAdam
from paxlike.pax.tasks.lm.model_params import NotRunnable


class BaseLLaMA(NotRunnable, TransformerLmSpmdAdam):
  """Pax's GPU LLaMA template (SAX's LLaMA rotary embedding, multi-query attention).

  A file that subclasses it imports and registers; running such a class is
  refused in validate(), before anything is built or written.
  """

  WHY = "built on Pax's GPU LLaMA template (BaseLLaMA)"
  INSTEAD = ("paxlike's Llama family trains and fine-tunes Llama models from their Hugging "
             "Face checkpoints (docs/llama.md)")


__all__ = ["BaseLLaMA"]
