"""Engine adapters: one per serving engine, the only place that knows its flags and metric
names (``base.EngineAdapter``). Backends, the point runner and the report ask
:func:`engine_for`; none builds an engine or router command line itself."""

from __future__ import annotations

from orchestrator.engines.base import (
    DiscoveredWorkers,
    EngineAdapter,
    EngineMetrics,
    KvConnector,
    Role,
    RouterTarget,
    ServeTarget,
    StaticWorkers,
)
from orchestrator.engines.vllm import VLLM
from orchestrator.plan import Arm

ENGINES: dict[str, EngineAdapter] = {VLLM.kind: VLLM}


def engine_for(arm: Arm | None = None) -> EngineAdapter:
    """The adapter of an arm's engine (every arm serves vLLM today; ``None``: the default)."""
    return ENGINES["vllm"]


__all__ = [
    "ENGINES", "DiscoveredWorkers", "EngineAdapter", "EngineMetrics", "KvConnector", "Role",
    "RouterTarget", "ServeTarget", "StaticWorkers", "engine_for",
]
