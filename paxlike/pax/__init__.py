"""Pax's import paths on paxlike: `paxml` and `praxis` both become `paxlike.pax`.

A Pax experiment file ports by rewriting its import lines, nothing else:

    from paxml import base_experiment          ->  from paxlike.pax import base_experiment
    from paxml.tasks.lm import model_params    ->  from paxlike.pax.tasks.lm import model_params
    from praxis import layers                  ->  from paxlike.pax import layers

(a plain text substitution of `paxml` and `praxis` by `paxlike.pax` in the
import lines). The modules here are thin: each re-exports paxlike's own
classes under the name Pax's files use. What paxlike does not run yet exists
so a file imports and registers, and is refused in one sentence when it is run
or used.
"""
