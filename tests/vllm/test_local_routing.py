"""round_robin vs cache_aware in front of the same two real vLLM replicas, with conversations
whose turns share their history: the cache-aware router's prefix-cache hit rate is higher.

One deployment (two engines, the cache-aware router) through LocalBackend; a second router
(round_robin, the same command line the backend renders for arm A) is started in front of the
same engines, so the comparison costs two vLLM starts, not four. Each policy gets its own
conversations (another seed), and hit rates are measured as counter deltas over its phase.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest

from orchestrator.backends.base import Deployment
from orchestrator.backends.local import (
    HOST,
    LocalBackend,
    free_ports,
    router_argv,
    stop_group,
)
from orchestrator.backends.processes import start_process
from orchestrator.loadgen.workloads import build_requests
from orchestrator.plan import Plan
from tests.vllm.conftest import deployed, tiny_plan


def _counter(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(
        rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


@pytest.fixture(scope="module")
def plan() -> Plan:
    p = tiny_plan({
        "A": {"layout": "colocated", "replicas": 2, "router": {"policy": "round_robin"}},
        "B": {"layout": "colocated", "replicas": 2, "router": {"policy": "cache_aware"}},
    })
    prompts = p.workload.prompts.model_copy(update={"conversations": 6, "turns": 3})
    return p.model_copy(update={"workload": p.workload.model_copy(update={"prompts": prompts})})


@pytest.fixture(scope="module")
def cache_aware(backend: LocalBackend, plan: Plan) -> Iterator[Deployment]:
    yield from deployed(backend, plan, "B")


def _hits(backend: LocalBackend, dep: Deployment) -> tuple[float, float]:
    texts = backend.scrape(dep)
    engines = [u for u in dep.endpoint.metrics_urls if u.replace("/metrics", "") in dep.handles.engines]
    return (sum(_counter(texts[u], "vllm:prefix_cache_hits_total") for u in engines),
            sum(_counter(texts[u], "vllm:prefix_cache_queries_total") for u in engines))


def _phase_hit_rate(backend: LocalBackend, dep: Deployment, url: str, plan: Plan, seed: int) -> float:
    h0, q0 = _hits(backend, dep)
    with httpx.Client(timeout=120.0) as client:
        for spec in build_requests(plan.workload, 18, seed=seed):
            r = client.post(f"{url}/v1/completions", json={
                "model": dep.endpoint.model, "prompt": spec.prompt, "max_tokens": spec.max_tokens,
                "ignore_eos": True})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == spec.max_tokens
    h1, q1 = _hits(backend, dep)
    assert q1 > q0
    return (h1 - h0) / (q1 - q0)


def test_cache_aware_routing_hits_the_prefix_cache_more_than_round_robin(
    backend: LocalBackend, cache_aware: Deployment, plan: Plan
) -> None:
    ports = free_ports()
    rport, mport = next(ports), next(ports)
    argv = router_argv(plan, "A", rport, mport, backend.settings, cache_aware.handles.engines,
                       [], [], None)
    assert argv[argv.index("--policy") + 1] == "round_robin"
    rr = start_process("router-rr", list(argv), rport, backend.state_dir / "router-rr.log")
    try:
        rr_url = f"http://{HOST}:{rport}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{rr_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        round_robin = _phase_hit_rate(backend, cache_aware, rr_url, plan, seed=11)
        aware = _phase_hit_rate(backend, cache_aware, cache_aware.endpoint.url, plan, seed=12)
    finally:
        stop_group(rr.pid, 5)
    print(f"prefix-cache hit rate: round_robin {round_robin:.3f}, cache_aware {aware:.3f}")
    assert aware > round_robin + 0.1
