"""The modules Pax's GPU configs (paxml/contrib/gpu/scripts_gpu/configs.py) import.

With its import lines rewritten, that file imports and registers here. Its
GPT-3 classes run on paxlike's LM (`models.CustomMetricsLM` is paxlike's
LanguageModel with praxis's extra fields): on synthetic data, on the Pile, and
evaluated on LAMBADA (`tasks`: Pax's SeqIO tasks on its TFDS builders' data,
the [seqio] extra). What paxlike does not run yet is refused in one line when
a class that uses it runs, before anything is written: BoolQ's data and
metric, the LLaMA template, restoring a Pax checkpoint, and GLaM's experts.
"""
