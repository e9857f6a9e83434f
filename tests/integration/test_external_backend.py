"""The external backend against a fault-injecting OpenAI-compatible server on loopback:
fingerprint, readiness, refusals that waiting cannot fix, scraping, header secrets."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from orchestrator.backends.base import Backend, RunKey
from orchestrator.backends.external import ExternalBackend, engine_version_from_metrics
from orchestrator.control.session import make_backend
from orchestrator.errors import PermanentError, TransientError, UserError
from orchestrator.plan import validate_plan
from tests.support.fault_server import FaultServer, external_plan, start_fault_server

pytestmark = pytest.mark.timeout(120)
KEY = RunKey("ext-test", "A", 0)


@pytest.fixture
def server() -> Iterator[FaultServer]:
    s = start_fault_server(version="0.11.0-fault")
    try:
        yield s
    finally:
        s.stop()


def test_make_backend_knows_external(tmp_path) -> None:
    be = make_backend("external", tmp_path)
    assert isinstance(be, ExternalBackend) and isinstance(be, Backend)


def test_fingerprint_reads_models_headers_version_and_metrics(server: FaultServer) -> None:
    data = external_plan(server.url, server.url)
    data["arms"]["A"]["endpoint"]["url"] = server.url + "/v1/"
    plan = validate_plan(data)
    be = ExternalBackend(env={})
    dep = be.deploy(plan, "A", KEY)
    assert dep.endpoint.url == server.url and dep.endpoint.model == "fault-model"
    assert dep.endpoint.metrics_urls == (f"{server.url}/metrics",)
    fp = dep.fingerprint
    assert fp.backend == "external" and fp.details["models"][0]["id"] == "fault-model"
    assert fp.details["response_headers"]["server"] == "fault-server/1.0"
    assert (fp.engine_version, fp.engine_version_source) == ("0.11.0-fault", "/version")
    assert fp.details["cache_config"]["block_size"] == "16"
    assert fp.details["labels"]["gpu"] == "H100-SXM"
    # Not observable from outside, so not claimed (the labels describe it).
    assert fp.gpu_type is None and fp.node_pools == () and fp.nodes == () and fp.gpu_products == ()
    # Nothing to tear down, nothing left over.
    be.teardown(dep)
    assert be.cleanup("ext-test") == 0


def test_a_changed_server_changes_the_identity(server: FaultServer) -> None:
    plan = validate_plan(external_plan(server.url, server.url))
    first = ExternalBackend(env={}).deploy(plan, "A", KEY).fingerprint.details["identity"]
    with start_fault_server(version="0.12.0") as other:
        plan2 = validate_plan(external_plan(other.url, other.url))
        second = ExternalBackend(env={}).deploy(plan2, "A", KEY).fingerprint.details["identity"]
    assert first != second


def test_engine_version_from_metrics_only_from_vllm_metrics() -> None:
    text = '# TYPE python_info gauge\npython_info{version="3.11.9"} 1.0\n'
    assert engine_version_from_metrics(text) is None
    text += '# TYPE vllm:build_info gauge\nvllm:build_info{version="0.11.0"} 1.0\n'
    assert engine_version_from_metrics(text) == "0.11.0"


def test_ready_on_an_honest_server_and_scrape(server: FaultServer) -> None:
    plan = validate_plan(external_plan(server.url, server.url))
    be = ExternalBackend(env={})
    dep = be.deploy(plan, "A", KEY)
    be.ready(dep, 10)
    texts = be.scrape(dep)
    assert "vllm:prefix_cache_queries_total" in texts[f"{server.url}/metrics"]


def test_ready_refuses_a_server_that_ignores_max_tokens_at_once() -> None:
    with start_fault_server(ignore_max_tokens=True, fault_everything=True) as s:
        plan = validate_plan(external_plan(s.url, s.url))
        be = ExternalBackend(env={})
        dep = be.deploy(plan, "A", KEY)
        with pytest.raises(PermanentError, match=r"asked for 4 tokens with ignore_eos and got \d+ completion tokens"):
            be.ready(dep, 30)


def test_ready_waits_for_the_model_and_names_what_is_served(server: FaultServer) -> None:
    plan = validate_plan(external_plan(server.url, server.url, model="another-model"))
    be = ExternalBackend(env={})
    dep = be.deploy(plan, "A", KEY)
    with pytest.raises(TransientError, match=r"lists \['fault-model'\], not 'another-model'"):
        be.ready(dep, 1.0)


def test_deploy_of_an_unreachable_endpoint_is_transient() -> None:
    s = start_fault_server()
    url = s.url
    s.stop()
    plan = validate_plan(external_plan(url, url))
    with pytest.raises(TransientError, match="is the stack running"):
        ExternalBackend(env={}, timeout_s=2).deploy(plan, "A", KEY)


def test_a_server_wanting_a_key_is_refused_with_the_remedy() -> None:
    with start_fault_server(api_key="sk-test-123") as s:
        plan = validate_plan(external_plan(s.url, s.url))
        with pytest.raises(PermanentError, match=r"HTTP 401.*arms\.A\.endpoint\.headers"):
            ExternalBackend(env={}).deploy(plan, "A", KEY)


def test_header_values_come_from_the_environment_and_are_never_stored() -> None:
    with start_fault_server(api_key="sk-test-123") as s:
        data = external_plan(s.url, s.url)
        data["arms"]["A"]["endpoint"]["headers"] = {"Authorization": {"env": "FAULT_KEY", "scheme": "Bearer"}}
        plan = validate_plan(data)
        with pytest.raises(UserError, match="FAULT_KEY, which is not set"):
            ExternalBackend(env={}).deploy(plan, "A", KEY)
        be = ExternalBackend(env={"FAULT_KEY": "sk-test-123"})
        dep = be.deploy(plan, "A", KEY)
        be.ready(dep, 10)
        assert "sk-test-123" not in json.dumps(dep.fingerprint.to_dict()) and "sk-test-123" not in repr(dep)
        # The load itself carries the key (a point's streamed requests, not just the probes).
        import asyncio

        from orchestrator.loadgen.runner import run_point
        from orchestrator.loadgen.workloads import build_requests

        reqs = build_requests(plan.workload, 3, 1)
        seen_before = len(s.seen_headers)
        summary = asyncio.run(run_point(dep.endpoint.url, dep.endpoint.model, reqs, [0.0, 0.05, 0.1],
                                        ["measure"] * 3, headers=dict(dep.endpoint.headers),
                                        keep_records=True, request_timeout_s=10))
        assert summary.by_status.get("ok") == 3, summary.by_status
        assert all(h.get("Authorization") == "Bearer sk-test-123" for h in s.seen_headers[seen_before:])
