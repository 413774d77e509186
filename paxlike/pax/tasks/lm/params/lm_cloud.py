"""paxml.tasks.lm.params.lm_cloud: paxlike's shipped lm_cloud experiments."""

from experiments.lm.lm_cloud import *  # noqa: F403
from experiments.lm.lm_cloud import LmCloudSpmd, LmCloudTransformer  # noqa: F401
from paxlike.lm_experiments import SyntheticDataset  # noqa: F401
