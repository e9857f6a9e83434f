"""Metrics, capacity search, validity guards and the statistics of a bar. Pure (no I/O)."""
