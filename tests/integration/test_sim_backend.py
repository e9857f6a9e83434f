"""The sim backend: `orch sim serve` workers as processes behind the real vllm-router
(round robin and P/D), readiness, scraping, idempotent teardown, cleanup of leftovers, and the
fall-back to the whole-arm server when the router cannot run."""

from __future__ import annotations

import httpx
import pytest

from orchestrator.backends.base import RunKey
from orchestrator.backends.processes import StateFile
from orchestrator.backends.sim import SimBackend
from orchestrator.errors import TransientError
from orchestrator.loadgen.scrape import parse_metrics
from tests.e2e.helpers import small_plan

pytestmark = pytest.mark.timeout(300)


def _complete(url: str, model: str, n: int = 8) -> dict:
    r = httpx.post(f"{url}/v1/completions", timeout=30, json={
        "model": model, "prompt": "hello " * 40, "max_tokens": n, "ignore_eos": True, "stream": False})
    assert r.status_code == 200, r.text
    return r.json()


def _counter(text: str, name: str) -> float:
    return sum(s.value for s in parse_metrics(text) if s.name in (name, f"{name}_total"))


def test_colocated_replicas_behind_round_robin_router(tmp_path) -> None:
    plan = small_plan(arms={
        "A": {"gpu": "H200", "layout": "colocated", "replicas": 2},
        "B": {"gpu": "H200", "layout": "colocated", "replicas": 1},
    })
    backend = SimBackend(tmp_path)
    assert backend.router is not None, "vllm-router binary not found next to this Python"
    dep = backend.deploy(plan, "A", RunKey("exp1", "A", 0))
    try:
        backend.ready(dep, 120)
        for _ in range(4):
            assert _complete(dep.endpoint.url, dep.endpoint.model)["usage"]["completion_tokens"] == 8
        scraped = backend.scrape(dep)
        workers = [u for u in dep.endpoint.metrics_urls if u in scraped and "vllm:" in scraped[u]]
        assert len(workers) == 2
        # Round robin: both workers served requests.
        assert all(_counter(scraped[u], "vllm:generation_tokens") > 0 for u in workers)
        assert dep.fingerprint.gpu_type == "H200" and "vllm-router" in dep.fingerprint.topology
    finally:
        backend.teardown(dep)
    assert not any(p.alive() for p in dep.handles.procs)
    backend.teardown(dep)  # idempotent


def test_disaggregated_arm_through_router_pd_mode(tmp_path) -> None:
    plan = small_plan(arms={
        "A": {"gpu": "H200", "layout": "colocated", "replicas": 1},
        "B": {"gpu": "H200", "layout": "disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 1}},
    })
    backend = SimBackend(tmp_path)
    dep = backend.deploy(plan, "B", RunKey("exp2", "B", 0))
    try:
        backend.ready(dep, 120)
        out = _complete(dep.endpoint.url, dep.endpoint.model, 16)
        assert out["usage"]["completion_tokens"] == 16
        procs = {p.role: p for p in dep.handles.procs}
        scraped = backend.scrape(dep)
        prefill = scraped[f"http://127.0.0.1:{procs['prefill-0'].port}/metrics"]
        decode = scraped[f"http://127.0.0.1:{procs['decode-0'].port}/metrics"]
        assert _counter(prefill, "vllm:prompt_tokens") > 0
        assert _counter(decode, "vllm:generation_tokens") >= 16
        assert "P/D" in dep.fingerprint.topology
    finally:
        backend.teardown(dep)


def test_router_that_cannot_run_falls_back_to_whole_arm(tmp_path) -> None:
    plan = small_plan()
    backend = SimBackend(tmp_path, log=lambda line: None)
    backend.router = "/bin/false"  # a router binary that exits at once
    dep = backend.deploy(plan, "A", RunKey("exp3", "A", 0))
    with pytest.raises(TransientError, match="whole-arm"):
        backend.ready(dep, 60)
    backend.teardown(dep)
    assert backend.router is None
    dep = backend.deploy(plan, "A", RunKey("exp3", "A", 0, attempt=1))
    try:
        backend.ready(dep, 120)
        assert _complete(dep.endpoint.url, dep.endpoint.model)["usage"]["completion_tokens"] == 8
        assert dep.fingerprint.topology == "whole-arm sim server"
    finally:
        backend.teardown(dep)


def test_cleanup_stops_leftovers_of_a_crashed_controller(tmp_path) -> None:
    plan = small_plan()
    first = SimBackend(tmp_path)
    dep = first.deploy(plan, "A", RunKey("exp4", "A", 0))
    first.ready(dep, 120)
    procs = StateFile(tmp_path / "exp4" / dep.key.slug / "processes.json").read()
    assert procs and all(p.alive() for p in procs)
    # A new controller (no handles in memory) finds them by the state file.
    assert SimBackend(tmp_path).cleanup("exp4") == len(procs)
    assert not any(p.alive() for p in procs)
    assert SimBackend(tmp_path).cleanup("exp4") == 0
