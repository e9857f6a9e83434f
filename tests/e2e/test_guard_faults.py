"""Each injected fault of the sim server fails the run with the guard named for it; the retry
(without the fault) is valid and the experiment completes."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import BASE, run_in_process, small_plan

pytestmark = pytest.mark.timeout(420)


@pytest.mark.parametrize(
    ("flags", "expected", "early_stop"),
    [
        (["--fault-ignore-max-tokens-streaming"], "output_limit", False),
        (["--fault-frozen-output"], "frozen_randomness", False),
        (["--fault-stall-every", "5", "--fault-stall-ms", "700"], "stalls", False),
        # Early stop must not hide a stall: a stopped point lets its in-flight streams end
        # (cancelling them once let this run pass as valid with capacity 0).
        (["--fault-stall-every", "5", "--fault-stall-ms", "700"], "stalls", True),
        (["--fault-die-after", "10"], "server", False),
    ],
    ids=["ignored-max-tokens", "frozen-output", "stalls", "stalls-early-stop", "death-mid-point"],
)
def test_fault_fails_the_run_with_its_guard(store, state, flags: list[str], expected: str, early_stop: bool) -> None:
    search = {**BASE["search"], "early_stop": True} if early_stop else BASE["search"]
    plan = small_plan(name=f"e2e-fault-{expected}" + ("-early" if early_stop else ""), search=search)
    out = run_in_process(store, plan, state, faults={("A", 0, 0): flags})
    runs = {(r.arm, r.attempt): r for r in store.runs(out.experiment_id)}
    first = runs[("A", 0)]
    assert first.status == "failed" and first.valid is False
    assert expected in (first.invalid_reason or ""), first.invalid_reason
    # A later attempt (without the fault) is valid; a busy machine may cost one more retry.
    retries = [r for (arm, attempt), r in runs.items() if arm == "A" and attempt > 0]
    assert any(r.status == "done" and r.valid for r in retries), [r.invalid_reason for r in retries]
    assert any(r.valid for (arm, _), r in runs.items() if arm == "B")
    # The failed run's records are kept, not dropped.
    failed_guards = [g for g in store.guard_results(first.id) if not g.passed]
    if expected != "server":
        assert any(g.name == expected for g in failed_guards), failed_guards
    pts = store.points(first.id)
    assert len(pts) >= 1 and sum(len(store.requests(int(pid))) for pid in pts.id) > 0
    assert out.complete
