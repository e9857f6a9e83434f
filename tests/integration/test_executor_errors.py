"""The executor acts on what a backend's error means (orchestrator/control/executor.py):
a PermanentError (a 403) is stored and stops the experiment, never retried; a TransientError
is stored and retried after its ``delay``."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.backends.base import Deployment, RunKey
from orchestrator.backends.kubernetes.backend import KubernetesBackend
from orchestrator.backends.virtual import VirtualBackend
from orchestrator.control.executor import Executor, ExecutorConfig
from orchestrator.control.progress import PlainProgress
from orchestrator.errors import PermanentError, TransientError
from orchestrator.plan import Plan
from orchestrator.store import Store
from tests.e2e.helpers import small_plan
from tests.support.kcluster import EmulatedCluster, cluster_fixture

pytestmark = pytest.mark.timeout(180)

# One block, two short points per search at low rates: the path, not a measurement.
SHORT_SEARCH = {"rate": {"min": 1, "max": 4}, "precision": 0.25, "point_s": 2, "warmup_s": 0.5,
                "cooldown_s": 0.5, "max_points": 2, "use_prior": False}
DESIGN = {"blocks": 1, "order": "ABBA", "seed": 5, "max_retries": 2}  # retries allowed: none may be used for a 403

kcluster = cluster_fixture(name="kcluster")


@pytest.fixture(autouse=True)
def _no_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_SKIP_CALIBRATION", "1")


def test_a_403_is_permanent_stored_once_and_never_retried(kcluster: EmulatedCluster, store: Store,
                                                          tmp_path: Path) -> None:
    plan = small_plan(name="exec-403", backend="kubernetes", search=SHORT_SEARCH, design=DESIGN, arms={
        "A": {"gpu": "H200", "layout": "colocated", "replicas": 1},
        "B": {"gpu": "H200", "layout": "colocated", "replicas": 1},
    })
    ns = "orch-exec"
    kcluster.add_namespace(ns)
    # The first apply of the run (its owner ConfigMap) is refused, once: the controller's
    # service account lacks a verb. A retry would succeed, so a retried 403 would show.
    kcluster.inject_fault("PATCH", "/configmaps/", 403)
    backend = KubernetesBackend(api=kcluster.kube_api(), namespace=ns, endpoint_url="http://127.0.0.1:9",
                                poll_s=0.1)
    sleeps: list[float] = []
    # A short ready deadline: were the 403 retried, the retry's readiness would end soon.
    executor = Executor(store, backend, ExecutorConfig(state_dir=tmp_path / "state", ready_deadline_s=5),
                        PlainProgress())
    executor._sleep = sleeps.append

    with pytest.raises(PermanentError, match="RBAC") as err:
        executor.run(plan)
    assert "lacks the RBAC verb `patch` on `configmaps`" in str(err.value)

    (exp,) = store.list_experiments()
    runs = store.runs(exp.id)
    assert len(runs) == 1, [(r.arm, r.attempt, r.status) for r in runs]
    (run,) = runs
    assert (run.arm, run.block, run.attempt, run.status, run.valid) == ("A", 0, 0, "failed", False)
    reason = (run.invalid_reason or "").lower()
    assert "403" in reason or "forbidden" in reason, reason
    assert sleeps == []
    assert kcluster.requests("PATCH", "/configmaps/") == 1, "the 403 was retried"
    assert kcluster.objects("Deployment", ns) == {}, "nothing was applied after the refusal"
    assert exp.status in ("queued", "running")  # not done: resumable once the RBAC is granted


class TransientFirstDeploy(VirtualBackend):
    """The virtual backend whose first deploy fails as a busy API server would (503, retry
    later): the fault is injected at the contract boundary; the runs are in virtual time."""

    def __init__(self, events: list[tuple]):
        super().__init__()
        self.events = events

    def deploy(self, plan: Plan, arm: str, key: RunKey) -> Deployment:
        self.events.append(("deploy", arm, key.attempt))
        if len(self.events) == 1:
            raise TransientError("injected: the cluster answered HTTP 503, try again later", delay=7.5)
        return super().deploy(plan, arm, key)


def test_a_transient_error_is_retried_after_its_delay(store: Store, tmp_path: Path, no_sockets) -> None:
    plan = small_plan(name="exec-transient", search=SHORT_SEARCH, design=DESIGN)
    events: list[tuple] = []
    executor = Executor(store, TransientFirstDeploy(events),
                        ExecutorConfig(state_dir=tmp_path / "state"), PlainProgress())
    executor._sleep = lambda s: events.append(("sleep", s))

    out = executor.run(plan)

    # The delay was waited, before the second attempt, and only once.
    assert events[:3] == [("deploy", "A", 0), ("sleep", 7.5), ("deploy", "A", 1)], events
    assert [e for e in events if e[0] == "sleep"] == [("sleep", 7.5)], events
    runs = {(r.arm, r.attempt): r for r in store.runs(out.experiment_id)}
    first, second = runs[("A", 0)], runs[("A", 1)]
    assert first.status == "failed" and first.valid is False
    assert "TransientError" in (first.invalid_reason or "") and "503" in (first.invalid_reason or "")
    assert second.status == "done" and second.valid, second.invalid_reason
    assert any(r.valid for (arm, _), r in runs.items() if arm == "B")


def test_a_prompt_length_mismatch_is_not_retried(store: Store, tmp_path: Path) -> None:
    """Issue 32: the server counting the prompts 1.5 times longer than asked (a BPE tokenizer
    under the generator's words) fails the prompt_length guard the same way on every attempt,
    so the first failure stops the experiment with the remedy; no retry is spent. In virtual
    time: no socket, no process."""
    plan = small_plan(name="prompt-mismatch", search=SHORT_SEARCH, design=DESIGN)
    backend = VirtualBackend(faults={("A", 0, 0): ["--fault-prompt-token-factor", "1.5"]})
    executor = Executor(store, backend, ExecutorConfig(state_dir=tmp_path / "state"), PlainProgress())
    with pytest.raises(PermanentError, match="prompt_length") as err:
        executor.run(plan)
    assert "workload.tokenizer" in str(err.value)
    (exp,) = store.list_experiments()
    runs = store.runs(exp.id)
    assert [(r.arm, r.attempt, r.status) for r in runs] == [("A", 0, "failed")], runs
    assert "prompt_length" in (runs[0].invalid_reason or "")


def test_without_the_fault_the_same_plan_runs(store: Store, tmp_path: Path) -> None:
    """The control of the test above: the same plan and backend with no fault passes the guard."""
    plan = small_plan(name="prompt-match", search=SHORT_SEARCH, design=DESIGN)
    out = Executor(store, VirtualBackend(), ExecutorConfig(state_dir=tmp_path / "state"), PlainProgress()).run(plan)
    runs = store.runs(out.experiment_id)
    assert {r.arm for r in runs} == {"A", "B"}
    assert all(g.passed for r in runs for g in store.guard_results(r.id) if g.name == "prompt_length")
