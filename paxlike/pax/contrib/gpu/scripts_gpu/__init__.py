"""The modules Pax's GPU configs (paxml/contrib/gpu/scripts_gpu/configs.py) import.

With its import lines rewritten, that file imports and registers here.
- **GPT-3 classes.** They run on paxlike's LM; `models.CustomMetricsLM` is
  paxlike's LanguageModel with praxis's extra fields. They train on synthetic
  data or on the Pile, and are evaluated on LAMBADA.
- **LLaMA classes.** They run on paxlike's Llama family (`llama_utils.BaseLLaMA`)
  and fine-tune and evaluate on BoolQ.
- **Data.** `tasks` provides Pax's SeqIO tasks on the TFDS data its scripts
  read; it needs the [seqio] extra.
- **Refused.** What paxlike does not run yet is refused in one line when a
  class that uses it runs, before anything is written: restoring a Pax
  checkpoint, and GLaM's experts.
"""
