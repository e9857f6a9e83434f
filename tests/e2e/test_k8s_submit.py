"""`orch submit` runs the quickstart experiment through the Ray controller on the emulated
cluster (orchestrator/kcluster/), and survives the controller being killed mid-run.

A real local Ray head declares the H200 pool as a Ray resource and runs with the cluster's
KUBECONFIG in its environment, so the controller's experiment task (a Ray worker) builds the
Kubernetes backend as in a cluster. Once a run is done and the next one has stored a point,
the controller actor is killed: Ray fate-shares the experiment task with its owner, so the task
dies with it and leaves its run 'running' and its pods up. `orch controller serve` then creates
a new controller, which resumes the experiment: the interrupted run is aborted (its records
kept), its leftovers deleted, and the experiment goes on where it stopped to a stored verdict,
with no run or point twice and nothing left on the cluster.

The Ray processes reach the cluster as the chart's pods do: with the chart's exact permissions
(its ServiceAccount, Role, RoleBinding, ClusterRole and ClusterRoleBinding, rendered by Helm's
SDK, installed in the release namespace), a kubeconfig of that service account and
ORCH_K8S_NAMESPACE naming the release namespace; the emulated API server enforces RBAC, and its
audit log shows that nothing was refused, the new controller's clean-up of the interrupted run
included."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.store import Store
from tests.support.chart import install_chart_rbac, keep_whole_audit, refusals
from tests.support.kcluster import EmulatedCluster, cpu_node, gpu_node, loopback_ok
from tests.support.ray_head import ray_head, stop_group

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "tests" / "e2e" / "plans" / "k8s-quickstart.yaml"
OURS = {"app.kubernetes.io/managed-by": "orchestrator"}
KINDS = ("Deployment", "Pod", "Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding")
RELEASE_NS = "llm-bench"  # the chart's release namespace, where arms run

pytestmark = [pytest.mark.timeout(1200),
              pytest.mark.skipif(not loopback_ok("127.77.0.0/16"), reason="loopback range does not bind")]

KILL = """
import sys, ray
ray.init(address=sys.argv[1], namespace="orchestrator", log_to_driver=False)
ray.kill(ray.get_actor("orchestrator-controller", namespace="orchestrator"), no_restart=True)
ray.shutdown()
"""


def orch(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=timeout)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def ours(cluster: EmulatedCluster, kind: str) -> list[str]:
    return [name for name, o in cluster.objects(kind).items()
            if all(((o.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in OURS.items())]


def wait(what: str, predicate, timeout: float, interval: float = 0.25, why=lambda: ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; {why()}")


def test_submit_kill_and_restart_of_the_controller_resumes_without_duplicates(tmp_path: Path) -> None:
    nodes = [gpu_node("h200-a", pool="h200-pool"), gpu_node("h200-b", pool="h200-pool"), cpu_node()]
    with EmulatedCluster(nodes=nodes) as cluster:
        identity, kubeconfig = install_chart_rbac(cluster, RELEASE_NS)
        keep_whole_audit(cluster)
        base = {"KUBECONFIG": kubeconfig, "ORCH_K8S_NAMESPACE": RELEASE_NS, "ORCH_SKIP_CALIBRATION": "1",
                "ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}",
                "ORCH_STATE_DIR": str(tmp_path / "state"), "ORCH_K8S_POLL_S": "0.2"}
        with ray_head(tmp_path, {"H200": 8}, base) as (address, env):
            head_log = tmp_path / "ray-head.log"
            serve_log = tmp_path / "controller-serve.log"

            def logs() -> str:
                return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                                 for p in (head_log, serve_log) if p.exists())

            sub = orch(env, "submit", str(PLAN), "--address", address, "--json", "--allow-low-power")
            assert sub.returncode == 0, sub.stderr[-3000:]
            doc = json.loads(sub.stdout)
            exp_id = int(doc["experiment_id"])
            assert doc["gpus"] == {"H200": 2.0}

            store = Store.open(env["ORCH_DATABASE_URL"])
            serve: subprocess.Popen | None = None
            try:
                def state() -> str:
                    runs = store.runs(exp_id)
                    return (f"status {store.get_experiment(exp_id).status}; runs "
                            f"{[(r.block, r.arm, r.attempt, r.status, r.invalid_reason) for r in runs]}\n"
                            f"refused: {refusals(cluster)}\n{logs()}")

                # 1. Run until one run has finished (valid or not: the plan's default guard bounds
                # may fail on a loaded machine) and the next has stored a point: the kill lands mid-run.
                def mid_run():
                    exp = store.get_experiment(exp_id)
                    assert exp.status not in ("done", "failed", "cancelled"), state()
                    runs = store.runs(exp_id)
                    live = [r for r in runs if r.status == "running"]
                    if any(r.status in ("done", "failed") for r in runs) and live \
                            and len(store.points(live[0].id)) >= 1:
                        return live[0]
                    return None

                victim = wait("a finished run and a point of the next", mid_run, 480, why=state)
                controller_id = store.get_experiment(exp_id).controller_id or ""
                assert controller_id.startswith("ray:"), controller_id
                task_pid = int(controller_id.rsplit(":", 1)[1])
                assert alive(task_pid)

                # 2. Kill the controller: its experiment task dies with it (Ray fate-sharing).
                kill = subprocess.run([sys.executable, "-c", KILL, address], cwd=ROOT, env=env,
                                      capture_output=True, text=True, timeout=120)
                assert kill.returncode == 0, kill.stderr[-3000:]
                wait(f"the experiment task (pid {task_pid}) to die with its controller",
                     lambda: not alive(task_pid), 60, why=state)
                killed_at = {r.id: r for r in store.runs(exp_id)}
                points_at_kill = {rid: len(store.points(rid)) for rid in killed_at}
                time.sleep(8)  # longer than a point (4 s + warm-up and cool-down): nothing moves
                after = {r.id: r for r in store.runs(exp_id)}
                assert after == killed_at, state()
                assert {rid: len(store.points(rid)) for rid in after} == points_at_kill, state()
                # The dying task may have torn its deployment down on the way out (Ray exits the
                # worker gracefully first) or left it: either way the next controller cleans up.
                mid = after[victim.id].status == "running"
                assert store.get_experiment(exp_id).status == "running"

                # 3. Restart: `orch controller serve` creates a new controller, which resumes.
                with open(serve_log, "wb") as out:
                    serve = subprocess.Popen(
                        [sys.executable, "-m", "orchestrator.cli.main", "controller", "serve",
                         "--address", address, "--interval", "1"],
                        cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

                def finished():
                    assert serve.poll() is None, state()
                    return store.get_experiment(exp_id).status in ("done", "failed", "cancelled")

                wait("the resumed experiment to finish", finished, 600, interval=1.0, why=state)
                assert store.get_experiment(exp_id).status == "done", state()
                new_id = store.get_experiment(exp_id).controller_id or ""
                assert new_id.startswith("ray:") and new_id != controller_id, new_id

                # 4. What the store holds: each (block, arm) run, valid and done at most once, no
                # run or point twice.
                runs = store.runs(exp_id)
                keys = Counter((r.block, r.arm, r.attempt) for r in runs)
                assert all(n == 1 for n in keys.values()), keys
                valid = Counter((r.block, r.arm) for r in runs if r.status == "done" and r.valid)
                assert {(r.block, r.arm) for r in runs} == {(b, a) for b in range(2) for a in "AB"}, state()
                assert all(n == 1 for n in valid.values()), state()
                assert {r.status for r in runs} <= {"done", "aborted", "failed"}, state()
                for r in runs:
                    seqs = Counter(int(s) for s in store.points(r.id)["seq"])
                    assert all(n == 1 for n in seqs.values()), (r.block, r.arm, r.attempt, seqs)
                # Runs finished before the kill are untouched; the interrupted one is aborted with
                # its points kept and none added; the new controller re-ran its (block, arm).
                for rid, before in killed_at.items():
                    if before.status != "running":
                        assert runs[[r.id for r in runs].index(rid)] == before
                now = {r.id: r for r in runs}
                if mid:
                    v = now[victim.id]
                    assert v.status == "aborted" and not v.valid and "interrupted" in (v.invalid_reason or "")
                    assert len(store.points(v.id)) == points_at_kill[v.id] >= 1
                    redo = [r for r in runs if (r.block, r.arm) == (v.block, v.arm) and r.id != v.id]
                    assert redo and all(r.attempt > v.attempt for r in redo)
                verdicts = store.verdicts(exp_id)
                assert verdicts and verdicts[0].verdict in ("ACCEPT", "REJECT", "INCONCLUSIVE"), verdicts
            finally:
                store.close()
                if serve is not None:
                    stop_group(serve)

            # 5. Nothing of the experiment is left on the cluster: no object, namespace or process.
            for kind in KINDS:
                assert not ours(cluster, kind), (kind, ours(cluster, kind))
            assert not [n for n in cluster.objects("Namespace") if n.startswith("orch-")]
            assert cluster.get("Namespace", RELEASE_NS) is not None
            assert not cluster.live_processes()

            # 6. All of it as the chart's service account, and RBAC refused nothing.
            audit = cluster._call(lambda: list(cluster.apiserver.audit))
            assert not refusals(cluster), refusals(cluster)
            done = {(verb, what) for user, verb, what, _, _ in audit if user == identity}
            assert {("create", "deployments"), ("delete", "deployments"), ("get", "nodes")} <= done, sorted(done)
            assert not [a for a in audit if a[0] == identity and a[2] == "namespaces"]
