"""The simulated engine: performance model, virtual-time engine (pure) and real-time server."""
