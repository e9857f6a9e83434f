"""The experiment executor and the Ray controller: the only layer that wires parts together."""
