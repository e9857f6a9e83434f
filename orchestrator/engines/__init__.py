"""Engine adapters: one per serving engine, the only place that knows its flags and metric
names (``base.EngineAdapter``). Backends, the point runner and the report ask
:func:`engine_for`; none builds an engine or router command line itself."""

from __future__ import annotations

from orchestrator.engines.base import (
    DiscoveredWorkers,
    EngineAdapter,
    EngineMetrics,
    KvConnector,
    Launcher,
    Role,
    RouterTarget,
    ServeTarget,
    StaticWorkers,
)
from orchestrator.engines.sglang import SGLANG
from orchestrator.engines.vllm import VLLM
from orchestrator.plan import Arm

ENGINES: dict[str, EngineAdapter] = {VLLM.kind: VLLM, SGLANG.kind: SGLANG}


def engine_for(arm: Arm | None = None) -> EngineAdapter:
    """The adapter of an arm's engine (``arm.engine.kind``). ``None``, where no arm is known
    (an external stack, a caller not yet told the arm): the default engine, vLLM."""
    return ENGINES[arm.engine.kind if arm is not None else "vllm"]


__all__ = [
    "ENGINES", "DiscoveredWorkers", "EngineAdapter", "EngineMetrics", "KvConnector", "Launcher", "Role",
    "RouterTarget", "ServeTarget", "StaticWorkers", "engine_for",
]
