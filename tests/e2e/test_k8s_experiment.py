"""A whole experiment through `orch run --backend kubernetes`, as a user runs it, on the emulated
cluster (orchestrator/kcluster/): the official client reaches the emulated API server through
KUBECONFIG, pods land on labelled H200 nodes, their vLLM containers run as simulated engines
and the router as the real vllm-router discovering its workers through the API. Blocks run to
a stored verdict, and the run leaves no object and no process behind. Real time with the plan's
default guard bounds: the runs' validity is not asserted, only what load cannot change.

It runs with the Helm chart's exact permissions, as in the chart's pods: the chart's
ServiceAccount, Role, RoleBinding, ClusterRole and ClusterRoleBinding (rendered by Helm's SDK)
installed in the release namespace, a kubeconfig of that service account, and
ORCH_K8S_NAMESPACE naming the release namespace. The emulated API server enforces RBAC for it,
so a request the chart does not grant (the final cleanup reading the namespace, say) is a 403
and the run fails; its audit log shows that nothing was refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.backends.base import Fingerprint
from orchestrator.store import Store
from tests.support.chart import RBAC_KINDS, install_chart_rbac, keep_whole_audit, refusals
from tests.support.kcluster import EmulatedCluster, cpu_node, gpu_node, loopback_ok

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "tests" / "e2e" / "plans" / "k8s-quickstart.yaml"
RELEASE_NS = "llm-bench"  # the chart's release namespace, where arms run

pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(not loopback_ok("127.77.0.0/16"), reason="loopback range does not bind")]


def orch(env: dict[str, str], *args: str, timeout: float = 800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=timeout)


def _env(kubeconfig: str, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": kubeconfig, "ORCH_K8S_NAMESPACE": RELEASE_NS, "ORCH_SKIP_CALIBRATION": "1",
            "ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}",
            "ORCH_STATE_DIR": str(tmp_path / "state"), "ORCH_K8S_POLL_S": "0.2"}


def test_orch_run_backend_kubernetes_runs_to_a_stored_verdict_and_leaves_nothing(tmp_path: Path) -> None:
    nodes = [gpu_node("h200-a", pool="h200-pool"), gpu_node("h200-b", pool="h200-pool"), cpu_node()]
    with EmulatedCluster(nodes=nodes) as cluster:
        identity, kubeconfig = install_chart_rbac(cluster, RELEASE_NS)
        keep_whole_audit(cluster)
        chart_objects = {kind: sorted(cluster.objects(kind, RELEASE_NS if kind in ("ServiceAccount", "Role", "RoleBinding")
                                                      else None)) for kind in RBAC_KINDS}
        # The chart grants nothing on namespaces (so neither creating one nor reading its own).
        assert not cluster.can(identity, "get", "namespaces", RELEASE_NS, name=RELEASE_NS)
        assert not cluster.can(identity, "create", "namespaces")
        env = _env(kubeconfig, tmp_path)
        r = orch(env, "run", str(PLAN), "--backend", "kubernetes", "--json", "--allow-low-power")
        assert r.returncode == 0, (r.stderr[-4000:], refusals(cluster))
        doc = json.loads(r.stdout)
        # Start-up progress was shown while the pods came up.
        assert "pods:" in r.stderr and "ready" in r.stderr, r.stderr[-2000:]

        # Every block ran each arm (retried while invalid: the plan's default guard bounds may
        # fail on a loaded machine, and are right to); each run judged on observed fingerprints;
        # every block with a valid run of each arm judged back to back.
        store = Store.open(env["ORCH_DATABASE_URL"])
        try:
            exp_id = doc["experiment"]["id"]
            runs = store.runs(exp_id)
            pairs = {(b, a) for b in range(2) for a in "AB"}
            assert {(r.block, r.arm) for r in runs} == pairs, [(r.block, r.arm, r.invalid_reason) for r in runs]
            valid = [r for r in runs if r.valid and r.status == "done"]
            assert all(n == 1 for n in Counter((r.block, r.arm) for r in valid).values()), valid
            complete_blocks = {b for b in range(2) if {(b, "A"), (b, "B")} <= {(r.block, r.arm) for r in valid}}
            assert doc["experiment"]["complete"] == (complete_blocks == {0, 1})
            for run in runs:
                assert run.status in ("done", "failed") and run.valid is not None, run
                if run.valid or "guard failed" in (run.invalid_reason or ""):
                    fp = Fingerprint.from_dict(run.fingerprint)
                    assert fp.backend == "kubernetes" and fp.gpu_type == "H200"
                    assert fp.gpu_products == ("NVIDIA-H200",) and fp.node_pools and fp.driver_versions
                    assert fp.image_digests() and set(fp.nodes) <= {"h200-a", "h200-b"}
                    assert fp.details["access_path"]["mode"] == "service"
                    assert fp.kv_transport == ("nixl/tcp" if run.arm == "B" else None)
                    assert store.guard_results(run.id)
                points = store.points(run.id)
                assert len(points) >= 1 or not run.valid
                for _, p in points.iterrows():
                    assert len(store.requests(int(p.id))) == int(p.n_scheduled)
                if run.valid and run.block in complete_blocks:
                    b2b = [g for g in store.guard_results(run.id) if g.name == "back_to_back"]
                    assert b2b and all(g.passed for g in b2b), b2b
            (verdict,) = doc["verdicts"]
            assert verdict["verdict"] in ("ACCEPT", "REJECT", "INCONCLUSIVE")
            assert set(verdict["blocks_used"]) <= complete_blocks and verdict["blocks"] == len(verdict["blocks_used"])
            assert (doc["gate_exit_code"] == 5) == (complete_blocks != {0, 1})
        finally:
            store.close()

        # The gate reads the same from the store as `orch run` printed.
        gate = orch(env, "verdict", doc["experiment"]["name"], "--gate", "--json", timeout=120)
        assert gate.returncode == doc["gate_exit_code"], (gate.returncode, gate.stdout[-2000:])

        # Nothing of the run is left: no object in any namespace of ours, no namespace was made
        # (the arms ran in the release namespace, which is kept with the chart's objects), and
        # no engine or router process still runs.
        for kind in ("Deployment", "Pod", "Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding"):
            ours = [o for o in cluster.objects(kind).values()
                    if (o.get("metadata", {}).get("labels") or {}).get("app.kubernetes.io/managed-by") == "orchestrator"]
            assert not ours, (kind, [o["metadata"]["name"] for o in ours])
        assert not [n for n in cluster.objects("Namespace") if n.startswith("orch-")]
        assert cluster.get("Namespace", RELEASE_NS) is not None
        assert {kind: sorted(cluster.objects(kind, RELEASE_NS if kind in ("ServiceAccount", "Role", "RoleBinding")
                                             else None)) for kind in RBAC_KINDS} == chart_objects
        assert not cluster.live_processes()

        # Everything was done as the chart's service account, and RBAC refused nothing: not the
        # backend (the final cleanup never reads the namespace it was given) nor the routers'
        # service discovery under the Roles the backend gave them.
        audit = cluster._call(lambda: list(cluster.apiserver.audit))
        assert not refusals(cluster), refusals(cluster)
        done = {(verb, what) for user, verb, what, ns, allowed in audit if user == identity}
        assert {("create", "deployments"), ("delete", "deployments"), ("get", "nodes")} <= done, sorted(done)
        assert not [a for a in audit if a[0] == identity and a[2] == "namespaces"]


def test_lead_in_runs_deploy_and_leave_nothing_on_the_cluster(tmp_path: Path) -> None:
    """Lead-in runs (``design.carryover.lead_in_s``) on the emulated cluster with the chart's
    permissions: each block's lead-in is deployed (``...-b<block>-lead1`` objects, valid to the
    strict API server), loaded, deleted, and never stored as a run; RBAC refuses nothing."""
    import yaml

    data = yaml.safe_load(PLAN.read_text())
    data["design"]["carryover"] = {"lead_in_s": 1}
    data["name"] = "k8s-lead-in"
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(data))
    nodes = [gpu_node("h200-a", pool="h200-pool"), gpu_node("h200-b", pool="h200-pool"), cpu_node()]
    with EmulatedCluster(nodes=nodes) as cluster:
        identity, kubeconfig = install_chart_rbac(cluster, RELEASE_NS)
        keep_whole_audit(cluster)
        env = _env(kubeconfig, tmp_path)
        r = orch(env, "run", str(plan), "--backend", "kubernetes", "--json", "--allow-low-power")
        assert r.returncode == 0, (r.stderr[-4000:], refusals(cluster))
        leads = [line for line in r.stderr.splitlines() if "lead-in 1 of arm" in line]
        assert [line.split(":")[0].strip() for line in leads] == ["block 0", "block 1"], r.stderr[-3000:]
        assert "of arm A" in leads[0] and "of arm B" in leads[1]  # ABBA: each block's first arm
        doc = json.loads(r.stdout)
        store = Store.open(env["ORCH_DATABASE_URL"])
        try:
            runs = store.runs(doc["experiment"]["id"])
            assert all(run.attempt >= 0 for run in runs)  # lead-ins are not stored runs
        finally:
            store.close()
        for kind in ("Deployment", "Pod", "Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding"):
            ours = [o for o in cluster.objects(kind).values()
                    if (o.get("metadata", {}).get("labels") or {}).get("app.kubernetes.io/managed-by") == "orchestrator"]
            assert not ours, (kind, [o["metadata"]["name"] for o in ours])
        assert not cluster.live_processes()
        assert not refusals(cluster), refusals(cluster)
        audit = cluster._call(lambda: list(cluster.apiserver.audit))
        creates = sum(1 for user, verb, what, ns, allowed in audit if user == identity and verb == "create"
                      and what == "deployments")
        # Every measured run's Deployments and those of two lead-ins (A's in block 0, B's in block 1).
        from orchestrator.backends.base import RunKey
        from orchestrator.backends.kubernetes.render import render_arm
        from orchestrator.plan import load_plan_file

        loaded = load_plan_file(plan)
        per_arm = {arm: sum(1 for o in render_arm(loaded, arm, RunKey(loaded.name, arm, 0)) if o["kind"] == "Deployment")
                   for arm in "AB"}
        assert creates == sum(per_arm[run.arm] for run in runs) + per_arm["A"] + per_arm["B"], (creates, per_arm)
