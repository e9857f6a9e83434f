"""Workload synthesis: prompts, shared prefixes, conversations (pure)."""
