"""The Kubernetes backend against kmock (a Kubernetes API emulator over real HTTP on loopback),
driven through the official `kubernetes` client; nothing in the client is patched.

No API server can run here, so kmock stands in for it; what kmock leaves out of a real server
is added in ``Cluster`` below, each marked: server-side apply creating missing objects, uids,
label selectors on lists, a pod proxy answering /metrics, and one-shot faults. The kubelet and
scheduler are played by the test, which writes pod and node status as they would.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import aiohttp.web
import attrs
import kmock
import pytest
from kubernetes import client

from orchestrator.backends.base import Backend, RunKey
from orchestrator.backends.kubernetes import naming
from orchestrator.backends.kubernetes.api import KubeApi
from orchestrator.backends.kubernetes.backend import KubernetesBackend
from orchestrator.errors import PermanentError, TransientError
from orchestrator.plan import Plan, load_plan_file

PLAN = "examples/disagg-vs-colocated-h200.yaml"
H200 = {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/cuda.driver-version.full": "570.133.20",
        "karpenter.sh/nodepool": "h200-pool"}


def _matches(labels: dict[str, str], selector: str) -> bool:
    """Equality (a=b) and set (a in (x,y)) selectors, as the API server reads them."""
    for term in filter(None, [t.strip() for t in _split(selector)]):
        if " in (" in term:
            key, values = term.split(" in (", 1)
            if labels.get(key.strip()) not in {v.strip() for v in values.rstrip(")").split(",")}:
                return False
        else:
            key, value = term.split("=", 1)
            if labels.get(key) != value:
                return False
    return True


def _split(selector: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [*out, cur]


@attrs.define(kw_only=True)
class Cluster(kmock.KubernetesEmulator):
    """kmock plus the parts of a real API server the backend relies on."""

    faults: list[tuple[str, str, int]] = attrs.field(factory=list)  # (method, path part, status)
    metrics: str = "vllm:num_requests_running 0\n"
    namespaces: dict[str, dict[str, Any]] = attrs.field(factory=dict)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        for i, (method, part, status) in enumerate(self.faults):
            if request.method.value == method and part in request.url.path:
                del self.faults[i]  # one shot
                raise kmock.KubernetesError(status=status, reason="Injected", message=f"injected {status}")
        parts = request.url.path.strip("/").split("/")
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 4:
            return self._namespace(request, parts[3])  # kmock reads this path as a namespace scope
        if request.subresource and request.subresource.startswith("proxy"):
            return aiohttp.web.Response(text=self.metrics)  # the pod proxy reaching /metrics
        if isinstance(request.data, dict) and request.action in (kmock.action.CREATE, kmock.action.UPDATE):
            key = (request.resource, request.namespace, request.name)
            is_apply = "apply-patch" in request.headers.get("Content-Type", "")
            if request.action == kmock.action.CREATE or (is_apply and (key not in self.objects or self.objects[key].deleted)):
                # a real server gives every new object a uid; server-side apply creates
                request.data.setdefault("metadata", {})["uid"] = str(uuid.uuid4())
                if request.action == kmock.action.UPDATE:
                    self.objects[key] = request.data
        return await super()._handle(request)

    def _namespace(self, request: kmock.Request, name: str) -> aiohttp.web.StreamResponse:
        if request.method.value == "PATCH":
            self.namespaces[name] = {**request.data, "metadata": {**request.data["metadata"], "uid": str(uuid.uuid4())}}
        if name not in self.namespaces:
            raise kmock.KubernetesError(status=404, reason="NotFound", message=f"namespaces {name!r} not found")
        return aiohttp.web.json_response(self.namespaces[name])

    async def _serve_list(self, request: kmock.Request) -> Any:
        out = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            out["items"] = [o for o in out["items"] if _matches(o.get("metadata", {}).get("labels") or {}, selector)]
        return out


class RunningCluster:
    """The emulator served on 127.0.0.1 from a thread with its own event loop."""

    def __enter__(self) -> RunningCluster:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        async def serve() -> None:
            async with Cluster() as k8s, kmock.Server(k8s) as server:
                self.k8s, self.url = k8s, str(server.url).rstrip("/")
                self.stop = asyncio.Event()
                started.set()
                await self.stop.wait()

        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(serve(),), daemon=True)
        self.thread.start()
        assert started.wait(10), "kmock did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(10)
        self.loop.close()

    def api(self, retries: int = 3) -> KubeApi:
        cfg = client.Configuration()
        cfg.host = self.url
        return KubeApi(client.ApiClient(cfg), retries=retries, backoff_s=0.01, max_backoff_s=0.02)

    def objects(self, plural: str) -> dict[str, dict[str, Any]]:
        return {name: obj.raw for (res, _ns, name), obj in list(self.k8s.objects.items())
                if res.plural == plural and not obj.deleted}

    def requests(self, method: str, part: str) -> int:
        return len(self.matching(method, part))

    def matching(self, method: str, part: str) -> list[kmock.Request]:
        return [r for r in list(self.k8s) if r.method.value == method and part in r.url.path]

    # -- the scheduler and kubelet's part --

    def add_node(self, name: str, labels: dict[str, str]) -> None:
        self.k8s.objects["v1/nodes", None, name] = {"metadata": {"name": name, "labels": labels}}

    def start_pods(self, ns: str, status: dict[str, Any] | None = None, node: str = "gpu-1") -> list[str]:
        """One pod per replica of every Deployment, with ``status`` (default: running, ready)."""
        names = []
        for dep in self.objects("deployments").values():
            tpl = dep["spec"]["template"]
            for i in range(dep["spec"]["replicas"]):
                name = f"{dep['metadata']['name']}-{i}"
                image = tpl["spec"]["containers"][0]["image"]
                st = status or {
                    "phase": "Running", "podIP": f"10.0.0.{len(names) + 1}",
                    "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                    "containerStatuses": [{"name": "c", "image": image, "ready": True, "restartCount": 0,
                                           "imageID": f"docker.io/{image}@sha256:{'ab' * 32}"}],
                }
                self.k8s.objects["v1/pods", ns, name] = {
                    "metadata": {"name": name, "namespace": ns, "labels": tpl["metadata"]["labels"]},
                    "spec": {"nodeName": node} if st.get("phase") == "Running" else {},
                    "status": st,
                }
                names.append(name)
        return names


class FakeRouter(BaseHTTPRequestHandler):
    """The router's two answers the readiness probe needs, over real HTTP."""

    def do_GET(self) -> None:
        self._send(200, {"status": "ok"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._send(200, {"choices": [{"text": " a" * body["max_tokens"]}],
                         "usage": {"completion_tokens": body["max_tokens"]}})

    def _send(self, code: int, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def cluster() -> Iterator[RunningCluster]:
    with RunningCluster() as c:
        yield c


@pytest.fixture
def router_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeRouter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def plan() -> Plan:
    return load_plan_file(PLAN)


def _backend(cluster: RunningCluster, url: str = "http://unused", retries: int = 3) -> KubernetesBackend:
    return KubernetesBackend(api=cluster.api(retries), endpoint_url=url, poll_s=0.05)


def test_deploy_ready_fingerprint_scrape_teardown(cluster: RunningCluster, router_url: str, plan: Plan) -> None:
    backend = _backend(cluster, router_url)
    assert isinstance(backend, Backend)
    key = RunKey(plan.name, "B", 0)
    dep = backend.deploy(plan, "B", key)
    ns = dep.handles.namespace
    assert ns == "orch-disagg-vs-colocated-h200"
    assert ns in cluster.k8s.namespaces
    deployments = cluster.objects("deployments")
    assert set(deployments) == {naming.object_name(key, r) for r in ("prefill", "decode", "router")}
    owner = cluster.objects("configmaps")[naming.run_name(key)]
    assert owner["metadata"]["annotations"]["orchestrator/plan-sha256"]
    for d in deployments.values():
        assert d["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
        assert d["metadata"]["labels"]["orchestrator/run"] == naming.run_name(key)
    applies = cluster.matching("PATCH", "/deployments/")
    assert len(applies) == 3
    assert all(r.headers["Content-Type"] == "application/apply-patch+yaml" for r in applies)
    assert all(r.params == {"fieldManager": "orchestrator", "force": "true"} for r in applies)

    cluster.add_node("gpu-1", H200)
    cluster.start_pods(ns)
    backend.ready(dep, deadline_s=10)
    fp = dep.fingerprint
    assert fp.nodes == ("gpu-1",) and fp.gpu_products == ("NVIDIA-H200",)
    assert fp.driver_versions == ("570.133.20",) and fp.node_pools == ("karpenter.sh/nodepool=h200-pool",)
    assert fp.image_digests() == ("sha256:" + "ab" * 32,)
    assert fp.engine_version == plan.arm("A").engine.version and fp.gpu_type == "H200"
    assert dep.endpoint.url == router_url and len(dep.endpoint.metrics_urls) == 4

    scraped = backend.scrape(dep)
    assert len(scraped) == 5 and all(t.startswith("vllm:num_requests_running") for t in scraped.values())
    assert any(u.endswith(":29000/metrics") for u in scraped), "the router's metrics too"

    backend.teardown(dep)
    for plural in ("deployments", "services", "configmaps", "roles", "rolebindings", "serviceaccounts"):
        assert cluster.objects(plural) == {}, plural
    backend.teardown(dep)  # idempotent: everything is already gone


def test_pending_pod_reports_insufficient_gpus_at_the_deadline(cluster: RunningCluster, plan: Plan) -> None:
    backend = _backend(cluster)
    dep = backend.deploy(plan, "A", RunKey(plan.name, "A", 0))
    cluster.add_node("gpu-1", H200)
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    names = cluster.start_pods(dep.handles.namespace, status={
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}],
    })
    cluster.k8s.objects["v1/events", dep.handles.namespace, "ev1"] = {
        "metadata": {"name": "ev1"}, "type": "Warning", "reason": "FailedScheduling",
        "message": message, "involvedObject": {"kind": "Pod", "name": names[0]},
    }
    with pytest.raises(TransientError) as err:
        backend.ready(dep, deadline_s=0.3)
    text = str(err.value)
    assert "0/5 pods ready" in text and "Unschedulable: " + message in text
    assert f"events: {names[0]}: FailedScheduling" in text


def test_no_node_with_the_gpu_type_is_permanent_and_names_the_labels(cluster: RunningCluster, plan: Plan) -> None:
    backend = _backend(cluster)
    dep = backend.deploy(plan, "A", RunKey(plan.name, "A", 0))
    cluster.add_node("h100-1", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    cluster.start_pods(dep.handles.namespace, status={"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."}]})
    with pytest.raises(PermanentError) as err:
        backend.ready(dep, deadline_s=30)
    assert "no node has nvidia.com/gpu.product in ['NVIDIA-H200', 'NVIDIA-H200-141GB-HBM3e']" in str(err.value)


def test_crash_looping_pod_is_permanent_with_its_last_exit(cluster: RunningCluster, plan: Plan) -> None:
    backend = _backend(cluster)
    dep = backend.deploy(plan, "A", RunKey(plan.name, "A", 0))
    cluster.start_pods(dep.handles.namespace, status={
        "phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": "vllm", "restartCount": 4,
                               "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                               "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}],
    })
    with pytest.raises(PermanentError) as err:
        backend.ready(dep, deadline_s=30)
    assert "CrashLoopBackOff: back-off 40s (restarts 4, last exit 1 Error)" in str(err.value)


