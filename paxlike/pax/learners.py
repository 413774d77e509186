"""paxml.learners: Learner (paxlike's), which `pax_fiddle.Config(learners.Learner,
loss_name=..., optimizer=...)` configures as in Pax."""

from paxlike.learners import Learner

__all__ = ["Learner"]
