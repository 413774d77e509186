"""paxml.tasks.lm.params.c4: paxlike's shipped C4 experiments (synthetic stand-in data)."""

from experiments.lm.c4 import *  # noqa: F403
from experiments.lm.c4 import C4StandInDataset
from paxlike.lm_experiments import TransformerLmSpmdAdam  # noqa: F401

C4UnsupervisedDataset = C4StandInDataset  # Pax's name for the C4 data mixin
from paxlike.pax.tasks.lm.model_params import TransformerLmSpmdPipelineAdam  # noqa: E402,F401
