"""Real vLLM (CPU build, tiny model) through LocalBackend: colocated and 1P1D behind vllm-router."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest

from orchestrator.backends.base import Deployment
from orchestrator.backends.local import LocalBackend, group_members
from orchestrator.loadgen.workloads import build_requests
from orchestrator.plan import Plan
from tests.vllm.conftest import deployed, tiny_plan
from tests.vllm.sse import stream_completion


def _counter(text: str, name: str) -> float:
    """Sum of a Prometheus counter's samples (all label sets)."""
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M):
        total += float(m.group(1))
    return total


@pytest.fixture(scope="module")
def plan() -> Plan:
    return tiny_plan({
        "A": {"layout": "colocated", "replicas": 1},
        "B": {"layout": "disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 1},
              "kv_connector": "nixl"},  # on CPU: the shared-storage ExampleConnector
    })


@pytest.fixture(scope="module")
def colocated(backend: LocalBackend, plan: Plan) -> Iterator[Deployment]:
    yield from deployed(backend, plan, "A")


@pytest.fixture(scope="module")
def disaggregated(backend: LocalBackend, plan: Plan) -> Iterator[Deployment]:
    yield from deployed(backend, plan, "B")


def test_colocated_replica_streams_exactly_the_asked_tokens(colocated: Deployment, plan: Plan) -> None:
    spec = build_requests(plan.workload, 1, seed=3)[0]
    got = stream_completion(colocated.endpoint.url, colocated.endpoint.model, spec.prompt, 16)
    assert got.usage["completion_tokens"] == 16  # ignore_eos honoured
    assert got.finish_reason == "length"
    assert 1 <= got.chunks <= 16  # a chunk can carry several tokens: count from usage
    # The tiny tokenizer makes each load-generator word one token (the token scheme).
    assert got.usage["prompt_tokens"] == spec.prompt_tokens == len(spec.prompt.split())


def test_colocated_metrics_are_scraped(backend: LocalBackend, colocated: Deployment) -> None:
    texts = backend.scrape(colocated)
    assert set(texts) == set(colocated.endpoint.metrics_urls)
    engine = texts[colocated.endpoint.metrics_urls[0]]
    assert _counter(engine, "vllm:generation_tokens_total") >= 16
    assert "vllm:prefix_cache_queries_total" in engine
    fp = colocated.fingerprint
    assert fp.engine_version == "0.32.0" and fp.details["device"] == "cpu"
    assert fp.details["torch_version"].startswith("2.13.0")


def test_engine_processes_leave_the_generator_a_core(colocated: Deployment) -> None:
    # The engine's whole process tree (API server, EngineCore, worker: started after the
    # taskset, so inherited) stays off the last allowed core, where the load generator runs.
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one allowed CPU: nothing to reserve")
    engine, _router = colocated.handles.procs
    members = group_members(engine.pid)
    assert len(members) >= 2  # the API server and at least the engine core
    for pid in members:
        assert allowed[-1] not in os.sched_getaffinity(pid), pid


def test_teardown_leaves_no_process(backend: LocalBackend, colocated: Deployment) -> None:
    # Runs after the other colocated tests (file order); the fixture's own teardown is then a
    # no-op, teardown being idempotent.
    pids = [p.pid for p in colocated.handles.procs]
    assert backend.alive(colocated)
    assert len(pids) == 2 and all(group_members(pid) for pid in pids)  # engine + router
    backend.teardown(colocated)
    assert all(group_members(pid) == [] for pid in pids)
    assert not backend.alive(colocated)


def test_one_prefill_one_decode_hands_kv_over_through_the_router(
    backend: LocalBackend, disaggregated: Deployment, plan: Plan
) -> None:
    assert disaggregated.fingerprint.kv_transport == "ExampleConnector"
    assert disaggregated.fingerprint.topology == "vllm-router round_robin P/D"
    specs = build_requests(plan.workload, 3, seed=5)
    for spec in specs:
        got = stream_completion(disaggregated.endpoint.url, disaggregated.endpoint.model, spec.prompt, 16)
        assert got.usage["completion_tokens"] == 16
    prefill_url, decode_url, _router = disaggregated.endpoint.metrics_urls
    texts = backend.scrape(disaggregated)
    # The decode worker found the prompts' KV written by the prefill worker (whole 128-token
    # blocks on CPU), so its external prefix-cache hits are counted; the prefill computed them.
    assert _counter(texts[decode_url], "vllm:external_prefix_cache_hits_total") >= 128
    assert _counter(texts[prefill_url], "vllm:prompt_tokens_total") >= sum(s.prompt_tokens for s in specs)
    assert _counter(texts[decode_url], "vllm:generation_tokens_total") >= 16 * len(specs)
