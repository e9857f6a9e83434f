"""Arrival schedules: absolute send times drawn from a seed (pure)."""
