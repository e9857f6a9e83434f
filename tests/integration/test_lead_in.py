"""Lead-in runs (``design.carryover.lead_in_s``, issue 31): every measured run of a block follows a
run of the block's first arm, so a first-order carry-over (whatever runs after an arm is slowed)
is the same for every run of the block and cancels in its ratios, whichever arm leaves it. In
virtual time: the real executor and store; the virtual backend's carry-over slows the deployment
right after one of the named arm (its efficiency, stored in each run's fingerprint)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.base import Deployment, RunKey
from orchestrator.backends.virtual import VirtualBackend
from orchestrator.control.executor import Executor, ExecutorConfig
from orchestrator.control.progress import PlainProgress
from orchestrator.errors import TransientError
from orchestrator.plan import Plan
from orchestrator.store import Store
from tests.e2e.helpers import BASE, small_plan

pytestmark = pytest.mark.timeout(180)

SHORT_SEARCH = {"rate": {"min": 1, "max": 4}, "precision": 0.25, "point_s": 2, "warmup_s": 0.5,
                "cooldown_s": 0.5, "max_points": 2, "use_prior": False}


@pytest.fixture(autouse=True)
def _no_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_SKIP_CALIBRATION", "1")


class Recording(VirtualBackend):
    """The virtual backend, recording the order of its deployments."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.order: list[str] = []

    def deploy(self, plan: Plan, arm: str, key: RunKey) -> Deployment:
        self.order.append(f"{arm}{'*' if key.is_lead_in else ''}{key.block}")
        return super().deploy(plan, arm, key)


def _run(store: Store, tmp_path: Path, lead_in_s: float, **plan: Any) -> tuple[Recording, dict[tuple[int, str], float]]:
    design = {"blocks": 3, "order": "randomized", "seed": 7, "max_retries": 1,
              "carryover": {"lead_in_s": lead_in_s}}  # seed 7: blocks B-A, B-A, A-B
    backend = Recording(carryover={"B": 0.05})
    out = Executor(store, backend, ExecutorConfig(state_dir=tmp_path / f"state{lead_in_s}"), PlainProgress()).run(
        small_plan(name=f"lead-in-{lead_in_s:g}", search=SHORT_SEARCH, design=design, **plan))
    eff = {(r.block, r.arm): r.fingerprint["details"]["efficiency"] for r in store.runs(out.experiment_id)
           if r.status == "done" and r.valid}
    return backend, eff


def test_without_lead_ins_a_one_arm_carry_over_biases_blocks(store: Store, tmp_path: Path) -> None:
    """The control: B then A in a block, A runs 5% slow and B does not (B/A reads 5% high)."""
    backend, eff = _run(store, tmp_path, 0)
    assert backend.order == ["B0", "A0", "B1", "A1", "A2", "B2"]
    assert eff[(0, "A")] == pytest.approx(0.95) and eff[(0, "B")] == pytest.approx(1.0)
    assert eff[(1, "A")] == pytest.approx(0.95) and eff[(1, "B")] == pytest.approx(1.0)


def test_lead_ins_give_every_run_of_a_block_the_same_predecessor(store: Store, tmp_path: Path) -> None:
    backend, eff = _run(store, tmp_path, 3)
    assert backend.order == ["B*0", "B0", "A0", "B*1", "B1", "A1", "A*2", "A2", "B2"]
    for block in range(3):
        assert eff[(block, "A")] == pytest.approx(eff[(block, "B")]), (block, eff)
    (exp,) = [e for e in store.list_experiments() if e.name.startswith("lead-in-3")]
    assert all(r.attempt >= 0 for r in store.runs(exp.id))  # lead-ins are not stored runs


def test_with_three_arms_each_later_run_gets_its_own_lead_in(store: Store, tmp_path: Path) -> None:
    """Williams order over A, B, C: the third run of a block follows the second arm, so it gets a
    lead-in of the first arm too (two lead-ins a block)."""
    arms = {**BASE["arms"], "C": dict(BASE["arms"]["A"])}
    design = {"blocks": 1, "order": "ABBA", "seed": 3, "max_retries": 0, "carryover": {"lead_in_s": 2}}
    backend = Recording(carryover={"C": 0.05, "B": 0.03})
    out = Executor(store, backend, ExecutorConfig(state_dir=tmp_path / "s3"), PlainProgress()).run(
        small_plan(name="lead-in-3arms", search=SHORT_SEARCH, design=design, arms=arms))
    first = backend.order[0].replace("*", "")[0]
    assert backend.order[0] == f"{first}*0" and backend.order[1] == f"{first}0"
    assert backend.order[3] == f"{first}*0" and len(backend.order) == 5
    effs = {r.fingerprint["details"]["efficiency"] for r in store.runs(out.experiment_id)}
    assert len(effs) == 1  # every measured run followed a run of the first arm


class FailingLeadIns(Recording):
    """Lead-in deployments whose server is lost before ready (``fail`` times), as a dead pod."""

    def __init__(self, fail: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.fail = fail

    def ready(self, deployment: Deployment, deadline_s: float) -> None:
        if deployment.key.is_lead_in and self.fail > 0:
            self.fail -= 1
            raise TransientError("lead-in server exited", delay=0.0)
        super().ready(deployment, deadline_s)


def test_a_failed_lead_in_is_a_failed_attempt_and_runs_again(store: Store, tmp_path: Path) -> None:
    design = {"blocks": 1, "order": "ABBA", "seed": 3, "max_retries": 1, "carryover": {"lead_in_s": 2}}
    backend = FailingLeadIns(1)
    Executor(store, backend, ExecutorConfig(state_dir=tmp_path / "f1"), PlainProgress()).run(
        small_plan(name="lead-in-fails-once", search=SHORT_SEARCH, design=design))
    assert backend.order == ["A*0", "A*0", "A0", "B0"]  # the lead-in again, then the block as planned


def test_lead_ins_that_keep_failing_leave_the_run_out_with_why(store: Store, tmp_path: Path) -> None:
    design = {"blocks": 1, "order": "ABBA", "seed": 3, "max_retries": 1, "carryover": {"lead_in_s": 2}}
    backend = FailingLeadIns(99)
    notes: list[str] = []

    class Notes(PlainProgress):
        def note(self, text: str) -> None:
            notes.append(text)

    out = Executor(store, backend, ExecutorConfig(state_dir=tmp_path / "f2"), Notes()).run(
        small_plan(name="lead-in-fails", search=SHORT_SEARCH, design=design))
    assert not store.runs(out.experiment_id)  # no measured run without its lead-in
    assert any("no valid run after 2 attempt(s)" in n for n in notes), notes
    assert sum("the lead-in of arm A failed" in n for n in notes) == 4  # 2 attempts of A, then of B
