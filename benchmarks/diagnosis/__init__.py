"""Diagnosis scenarios: broken and healthy training runs scored against the health rules."""
