"""The modules Pax's GPU configs (paxml/contrib/gpu/scripts_gpu/configs.py) import.

With its import lines rewritten, that file imports and registers here. Its
GPT-3 classes on synthetic data (Synthetic126M, Synthetic5B, Synthetic175B)
run on paxlike's LM: `models.CustomMetricsLM` is paxlike's LanguageModel with
praxis's extra fields. What paxlike does not run yet is refused in one line
when a class that uses it runs, before anything is written: the Pile, Lambada
and BoolQ data (Pax's own TFDS builders and tokenizers), the LLaMA template
and its LoRA adapters, restoring a Pax checkpoint, and GLaM's experts.
"""
