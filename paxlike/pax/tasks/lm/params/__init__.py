"""paxml.tasks.lm.params: paxlike's shipped Pax experiments under Pax's module names."""
