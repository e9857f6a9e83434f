"""The backend conformance suite (tests/integration/backend_suite.py) applied to the sim, external
and kubernetes backends. The local backend's binding is in the vllm tier
(tests/vllm/test_backend_suite_local.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchestrator.backends.base import Backend, Deployment, RunKey
from orchestrator.backends.external import ExternalBackend
from orchestrator.backends.kubernetes import naming
from orchestrator.backends.kubernetes.backend import KubernetesBackend
from orchestrator.backends.kubernetes.render import HTTP_PORT
from orchestrator.backends.sim import SimBackend
from orchestrator.plan import Plan, validate_plan
from tests.e2e.helpers import small_plan
from tests.integration.backend_suite import (
    BackendCase,
    BackendSuite,
    kill_first_process,
    process_leftovers,
)
from tests.support.fault_server import FaultServer, external_plan, start_fault_server
from tests.support.kcluster import EmulatedCluster, cluster_fixture

pytestmark = pytest.mark.timeout(180)


# -- sim ------------------------------------------------------------------------------------

class TestSimBackend(BackendSuite):
    @pytest.fixture(scope="class")
    def case(self, tmp_path_factory: pytest.TempPathFactory) -> BackendCase:
        state = tmp_path_factory.mktemp("sim-suite")
        plan = small_plan(name="suite-sim")

        @contextmanager
        def wrong_count() -> Iterator[tuple[Backend, Plan, RunKey]]:
            key = RunKey("suite-sim-fault", "A", 0)
            yield SimBackend(state, faults={("A", 0, 0): ["--fault-ignore-max-tokens"]}), plan, key

        return BackendCase(
            name="sim", make=lambda: SimBackend(state), plan=plan, arm="A", experiment="suite-sim",
            runs_servers=True, kill=kill_first_process, leftovers=process_leftovers,
            wrong_count=wrong_count,
        )


# -- external -------------------------------------------------------------------------------

class TestExternalBackend(BackendSuite):
    @pytest.fixture(scope="class")
    def server(self) -> Iterator[FaultServer]:
        s = start_fault_server(version="0.32.0-fault")
        try:
            yield s
        finally:
            s.stop()

    @pytest.fixture(scope="class")
    def case(self, server: FaultServer) -> BackendCase:
        @contextmanager
        def wrong_count() -> Iterator[tuple[Backend, Plan, RunKey]]:
            with start_fault_server(ignore_max_tokens=True, fault_everything=True) as bad:
                plan = validate_plan(external_plan(bad.url, bad.url))
                yield ExternalBackend(env={}), plan, RunKey("ext-fault", "A", 0)

        return BackendCase(
            name="external", make=lambda: ExternalBackend(env={}),
            plan=validate_plan(external_plan(server.url, server.url)), arm="A", experiment="suite-ext",
            runs_servers=False,
            kill=lambda dep: server.stop(),  # the stack the arm points at goes away
            leftovers=lambda dep: [],  # nothing is ever started, so nothing can be left
            wrong_count=wrong_count,
            # Still loading (vLLM lists its model only once loaded): /v1/models lacks the model.
            unready_plan=validate_plan(external_plan(server.url, server.url, model="still-loading")),
        )


# -- kubernetes -----------------------------------------------------------------------------
# On the emulated cluster (orchestrator/kcluster/): kmock as the API server, plus a scheduler,
# controllers, a kubelet that starts `orch sim serve` for each vLLM container and the real
# vllm-router for the router, and kube-proxy on loopback clusterIPs. The backend reaches the
# router through its Service's clusterIP, reserved before the deploy (ORCH_K8S_ENDPOINT's path).

NS = "orch-suite"
kcluster = cluster_fixture(name="kcluster", scope="module")


def k8s_plan() -> Plan:
    return small_plan(name="suite-k8s", backend="kubernetes", arms={
        "A": {"gpu": "H200", "layout": "colocated", "replicas": 1,
              "engine": {"max_num_seqs": 32, "max_num_batched_tokens": 2048}},
        "B": {"gpu": "H200", "layout": "colocated", "replicas": 1,
              "engine": {"max_num_seqs": 32, "max_num_batched_tokens": 2048}},
    })


class WrongCountRouter(BaseHTTPRequestHandler):
    """A router that is healthy and answers every completion with 3 tokens too many."""

    def do_GET(self) -> None:
        self._send({"status": "ok"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = int(body["max_tokens"]) + 3
        self._send({"choices": [{"text": " a" * n, "finish_reason": "length"}], "usage": {"completion_tokens": n}})

    def _send(self, doc: dict) -> None:
        data = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def wrong_count_router() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), WrongCountRouter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def k8s_leftovers(cluster: EmulatedCluster, dep: Deployment) -> list[str]:
    """Objects labelled with the run, and processes of its pods still running."""
    run = dep.handles.run
    left = [f"{kind} {name}" for kind in ("Deployment", "ReplicaSet", "Pod", "Service", "ConfigMap", "Role",
                                          "RoleBinding", "ServiceAccount")
            for name, obj in cluster.objects(kind, NS).items()
            if ((obj.get("metadata") or {}).get("labels") or {}).get(naming.RUN_LABEL) == run]
    left += [f"process {p['pid']} of pod {p['pod']}" for p in cluster.live_processes()
             if p["namespace"] == NS and p["pod"].startswith(run)]
    return left


def k8s_kill(cluster: EmulatedCluster, dep: Deployment) -> None:
    """SIGKILL the worker container of the run (the kubelet restarts it: restartCount + 1)."""
    pods = cluster.pods(NS, dep.handles.run_selector)
    worker = next(p for p in pods if p["metadata"]["labels"].get("orchestrator/role") != "router")
    cluster.kill_pod(worker["metadata"]["name"], NS)


class TestKubernetesBackend(BackendSuite):
    @pytest.fixture(scope="class")
    def case(self, kcluster: EmulatedCluster) -> BackendCase:
        plan = k8s_plan()
        kcluster.add_namespace(NS)  # the chart's own namespace (ORCH_K8S_NAMESPACE)
        live_key = RunKey("suite-k8s", "A", 0)
        router_ip = kcluster.reserve_cluster_ip(NS, naming.object_name(live_key, "router"))

        def make(url: str = f"http://{router_ip}:{HTTP_PORT}") -> KubernetesBackend:
            return KubernetesBackend(api=kcluster.kube_api(), namespace=NS, endpoint_url=url, poll_s=0.1)

        @contextmanager
        def wrong_count() -> Iterator[tuple[Backend, Plan, RunKey]]:
            # The pods come up and turn Ready; what answers at the arm's endpoint miscounts.
            with wrong_count_router() as url:
                yield make(url), plan, RunKey("suite-k8s-fault", "A", 0)

        return BackendCase(
            name="kubernetes", make=make, plan=plan, arm="A", experiment="suite-k8s", runs_servers=True,
            kill=lambda dep: k8s_kill(kcluster, dep), leftovers=lambda dep: k8s_leftovers(kcluster, dep),
            wrong_count=wrong_count, short_deadline_s=0.2, settle_s=30.0,
        )


def test_every_backend_the_executor_can_build_is_bound_here_or_in_the_vllm_tier() -> None:
    """A new backend needs a binding of the suite (the virtual backend, which speaks no HTTP,
    has the contract's other meanings in test_backend_virtual.py)."""
    from orchestrator.control.session import BACKENDS

    bound = {"sim", "external", "kubernetes"}
    virtual = Path(__file__).with_name("test_backend_virtual.py")
    assert virtual.exists() and "VirtualBackend" in virtual.read_text()
    bound |= {"virtual"}
    local = Path(__file__).resolve().parents[1] / "vllm" / "test_backend_suite_local.py"
    assert local.exists() and "BackendSuite" in local.read_text()
    assert set(BACKENDS) == bound | {"local"}
