"""Each injected fault of a simulated server fails the run with the guard named for it; the
retry (without the fault) is valid and the experiment completes. In virtual time (the faults of
`orch sim serve`, on the virtual backend): no socket, and the same outcome every time."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import BASE, run_virtual, small_plan

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_sockets")]


@pytest.mark.parametrize(
    ("flags", "expected", "early_stop"),
    [
        (["--fault-ignore-max-tokens-streaming"], "output_limit", False),
        (["--fault-frozen-output"], "frozen_randomness", False),
        (["--fault-stall-every", "5", "--fault-stall-ms", "700"], "stalls", False),
        # Early stop must not hide a stall: a stopped point lets its in-flight streams end
        # (cancelling them once let this run pass as valid with capacity 0).
        (["--fault-stall-every", "5", "--fault-stall-ms", "700"], "stalls", True),
        (["--fault-die-after", "10"], "lost the server", False),
    ],
    ids=["ignored-max-tokens", "frozen-output", "stalls", "stalls-early-stop", "death-mid-point"],
)
def test_fault_fails_the_run_with_its_guard(store, state, flags: list[str], expected: str, early_stop: bool) -> None:
    search = {**BASE["search"], "early_stop": True} if early_stop else BASE["search"]
    plan = small_plan(name=f"e2e-fault-{expected.replace(' ', '-')}" + ("-early" if early_stop else ""), search=search)
    out = run_virtual(store, plan, state, faults={("A", 0, 0): flags})
    runs = {(r.arm, r.attempt): r for r in store.runs(out.experiment_id)}
    first = runs[("A", 0)]
    assert first.status == "failed" and first.valid is False
    assert expected in (first.invalid_reason or ""), first.invalid_reason
    # The next attempt (without the fault) is valid.
    assert runs[("A", 1)].status == "done" and runs[("A", 1)].valid, runs[("A", 1)].invalid_reason
    assert any(r.valid for (arm, _), r in runs.items() if arm == "B")
    # The failed run's records are kept, not dropped.
    failed_guards = [g for g in store.guard_results(first.id) if not g.passed]
    if expected != "lost the server":
        assert any(g.name == expected for g in failed_guards), failed_guards
    pts = store.points(first.id)
    assert len(pts) >= 1 and sum(len(store.requests(int(pid))) for pid in pts.id) > 0
    assert out.complete
