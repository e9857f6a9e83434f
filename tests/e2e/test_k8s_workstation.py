"""Issue 29: `orch run --backend kubernetes` from a workstation, as a user runs it, on the
emulated cluster: outside the cluster (no KUBERNETES_SERVICE_HOST), as a user who holds only
the documented workstation Role (manifests/workstation-rbac.yaml) in the namespace the arms run
in. Each run's load points are sent by a load-generator pod next to the router (`orch loadgen
agent`, the orchestrator's image, run by the emulated kubelet as this checkout's `orch`); the
workstation keeps control over port-forwards. Measured traffic reaches the router through its
Service (the emulated kube-proxy counts it), never through a port-forward of the router.

Real time with the plan's default guard bounds: which runs are valid depends on the machine's
load, so only what load cannot change is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.backends.base import Fingerprint
from orchestrator.store import Store
from tests.support.kcluster import EmulatedCluster, cpu_node, gpu_node, loopback_ok

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "tests" / "e2e" / "plans" / "k8s-quickstart.yaml"
USER = "you@example.com"
NAMESPACE = "llm-bench"

pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(not loopback_ok("127.77.0.0/16"), reason="loopback range does not bind")]


def orch(env: dict[str, str], *args: str, timeout: float = 800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=timeout)


def workstation_rbac(user: str) -> list[dict]:
    """manifests/workstation-rbac.yaml with the user named in its subjects, as its header says."""
    text = (ROOT / "manifests" / "workstation-rbac.yaml").read_text().replace("you@example.com", user)
    return [d for d in yaml.safe_load_all(text) if d]


def _streams(cluster: EmulatedCluster, role: str) -> int:
    """Port-forward streams opened to pods of ``role`` (each TCP connection is one)."""
    return sum(1 for _, path in cluster.request_log("GET", "/portforward") if f"-{role}-" in path)


def test_a_workstation_run_sends_its_load_from_the_cluster_under_the_workstation_role(tmp_path: Path) -> None:
    plan_doc = yaml.safe_load(PLAN.read_text())
    plan_doc["name"] = "k8s-workstation"
    plan_doc["kubernetes"].pop("access")  # auto: outside the cluster
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(plan_doc))
    nodes = [gpu_node("h200-a", pool="h200-pool"), gpu_node("h200-b", pool="h200-pool"), cpu_node()]
    # cluster_network: a Service's cluster IP answers the pods' processes only, as on a real
    # cluster, where it does not route from a workstation.
    with EmulatedCluster(nodes=nodes, cluster_network=True) as cluster:
        cluster.apply_objects(workstation_rbac(USER), namespace=NAMESPACE)
        kubeconfig = cluster.kubeconfig_for(USER, namespace=NAMESPACE)
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        env.update({"KUBECONFIG": kubeconfig, "ORCH_K8S_NAMESPACE": NAMESPACE, "ORCH_SKIP_CALIBRATION": "1",
                    "ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}",
                    "ORCH_STATE_DIR": str(tmp_path / "state"), "ORCH_K8S_POLL_S": "0.2"})
        relayed_before = cluster.proxy.relayed
        r = orch(env, "run", str(plan_file), "--backend", "kubernetes", "--json", "--allow-low-power")
        assert r.returncode == 0, r.stderr[-4000:]
        doc = json.loads(r.stdout)
        (verdict,) = doc["verdicts"]
        assert verdict["verdict"] in ("ACCEPT", "REJECT", "INCONCLUSIVE")

        store = Store.open(env["ORCH_DATABASE_URL"])
        try:
            runs = store.runs(doc["experiment"]["id"])
            assert {(r.block, r.arm) for r in runs} == {(b, a) for b in range(2) for a in "AB"}
            points = requests = 0
            for run in runs:
                assert run.status in ("done", "failed"), run
                fp = Fingerprint.from_dict(run.fingerprint)
                path = fp.details["access_path"]
                # The load's path is the router's Service, seen from the generator's pod.
                assert path["mode"] == "in-cluster load generator", path
                assert path["url"].startswith("http://127.96.") and path["samples"] > 0, path
                for _, p in store.points(run.id).iterrows():
                    n = len(store.requests(int(p.id)))
                    assert n == int(p.n_scheduled)  # every scheduled request came back as a record
                    points, requests = points + 1, requests + n
            assert points >= len(runs) and requests > 0
        finally:
            store.close()

        # Measured traffic went pod to Service: the kube-proxy relayed connections for the
        # points (from the generator pods: it refuses any other process, and refused none); the
        # router's own port-forward carried only control (readiness), while each point opened
        # one stream to its generator.
        assert cluster.proxy.relayed - relayed_before >= points
        assert cluster.proxy.refused_outside == 0
        assert _streams(cluster, "loadgen") >= points
        # (a generator sending through the router's port-forward opens a stream per connection:
        # up to 32 warm ones per point; readiness takes one or two a run)
        assert _streams(cluster, "router") <= 8 * len(runs), _streams(cluster, "router")

        # Under the workstation Role nothing the backend asked was refused.
        refused = [a for a in cluster.apiserver.audit if a[0] == USER and not a[4]]
        assert not refused, refused

        # Nothing of the run is left: no object of ours, no process.
        for kind in ("Deployment", "Pod", "Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding"):
            ours = [o for o in cluster.objects(kind).values()
                    if (o.get("metadata", {}).get("labels") or {}).get("app.kubernetes.io/managed-by") == "orchestrator"]
            assert not ours, (kind, [o["metadata"]["name"] for o in ours])
        cluster.wait_for(lambda: not cluster.live_processes(), 30, what="every process stopped")


def test_a_services_cluster_ip_answers_pods_only_on_a_strict_emulated_cluster() -> None:
    """The strictness the test above relies on: from this process (a workstation) a Service's
    cluster IP accepts the connection and closes it unanswered; from a pod's process (a load
    generator measuring its path to its own Service) it relays."""
    import httpx

    with EmulatedCluster(nodes=[cpu_node()], cluster_network=True) as cluster:
        api = cluster.kube_api()
        cluster.add_namespace("t")
        labels = {"app": "agent"}
        api.apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "agent", "namespace": "t"},
                   "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
                       "containers": [{"name": "agent", "image": "orchestrator:0.1.0",
                                       "command": ["orch", "loadgen", "agent", "--host", "0.0.0.0", "--port", "8000"],
                                       "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}}}]}}}})
        api.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "agent", "namespace": "t"},
                   "spec": {"selector": labels, "ports": [{"port": 8000, "targetPort": 8000}]}})

        def ready_pod() -> dict | None:
            return next((p for p in cluster.pods("t") if (p.get("status") or {}).get("podIP")
                         and all(c.get("ready") for c in p["status"].get("containerStatuses") or [])), None)

        pod = cluster.wait_for(ready_pod, 60, what="agent ready")
        ip = cluster.wait_for(lambda: (cluster.objects("Service", "t").get("agent") or {}).get("spec", {})
                              .get("clusterIP"), 20, what="cluster IP")
        service = f"http://{ip}:8000"
        cluster.wait_for(lambda: cluster.proxy.relays, 20, what="kube-proxy listening")
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{service}/health", timeout=5)
        assert cluster.proxy.refused_outside >= 1 and cluster.proxy.relayed == 0
        # From the pod: its own path to its Service is measured through the kube-proxy.
        path = httpx.get(f"http://{pod['status']['podIP']}:8000/v1/path", params={"url": service, "samples": 3},
                         timeout=60).json()
        assert path["samples"] == 3 and cluster.proxy.relayed >= 1, (path, cluster.proxy.relayed)  # keep-alive: one
