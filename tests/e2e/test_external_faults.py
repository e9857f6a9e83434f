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
    ("fault", "metrics", "expected"),
    [
        ({"ignore_max_tokens": True}, True, "output_limit"),
        ({"frozen_output": True}, True, "frozen_randomness"),
        # A pause of 0.8 s: above the default 500 ms gap bound by more than any lateness could
        # take away (a loaded machine only lengthens a gap).
        ({"stall_s": 0.8}, True, "stalls"),
        ({"cache_hits": True}, True, "prefix_hit_rate"),
        # No /metrics: the hit rate comes from the cached tokens each reply reports.
        ({"cache_hits": True}, False, "prefix_hit_rate"),
        # A few requests into the first point (it schedules more: asserted below), so the server
        # is lost there, before any guard of that point is looked at.
        ({"drop_after": 4}, True, "lost the server"),
    ],
    ids=["ignored-max-tokens", "repeated-output", "stalls", "cache-hits-metrics", "cache-hits-usage",
         "dropped-connections"],
)
def test_a_fault_fails_the_run_with_its_guard(store, state, fault: dict[str, Any], metrics: bool,
                                              expected: str) -> None:
    """The plan's default guard bounds. Other guards (generator lag, rate, steady state) may
    also fail on a loaded machine, on either arm: they are right to, and only the guard the
    fault is for is asserted, failing on the faulty arm and passing on the honest one."""
    with start_fault_server(**fault) as bad, start_fault_server() as good:
        data = external_plan(bad.url, good.url, metrics=metrics, name=f"ext-{expected.replace(' ', '-')}")
        out = run_external(store, validate_plan(data), state)
        assert bad.streamed > 0  # the fault met real load, not only the readiness check
    runs = {r.arm: r for r in store.runs(out.experiment_id)}
    a, b = runs["A"], runs["B"]
    assert a.status == "failed" and a.valid is False
    assert expected in (a.invalid_reason or ""), a.invalid_reason
    assert b.status in ("done", "failed") and b.valid is not None  # judged, whatever it found
    if expected == "lost the server":
        first = store.points(a.id).iloc[0]
        assert int(first.n_scheduled) > fault["drop_after"]
    else:
        a_guards, b_guards = store.guard_results(a.id), store.guard_results(b.id)
        assert expected in {g.name for g in a_guards if not g.passed}, a_guards
        # The same guard was judged on the honest arm, and passed there.
        mine = [g for g in b_guards if g.name == expected]
        assert mine and all(g.passed for g in mine), mine
    # The failed run's records are kept, and every scheduled request is accounted for.
    pts = store.points(a.id)
    assert len(pts) >= 1
    for _, p in pts.iterrows():
        assert len(store.requests(int(p.id))) == int(p.n_scheduled)
    assert a.fingerprint["backend"] == "external" and a.fingerprint["details"]["models"][0]["id"] == "fault-model"
    # Arm A failed with no retries: the experiment is incomplete, the gate says so.
    assert not out.complete and out.gate_code == 5
