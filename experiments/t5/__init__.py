"""Encoder-decoder (T5 / Flan-T5) experiments."""
