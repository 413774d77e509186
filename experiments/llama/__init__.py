"""Llama-family (Llama 3.x, Mistral, Qwen2.5) experiments."""