def test_409_on_apply_and_500_on_list_are_retried(cluster: RunningCluster, router_url: str, plan: Plan) -> None:
    cluster.k8s.faults += [("PATCH", "/deployments/", 409), ("GET", "/pods", 500)]
    backend = _backend(cluster, router_url)
    dep = backend.deploy(plan, "A", RunKey(plan.name, "A", 0))
    assert cluster.requests("PATCH", "/deployments/") == 3, "worker: 409 then applied; router: applied"
    assert len(cluster.objects("deployments")) == 2
    cluster.add_node("gpu-1", H200)
    cluster.start_pods(dep.handles.namespace)
    backend.ready(dep, deadline_s=10)
    assert not cluster.k8s.faults, "both faults were hit"


def test_persistent_5xx_becomes_a_transient_error_after_the_retries(cluster: RunningCluster, plan: Plan) -> None:
    cluster.k8s.faults += [("PATCH", "/configmaps/", 503)] * 3
    with pytest.raises(TransientError) as err:
        _backend(cluster, retries=2).deploy(plan, "A", RunKey(plan.name, "A", 0))
    assert "failed after 3 tries: HTTP 503" in str(err.value)


def test_403_is_permanent_names_the_rbac_verb_and_is_not_retried(cluster: RunningCluster, plan: Plan) -> None:
    cluster.k8s.faults.append(("PATCH", "/deployments/", 403))
    with pytest.raises(PermanentError) as err:
        _backend(cluster).deploy(plan, "A", RunKey(plan.name, "A", 0))
    assert "lacks the RBAC verb `patch` on `deployments`" in str(err.value)
    assert cluster.requests("PATCH", "/deployments/") == 1


