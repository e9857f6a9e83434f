"""The pytest fixture over the emulated cluster (``orchestrator.kcluster``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.kcluster import (
    GKE_GPU_TAINT,
    GPU_TAINT,
    POD_SECURITY,
    QUOTA,
    EmulatedCluster,
    NodeSpec,
    cpu_node,
    default_nodes,
    gpu_node,
    loopback_ok,
)

__all__ = ["GKE_GPU_TAINT", "GPU_TAINT", "POD_SECURITY", "QUOTA", "EmulatedCluster", "NodeSpec", "cluster_fixture",
           "cpu_node", "default_nodes", "gpu_node", "loopback_ok"]


def cluster_fixture(name: str = "kcluster", scope: str = "function", **kwargs: Any) -> Any:
    """A pytest fixture yielding a running ``EmulatedCluster(**kwargs)``; it asserts on teardown that
    no process the cluster started is left. Usage, at module level:
    ``kcluster = cluster_fixture(nodes=[gpu_node("h200-1"), cpu_node()])``."""

    @pytest.fixture(name=name, scope=scope)  # type: ignore[call-overload]
    def _fixture() -> Iterator[EmulatedCluster]:
        with EmulatedCluster(**kwargs) as cluster:
            yield cluster
        assert not cluster.live_processes(), f"processes left: {cluster.live_processes()}"

    return _fixture
