"""The executor acts on what a backend's error means (orchestrator/control/executor.py):
a PermanentError (a 403) is stored and fails the experiment, never retried, and what the
backend created for the experiment is deleted; a rerun of the same plan resumes it. A
TransientError is stored and retried after its ``delay``; an interruption leaves the
experiment running (resumable)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.backends.base import Deployment, RunKey
from orchestrator.backends.kubernetes import naming
from orchestrator.backends.kubernetes.backend import KubernetesBackend
from orchestrator.backends.virtual import VirtualBackend
from orchestrator.control.executor import Executor, ExecutorConfig
from orchestrator.control.progress import PlainProgress
from orchestrator.errors import PermanentError, Terminated, TransientError
from orchestrator.plan import Plan, load_plan_file
from orchestrator.store import Store
from tests.e2e.helpers import ROOT, small_plan
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


def _orch(env: dict[str, str], *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=timeout)


def _ours(cluster: EmulatedCluster) -> dict[str, list[str]]:
    """Objects the tool created still in the cluster, by kind (namespaces by name)."""
    out: dict[str, list[str]] = {}
    for kind in ("Deployment", "Pod", "Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding"):
        names = [n for n, o in cluster.objects(kind).items()
                 if ((o.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/managed-by")
                 == "orchestrator"]
        if names:
            out[kind] = names
    if spaces := [n for n in cluster.objects("Namespace") if n.startswith("orch-")]:
        out["Namespace"] = spaces
    return out


@pytest.mark.timeout(600)
def test_a_403_is_permanent_fails_the_experiment_cleans_up_and_a_rerun_resumes(
        kcluster: EmulatedCluster, store: Store, tmp_path: Path) -> None:
    """Issue 29: a 403 is stored once and never retried; the experiment is then `failed` (not
    left `running`), the namespace the tool created for it is deleted, `orch status` says why,
    and once the identity may (the fault is gone) `orch run` of the same plan resumes the
    experiment, keeping the failed run, to done."""
    file = tmp_path / "exec-403.yaml"
    file.write_text(yaml.safe_dump(small_plan(
        name="exec-403", backend="kubernetes", search=SHORT_SEARCH, design=DESIGN,
        kubernetes={"access": "service", "startup_timeout_s": 120},
        arms={"A": {"gpu": "H200", "layout": "colocated", "replicas": 1},
              "B": {"gpu": "H200", "layout": "colocated", "replicas": 1}},
    ).model_dump(mode="json", by_alias=True, exclude_none=True)))
    plan = load_plan_file(file)
    # The first apply of the run's objects (its owner ConfigMap) is refused, once: the
    # controller's service account lacks a verb. A retry would succeed, so a retried 403 would
    # show. The namespace the tool creates for the experiment was applied before.
    kcluster.inject_fault("PATCH", "/configmaps/", 403)
    backend = KubernetesBackend(api=kcluster.kube_api(), poll_s=0.1, log=lambda line: None)
    sleeps: list[float] = []
    executor = Executor(store, backend, ExecutorConfig(state_dir=tmp_path / "state", ready_deadline_s=60),
                        PlainProgress())
    executor._sleep = sleeps.append

    with pytest.raises(PermanentError, match="RBAC") as err:
        executor.run(plan)
    (exp,) = store.list_experiments()
    message = str(err.value)
    assert "lacks the RBAC verb `patch` on `configmaps`" in message
    assert f"experiment {exp.name} failed" in message and "\n" not in message, message
    assert err.value.exit_code == 2  # what `orch run` exits with for a PermanentError

    runs = store.runs(exp.id)
    assert len(runs) == 1, [(r.arm, r.attempt, r.status) for r in runs]
    (run,) = runs
    assert (run.arm, run.block, run.attempt, run.status, run.valid) == ("A", 0, 0, "failed", False)
    reason = (run.invalid_reason or "").lower()
    assert "403" in reason or "forbidden" in reason, reason
    assert sleeps == []
    assert kcluster.requests("PATCH", "/configmaps/") == 1, "the 403 was retried"
    assert store.get_experiment(exp.id).status == "failed"
    ns = naming.experiment_namespace(exp.name)
    assert kcluster.requests("PATCH", f"/api/v1/namespaces/{ns}") >= 1, "the tool created its namespace"
    kcluster.wait_for(lambda: not _ours(kcluster), 60, what="every object and namespace of the tool gone")

    env = {**os.environ, "KUBECONFIG": str(kcluster.kubeconfig), "ORCH_SKIP_CALIBRATION": "1",
           "ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}", "ORCH_STATE_DIR": str(tmp_path / "state"),
           "ORCH_K8S_POLL_S": "0.1"}
    shown = _orch(env, "status", timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    (line,) = [ln for ln in shown.stdout.splitlines() if ln.startswith(exp.name)]
    assert f"{exp.name} (id {exp.id}): failed" in line and "lacks the RBAC verb `patch`" in line, line
    doc = json.loads(_orch(env, "status", exp.name, "--json", timeout=120).stdout)
    (e,) = doc["experiments"]
    assert e["status"] == "failed" and "lacks the RBAC verb" in (e["reason"] or ""), e

    # The fault is gone (the RBAC granted): the same plan resumes the experiment to done.
    again = _orch(env, "run", str(file), "--backend", "kubernetes", "--json", "--allow-low-power")
    assert again.returncode == 0, again.stderr[-4000:]
    out = json.loads(again.stdout)
    assert out["experiment"]["id"] == exp.id and out["experiment"]["resumed"] is True, out["experiment"]
    assert store.get_experiment(exp.id).status == "done"
    runs = store.runs(exp.id)
    assert runs[0].id == run.id and runs[0].status == "failed", "the failed run's records are kept"
    assert {r.arm for r in runs[1:]} == {"A", "B"}, [(r.arm, r.attempt, r.status) for r in runs]
    assert all(r.status in ("done", "failed") for r in runs), [(r.arm, r.attempt, r.status) for r in runs]
    kcluster.wait_for(lambda: not _ours(kcluster), 60, what="nothing of the tool left after the rerun")
    kcluster.wait_for(lambda: not kcluster.live_processes(), 30, what="processes stopped")


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


class Recording(VirtualBackend):
    """The virtual backend, recording every cleanup the executor asks for."""

    def __init__(self, cleanups: list[tuple[str, bool]], **kwargs: Any):
        super().__init__(**kwargs)
        self.cleanups = cleanups

    def cleanup(self, experiment: str, final: bool = False) -> int:
        self.cleanups.append((experiment, final))
        return super().cleanup(experiment, final)


def test_a_deterministic_guard_failure_fails_the_experiment_and_a_fixed_rerun_resumes_it(
        store: Store, tmp_path: Path) -> None:
    """A deterministic guard failure (prompt_length) is a PermanentError: the experiment is
    `failed` and the backend's final cleanup runs. Rerun of the same plan once the cause is
    gone (here: the server counts the prompts right): the same experiment resumes, its failed
    run kept, and runs to done; with max_retries 0 the failed run spent no retry. In virtual
    time."""
    plan = small_plan(name="prompt-rerun", search=SHORT_SEARCH, design={**DESIGN, "max_retries": 0})
    cleanups: list[tuple[str, bool]] = []
    faulty = Recording(cleanups, faults={("A", 0, 0): ["--fault-prompt-token-factor", "1.5"]})
    with pytest.raises(PermanentError, match="prompt_length") as err:
        Executor(store, faulty, ExecutorConfig(state_dir=tmp_path / "state"), PlainProgress()).run(plan)
    (exp,) = store.list_experiments()
    assert str(err.value).startswith(f"experiment {exp.name} failed: ")
    assert store.get_experiment(exp.id).status == "failed"
    assert cleanups[-1] == (exp.name, True), cleanups
    (failed,) = store.runs(exp.id)

    cleanups.clear()
    out = Executor(store, Recording(cleanups), ExecutorConfig(state_dir=tmp_path / "state"), PlainProgress()).run(plan)
    assert (out.experiment_id, out.resumed) == (exp.id, True)
    assert store.get_experiment(exp.id).status == "done"
    runs = store.runs(exp.id)
    assert runs[0].id == failed.id and runs[0].status == "failed"
    assert sorted((r.arm, r.attempt, r.status, r.valid) for r in runs[1:]) == [
        ("A", 1, "done", True), ("B", 0, "done", True)], [(r.arm, r.attempt, r.status) for r in runs]
    assert cleanups[-1] == (exp.name, True)
    # A done experiment is never resumed: the plan run again starts another.
    again = Executor(store, Recording(cleanups), ExecutorConfig(state_dir=tmp_path / "state"),
                     PlainProgress()).run(plan)
    assert again.experiment_id != exp.id and not again.resumed


class InterruptedDeploy(VirtualBackend):
    """The virtual backend whose first deploy is interrupted (Ctrl-C, or SIGTERM as Terminated)."""

    def __init__(self, cleanups: list[tuple[str, bool]], error: BaseException):
        super().__init__()
        self.cleanups, self.error = cleanups, error

    def deploy(self, plan: Plan, arm: str, key: RunKey) -> Deployment:
        raise self.error

    def cleanup(self, experiment: str, final: bool = False) -> int:
        self.cleanups.append((experiment, final))
        return 0


@pytest.mark.parametrize("error", [KeyboardInterrupt(), Terminated(signal.SIGTERM)], ids=["ctrl-c", "sigterm"])
def test_an_interruption_leaves_the_experiment_resumable(store: Store, tmp_path: Path, error: BaseException) -> None:
    """What is not permanent keeps today's behaviour: an interrupted experiment stays `running`
    (resumable by `orch run` of the plan), its run aborted, and nothing final is cleaned up.
    In virtual time."""
    plan = small_plan(name="interrupted", search=SHORT_SEARCH, design=DESIGN)
    cleanups: list[tuple[str, bool]] = []
    executor = Executor(store, InterruptedDeploy(cleanups, error), ExecutorConfig(state_dir=tmp_path / "state"),
                        PlainProgress())
    with pytest.raises(KeyboardInterrupt):
        executor.run(plan)
    (exp,) = store.list_experiments()
    assert store.get_experiment(exp.id).status == "running"
    assert [r.status for r in store.runs(exp.id)] == ["aborted"]
    assert (exp.name, True) not in cleanups, cleanups
