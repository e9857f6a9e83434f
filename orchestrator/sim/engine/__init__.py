"""Virtual-time discrete-event engine (pure): workers, prefix cache, routers, whole runs."""

from orchestrator.sim import native as _native

_native.install()  # the mypyc build of these exact sources, when `make install` made one

# ruff: noqa: E402 - the compiled modules must be found before the first import below

from orchestrator.sim.engine.cache import KVMemory, block_hashes
from orchestrator.sim.engine.cluster import ClusterSpec, cluster_for_arm
from orchestrator.sim.engine.routing import Router
from orchestrator.sim.engine.virtual import (
    SimResult,
    Windows,
    output_hash,
    simulate_closed_loop,
    simulate_open_loop,
    simulate_sessions,
)
from orchestrator.sim.engine.worker import Sequence, StepResult, Worker

__all__ = [
    "ClusterSpec", "KVMemory", "Router", "Sequence", "SimResult", "StepResult", "Windows",
    "Worker", "block_hashes", "cluster_for_arm", "output_hash", "simulate_closed_loop",
    "simulate_open_loop", "simulate_sessions",
]
