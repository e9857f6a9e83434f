"""Each fault of a server behind an external endpoint fails the run with the guard named for
it, through the executor (arm A faulty, arm B honest, no retries): the guards work unchanged
for stacks the orchestrator did not start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.external import ExternalBackend
from orchestrator.control.executor import Executor, ExecutorConfig, ExperimentOutcome
from orchestrator.control.progress import PlainProgress
from orchestrator.plan import Plan, validate_plan
from tests.support.fault_server import external_plan, start_fault_server

pytestmark = pytest.mark.timeout(180)


def run_external(store, plan: Plan, state: Path) -> ExperimentOutcome:
    cfg = ExecutorConfig(state_dir=state, ready_deadline_s=20)
    return Executor(store, ExternalBackend(env={}), cfg, PlainProgress()).run(plan)


@pytest.mark.parametrize(
    ("fault", "metrics", "guards", "expected"),
    [
        ({"ignore_max_tokens": True}, True, {}, "output_limit"),
        ({"frozen_output": True}, True, {}, "frozen_randomness"),
        # 250 ms: far above what a loaded 2-core machine adds to an honest stream, far below the stall.
        ({"stall_s": 0.6}, True, {"stall_gap_ms": 250}, "stalls"),
        ({"cache_hits": True}, True, {}, "prefix_hit_rate"),
        # No /metrics: the hit rate comes from the cached tokens each reply reports.
        ({"cache_hits": True}, False, {}, "prefix_hit_rate"),
        ({"drop_after": 8}, True, {}, "lost the server"),
    ],
    ids=["ignored-max-tokens", "repeated-output", "stalls", "cache-hits-metrics", "cache-hits-usage",
         "dropped-connections"],
)
def test_a_fault_fails_the_run_with_its_guard(store, state, fault: dict[str, Any], metrics: bool,
                                              guards: dict[str, Any], expected: str) -> None:
    with start_fault_server(**fault) as bad, start_fault_server() as good:
        data = external_plan(bad.url, good.url, metrics=metrics, name=f"ext-{expected.replace(' ', '-')}",
                             # 150 ms: these points are 3 s (p99 = the worst of ~20 sends) on a CI
                             # machine running 4 test workers on 2 cores; the guard under test is
                             # the server's, and the honest arm B must pass every guard too.
                             guards={"max_send_lag_p99_ms": 150, **guards})
        out = run_external(store, validate_plan(data), state)
        assert bad.streamed > 0  # the fault met real load, not only the readiness check
    runs = {r.arm: r for r in store.runs(out.experiment_id)}
    a, b = runs["A"], runs["B"]
    assert a.status == "failed" and a.valid is False
    assert expected in (a.invalid_reason or ""), a.invalid_reason
    assert b.status == "done" and b.valid, b.invalid_reason
    if expected != "lost the server":
        failed = {g.name for g in store.guard_results(a.id) if not g.passed}
        assert failed == {expected}, failed
        # The same guard passed on the honest arm.
        assert all(g.passed for g in store.guard_results(b.id) if g.name == expected)
    # The failed run's records are kept, and every scheduled request is accounted for.
    pts = store.points(a.id)
    assert len(pts) >= 1
    for _, p in pts.iterrows():
        assert len(store.requests(int(p.id))) == int(p.n_scheduled)
    assert a.fingerprint["backend"] == "external" and a.fingerprint["details"]["models"][0]["id"] == "fault-model"
    assert not out.complete and out.gate_code == 5
