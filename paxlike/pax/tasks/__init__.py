"""paxml.tasks."""
