"""orchestrator: registered A/B experiments for LLM serving."""
__version__ = "0.1.0"
