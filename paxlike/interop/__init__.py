"""Checkpoints of other frameworks in and out (hf: Hugging Face safetensors directories)."""

from paxlike.interop import hf

__all__ = ["hf"]
