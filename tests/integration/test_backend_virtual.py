"""The backend contract (orchestrator/backends/base.py) on the virtual backend: the meanings of
the conformance suite that apply to a backend without HTTP (tests/integration/backend_suite.py
streams over HTTP; the virtual backend's load goes through its own driver, in virtual time):
the protocol and its signatures, deploy -> ready -> a request of exactly the asked tokens ->
scrape with vLLM's metric names -> alive; a wrong token count is a PermanentError at ready; a
server that dies is not alive; teardown and cleanup leave nothing, idempotently."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from orchestrator.backends.base import Backend, Fingerprint, RunKey
from orchestrator.backends.virtual import VirtualBackend
from orchestrator.errors import PermanentError
from orchestrator.loadgen.scrape import parse_metrics
from orchestrator.loadgen.workloads import build_requests
from tests.e2e.helpers import small_plan
from tests.integration.backend_suite import PROTOCOL_METHODS

pytestmark = pytest.mark.usefixtures("no_sockets")


def _params(fn: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_the_protocol_and_its_signatures() -> None:
    b = VirtualBackend()
    assert isinstance(b, Backend) and b.name == "virtual"
    for name in PROTOCOL_METHODS:
        assert _params(getattr(Backend, name))[1:] == _params(getattr(b, name)), name


def test_deploy_ready_serve_scrape_alive_teardown() -> None:
    plan = small_plan(name="suite-virtual")
    b = VirtualBackend()
    dep = b.deploy(plan, "A", RunKey("suite-virtual", "A", 0))
    b.ready(dep, b.startup_budget_s(plan, "A"))
    assert isinstance(dep.fingerprint, Fingerprint) and dep.fingerprint.backend == "virtual"
    fp = dep.fingerprint
    assert fp.gpu_type == "H100-PCIe" and fp.engine_version and fp.node_pools and fp.nodes
    assert not dep.driver.realtime
    spec = build_requests(plan.workload, 1, seed=11)[0]
    s = dep.driver.open_loop(dep.endpoint.url, dep.endpoint.model, [spec], np.zeros(1), ["measure"],
                             api=plan.workload.api, sink=None, request_timeout_s=60.0, deadline_s=30.0,
                             keep_records=True, headers=None)
    (rec,) = s.records or []
    assert rec.status == "ok" and rec.output_tokens == spec.max_tokens and rec.first_token_s is not None
    texts = b.scrape(dep)
    assert set(texts) == set(dep.endpoint.metrics_urls)
    names = {x.name for text in texts.values() for x in parse_metrics(text)}
    assert {"vllm:prefix_cache_queries_total", "vllm:num_requests_running"} <= names
    assert b.alive(dep)
    b.teardown(dep)
    b.teardown(dep)  # idempotent
    assert b.cleanup("suite-virtual") == 0 and b.cleanup("suite-virtual", final=True) == 0


def test_a_wrong_token_count_is_permanent_at_ready() -> None:
    plan = small_plan(name="suite-virtual-fault")
    b = VirtualBackend(faults={("A", 0, 0): ["--fault-ignore-max-tokens"]})
    dep = b.deploy(plan, "A", RunKey("suite-virtual-fault", "A", 0))
    with pytest.raises(PermanentError, match="ignores max_tokens"):
        b.ready(dep, 10.0)
    b.teardown(dep)


def test_a_dead_server_is_not_alive_and_its_requests_fail() -> None:
    plan = small_plan(name="suite-virtual-die")
    b = VirtualBackend(faults={("A", 0, 0): ["--fault-die-after", "3"]})
    dep = b.deploy(plan, "A", RunKey("suite-virtual-die", "A", 0))
    b.ready(dep, 10.0)
    specs = build_requests(plan.workload, 6, seed=2)
    s = dep.driver.open_loop(dep.endpoint.url, dep.endpoint.model, specs, np.arange(6) * 0.5, ["measure"] * 6,
                             api=plan.workload.api, sink=None, request_timeout_s=60.0, deadline_s=30.0,
                             keep_records=True, headers=None)
    assert [r.status for r in s.records or []] == ["ok"] * 3 + ["disconnect"] * 3
    assert not b.alive(dep) and b.scrape(dep) == {}
    b.teardown(dep)
    # A deployment a crashed attempt left behind (its object forgotten) is removed by cleanup.
    b.deploy(plan, "A", RunKey("suite-virtual-die", "A", 1))
    assert b.cleanup("suite-virtual-die") == 1 and b.cleanup("suite-virtual-die") == 0


def test_unknown_fault_flags_are_refused() -> None:
    from orchestrator.errors import UserError

    with pytest.raises(UserError, match="unknown fault flag"):
        VirtualBackend(faults={("A", 0, 0): ["--fault-nope"]})


def test_a_closed_loop_plan_runs_in_virtual_time(store, tmp_path) -> None:
    """A closed loop of N users through the executor on the virtual backend: one point at N
    users per run, never more than N requests in flight, each user's next request scheduled
    after its reply (plus think time), every run valid."""
    from tests.e2e.helpers import run_virtual

    plan = small_plan(name="vt-closed", workload={
        "closed": {"users": 4, "think_s": 0.05}, "output_tokens": 32,
        "prompts": {"input_tokens": {"mean": 1000}, "conversations": 100000}},
        search={"rate": {"min": 0.5, "max": 8}, "point_s": 3, "warmup_s": 0.5, "cooldown_s": 0})
    out = run_virtual(store, plan, tmp_path / "state")
    runs = store.runs(out.experiment_id)
    assert sorted(r.arm for r in runs) == ["A", "B"] and all(r.valid for r in runs), [r.invalid_reason for r in runs]
    for run in runs:
        (pt,) = store.points(run.id).itertuples()
        assert pt.users == 4 and pt.context["loop"]["kind"] == "closed"
        recs = sorted(store.requests(int(pt.id)), key=lambda r: r.scheduled_s)
        assert recs and all(r.status == "ok" for r in recs)
        events = sorted([(r.scheduled_s, 1) for r in recs] + [(r.last_token_s, -1) for r in recs])
        level = peak = 0
        for _, d in events:
            level += d
            peak = max(peak, level)
        assert peak <= 4
        ends = sorted(r.last_token_s + 0.05 for r in recs)
        # After the first four sends, each send is some user's reply plus its think time.
        assert all(any(abs(r.scheduled_s - e) < 1e-9 for e in ends) for r in recs[4:])
