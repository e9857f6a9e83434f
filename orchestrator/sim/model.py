"""Performance model of a continuous-batching engine on a GPU (pure)."""
