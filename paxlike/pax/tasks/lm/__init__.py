"""paxml.tasks.lm."""
