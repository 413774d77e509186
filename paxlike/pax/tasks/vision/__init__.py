"""paxml.tasks.vision."""