def test_cleanup_removes_leftovers_of_crashed_attempts_by_label(cluster: RunningCluster, plan: Plan) -> None:
    first = _backend(cluster)
    first.deploy(plan, "A", RunKey(plan.name, "A", 0))
    first.deploy(plan, "B", RunKey(plan.name, "B", 0, attempt=1))
    other = load_plan_file(PLAN).model_copy(update={"name": "other-exp"})
    first.deploy(other, "A", RunKey("other-exp", "A", 0))
    # A new controller process (the old one crashed): it knows nothing but the experiment.
    fresh = _backend(cluster)
    removed = fresh.cleanup(plan.name)
    # A: owner, 3 router RBAC, worker Deployment + Service, router Deployment + Service = 8;
    # B: owner, 3 RBAC, 2 pools x (Deployment + Service), router Deployment + Service = 10.
    assert removed == 18
    left = [o for p in ("deployments", "configmaps", "services") for o in cluster.objects(p).values()]
    assert left and all(o["metadata"]["labels"]["orchestrator/experiment"] == "other-exp" for o in left)
    assert fresh.cleanup(plan.name) == 0


def test_a_data_file_replayed_as_sessions_is_refused_before_a_load_generator_pod(
        cluster: RunningCluster, plan: Plan, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32: the in-cluster load generator plays sessions from the plan, but a data file is
    on this machine only: refused before anything is applied, with where to run it instead."""
    from orchestrator.errors import UserError
    from orchestrator.plan import Workload

    monkeypatch.chdir(tmp_path)
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "and then"}]}) + "\n")
    sessions = plan.model_copy(update={"workload": Workload.model_validate(
        {"sessions": {}, "source": {"kind": "prompts", "path": "chat.jsonl"}})})
    backend = KubernetesBackend(api=cluster.api(3), endpoint_url=None, poll_s=0.05)
    with pytest.raises(UserError, match=r"^workload\.source: a data file replayed as sessions"):
        backend.deploy(sessions, "A", RunKey(plan.name, "A", 0))
    assert cluster.objects("deployments") == {} and cluster.objects("configmaps") == {}
