"""The emulated Kubernetes cluster (orchestrator/kcluster/) under today's KubernetesBackend.

The backend's real code path runs against it: the official client over HTTP to the emulated
API server, pods scheduled on labelled GPU nodes, simulated vLLM engines and the real
vllm-router started as processes on loopback pod IPs, the router discovering its workers by
watching the API server, a completion streamed through the router Service's clusterIP, metrics
through the pod proxy. Then each injected failure shows up as the objects and events a real
cluster would give. Every test ends with no process of the cluster left (the fixture checks).
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import re
import threading
import time
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client, watch

from orchestrator.backends.base import Deployment, RunKey
from orchestrator.backends.kubernetes import naming
from orchestrator.backends.kubernetes.backend import KubeHandles, KubernetesBackend
from orchestrator.errors import PermanentError, TransientError
from orchestrator.plan import Plan, validate_plan
from tests.support.kcluster import (
    GKE_GPU_TAINT,
    EmulatedCluster,
    cluster_fixture,
    cpu_node,
    gpu_node,
    loopback_ok,
)

PLAN = "examples/quickstart.yaml"
H100 = "NVIDIA-H100-80GB-HBM3"

pytestmark = pytest.mark.skipif(not loopback_ok("127.77.0.0/16"), reason="loopback range does not bind")

kcluster = cluster_fixture()


def _plan(engine: dict[str, Any] | None = None, **kubernetes: Any) -> Plan:
    """The quickstart plan on ``backend: kubernetes``, the router reached through its Service's
    cluster IP (``access: service``); ``engine`` changes both arms', ``kubernetes`` the settings."""
    with open(PLAN) as f:
        data = yaml.safe_load(f)
    for arm in data["arms"].values():
        arm["engine"] = {**arm.get("engine", {}), **(engine or {})}
    data["backend"] = "kubernetes"
    data["kubernetes"] = {"access": "service", **kubernetes}
    return validate_plan(data)


def _deploy(cluster: EmulatedCluster, plan: Plan, arm: str, fixed_url: bool = False,
            retries: int = 3) -> tuple[KubernetesBackend, Deployment, str]:
    """The backend built by hand and the arm deployed. The backend reads the router Service's
    cluster IP itself; ``fixed_url``: it is given the URL instead (ORCH_K8S_ENDPOINT's way),
    the address reserved before the Service exists."""
    key = RunKey(plan.name, arm, 0)
    ns = plan.kubernetes.namespace or naming.experiment_namespace(plan.name)
    url = None
    if fixed_url:
        url = f"http://{cluster.reserve_cluster_ip(ns, naming.object_name(key, 'router'))}:8000"
    backend = KubernetesBackend(api=cluster.kube_api(retries=retries), endpoint_url=url, poll_s=0.1,
                                log=lambda line: None)
    return backend, backend.deploy(plan, arm, key), ns


def _stream(url: str, model: str, max_tokens: int) -> tuple[int, int]:
    """A streamed completion: (content chunks received, completion tokens in ``usage``)."""
    chunks, usage = 0, None
    body = {"model": model, "prompt": "hello " * 50, "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.Client(timeout=30) as http, http.stream("POST", f"{url}/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            doc = json.loads(line[6:])
            if doc.get("usage"):
                usage = doc["usage"]["completion_tokens"]
            if any(c.get("text") for c in doc.get("choices") or []):
                chunks += 1
    assert usage is not None, "no usage in the stream"
    return chunks, usage


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_),
                {"type": type_, "status": "Unknown"})


def _teardown_and_check(cluster: EmulatedCluster, backend: KubernetesBackend, dep: Deployment, ns: str) -> None:
    backend.teardown(dep)
    cluster.wait_for(lambda: not cluster.pods(ns), 20, what="pods gone")
    for kind in ("Deployment", "ReplicaSet", "Service", "ConfigMap", "Role", "RoleBinding", "ServiceAccount"):
        left = [n for n, o in cluster.objects(kind, ns).items() if n != "kube-root-ca.crt"]
        assert left == [], kind
    cluster.wait_for(lambda: not cluster.live_processes(), 10, what="processes stopped")


# -- whole arms --------------------------------------------------------------------------------


def test_disaggregated_arm_runs_end_to_end(kcluster: EmulatedCluster) -> None:
    plan = _plan()
    backend, dep, ns = _deploy(kcluster, plan, "B")
    backend.ready(dep, deadline_s=45)

    pods = {p["metadata"]["labels"]["orchestrator/role"]: p for p in kcluster.pods(ns)}
    assert set(pods) == {"prefill", "decode", "router"}
    for role, pod in pods.items():
        name = pod["metadata"]["name"]
        deployment = naming.object_name(dep.key, role)
        assert re.fullmatch(rf"{deployment}-[a-z0-9]{{10}}-[a-z0-9]{{5}}", name), name
        owner = pod["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "ReplicaSet" and owner["controller"] is True
        rs = kcluster.get("ReplicaSet", owner["name"], ns)
        assert rs["metadata"]["ownerReferences"][0]["name"] == deployment
        cs = pod["status"]["containerStatuses"][0]
        assert cs["ready"] and cs["restartCount"] == 0 and "running" in cs["state"]
        assert cs["imageID"].startswith("docker-pullable://vllm/") and "@sha256:" in cs["imageID"]
        assert pod["status"]["podIP"].startswith("127.77.")
    assert pods["prefill"]["spec"]["nodeName"].startswith("h200-")
    assert pods["decode"]["spec"]["nodeName"].startswith("h200-")
    # The router needs no GPU; it tolerates the plan's taints (a cluster of tainted GPU nodes
    # only must still place it), so it may land on any node.
    router = pods["router"]
    assert router["spec"]["nodeName"]
    assert all("nvidia.com/gpu" not in (c.get("resources") or {}).get("limits", {})
               for c in router["spec"]["containers"])

    for role in ("prefill", "decode"):  # the simulated engine, configured from `vllm serve` args
        proc = kcluster.process(pods[role]["metadata"]["name"], ns)
        argv = proc["cmdline"]  # as the running process sees it
        assert argv[argv.index("--role") + 1] == role
        assert argv[argv.index("--tp") + 1] == "1"
        assert argv[argv.index("--max-num-seqs") + 1] == "64"
        assert argv[argv.index("--max-num-batched-tokens") + 1] == "2048"
        assert argv[argv.index("--gpu") + 1] == "H200"
        assert argv[argv.index("--host") + 1] == pods[role]["status"]["podIP"]
        assert proc["details"]["kv_transfer_config"] == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        assert "--no-prefix-caching" not in argv
    router = kcluster.process(pods["router"]["metadata"]["name"], ns)
    assert router["kind"] == "router" and "--service-discovery" in router["argv"]
    # The router found its workers itself: it listed and watched pods on the API server.
    assert any("watch=true" in q for _, q in kcluster.request_log("GET", f"/namespaces/{ns}/pods"))

    deployment = kcluster.get("Deployment", naming.object_name(dep.key, "prefill"), ns)
    assert deployment["status"]["readyReplicas"] == 1 and deployment["status"]["replicas"] == 1
    assert _condition(deployment, "Available")["status"] == "True"

    fp = dep.fingerprint
    assert fp.gpu_products == ("NVIDIA-H200",) and fp.driver_versions == ("570.133.20",)
    assert "karpenter.sh/nodepool=h200" in fp.node_pools
    assert any(i.startswith("docker-pullable://vllm/vllm-openai@sha256:") for i in fp.images)

    chunks, tokens = _stream(dep.endpoint.url, dep.endpoint.model, 24)
    assert tokens == 24 and chunks >= 1
    assert kcluster.proxy.relayed >= 2, "the probe and the stream went through the Service's clusterIP"

    scraped = backend.scrape(dep)
    assert len(scraped) == 3
    workers = [t for u, t in scraped.items() if u.endswith(":8000/metrics")]
    assert len(workers) == 2 and all("vllm:num_requests_running" in t for t in workers)
    assert sum(_metric(t, "vllm:generation_tokens_total") for t in workers) >= 24
    assert any(u.endswith(":29000/metrics") and "vllm_router" in t for u, t in scraped.items())

    _teardown_and_check(kcluster, backend, dep, ns)


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def test_colocated_arm_spreads_over_gpu_nodes_and_round_robins(kcluster: EmulatedCluster) -> None:
    plan = _plan(engine={"max_num_seqs": 32, "kv_cache_dtype": "fp8", "prefix_caching": False})
    backend, dep, ns = _deploy(kcluster, plan, "A", fixed_url=True)
    backend.ready(dep, deadline_s=45)
    workers = kcluster.pods(ns, "orchestrator/role=worker")
    assert len(workers) == 2
    assert {p["spec"]["nodeName"] for p in workers} == {"h200-1", "h200-2"}, "least allocated first"
    for p in workers:
        argv = kcluster.process(p["metadata"]["name"], ns)["argv"]
        assert argv[argv.index("--role") + 1] == "both"
        assert argv[argv.index("--max-num-seqs") + 1] == "32"
        assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8"
        assert "--no-prefix-caching" in argv
    for _ in range(4):
        assert _stream(dep.endpoint.url, dep.endpoint.model, 8)[1] == 8
    served = [_metric(t, "vllm:request_success_total") for u, t in backend.scrape(dep).items()
              if u.endswith(":8000/metrics")]
    assert len(served) == 2 and all(n >= 2 for n in served), f"round robin over both workers: {served}"
    assert backend.alive(dep)
    _teardown_and_check(kcluster, backend, dep, ns)


# -- scheduling failures ---------------------------------------------------------------------


def test_no_node_with_the_gpu_type_is_unschedulable_and_permanent() -> None:
    with EmulatedCluster(nodes=[gpu_node("h100-1", H100), gpu_node("h100-2", H100), cpu_node()]) as cluster:
        plan = _plan()
        backend, dep, ns = _deploy(cluster, plan, "A")
        message = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
        with pytest.raises(PermanentError) as err:
            backend.ready(dep, deadline_s=20)
        assert "no node has nvidia.com/gpu.product in ['NVIDIA-H200', 'NVIDIA-H200-141GB-HBM3e']" in str(err.value)
        worker = cluster.pods(ns, "orchestrator/role=worker")[0]
        cond = _condition(worker, "PodScheduled")
        assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Unschedulable", message)
        assert worker["status"]["phase"] == "Pending"
        events = cluster.events(ns, worker["metadata"]["name"], "FailedScheduling")
        assert events and events[0]["type"] == "Warning" and events[0]["message"] == message
        assert events[0]["source"]["component"] == "default-scheduler"
        backend.teardown(dep)
        cluster.wait_for(lambda: not cluster.pods(ns), 10, what="pods gone")
    assert not cluster.live_processes()


def test_busy_gpus_are_waited_for_and_reported_at_the_deadline() -> None:
    nodes = [gpu_node("h200-1", gpus=1), gpu_node("h200-2", gpus=1), cpu_node()]
    with EmulatedCluster(nodes=nodes) as cluster:
        cluster.taint_node("h200-2", "dedicated", "h200")
        backend, dep, ns = _deploy(cluster, _plan(), "A")
        cluster.wait_for(lambda: sum(_condition(p, "Ready")["status"] == "True" for p in cluster.pods(ns)
                                     if p["spec"].get("nodeName")) == 2, 30, what="the placed pods ready")
        with pytest.raises(TransientError) as err:
            backend.ready(dep, deadline_s=0.5)
        pending = [p for p in cluster.pods(ns, "orchestrator/role=worker") if not p["spec"].get("nodeName")]
        assert len(pending) == 1, "one worker fits the single free GPU"
        message = ("0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's "
                   "node affinity/selector, 1 node(s) had untolerated taint {dedicated: h200}.")
        assert _condition(pending[0], "PodScheduled")["message"] == message
        assert "2/3 pods ready after" in str(err.value) and "Unschedulable: " + message in str(err.value)
        assert f"{pending[0]['metadata']['name']}: FailedScheduling: {message}" in str(err.value)
        backend.teardown(dep)
        cluster.wait_for(lambda: not cluster.pods(ns), 10, what="pods gone")
    assert not cluster.live_processes()


def test_untolerated_taint_is_permanent_with_the_fix(kcluster: EmulatedCluster) -> None:
    for node in ("h200-1", "h200-2"):
        kcluster.taint_node(node, "dedicated", "h200")
    backend, dep, ns = _deploy(kcluster, _plan(), "A")
    with pytest.raises(PermanentError) as err:
        backend.ready(dep, deadline_s=20)
    message = ("0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
               "2 node(s) had untolerated taint {dedicated: h200}.")
    assert message in str(err.value) and "add it to kubernetes.tolerations" in str(err.value)
    worker = kcluster.pods(ns, "orchestrator/role=worker")[0]
    assert _condition(worker, "PodScheduled")["message"] == message
    _teardown_and_check(kcluster, backend, dep, ns)


def test_model_cache_claim_missing_then_present(kcluster: EmulatedCluster) -> None:
    ns = "llm-bench"
    kcluster.add_namespace(ns)
    plan = _plan(namespace=ns, model_cache_pvc="model-cache")
    core = client.CoreV1Api(kcluster.api_client())
    with pytest.raises(client.ApiException) as err:  # the GET of an absent claim is a real 404
        core.read_namespaced_persistent_volume_claim("model-cache", ns)
    assert err.value.status == 404
    assert json.loads(err.value.body)["message"] == 'persistentvolumeclaims "model-cache" not found'
    with pytest.raises(PermanentError) as perr:  # the backend checks before applying anything
        _deploy(kcluster, plan, "A")
    assert "PersistentVolumeClaim 'model-cache' does not exist" in str(perr.value)
    assert kcluster.objects("Deployment", ns) == {}

    # The scheduler's words for a pod whose claim is missing (a Deployment applied by hand).
    api = kcluster.kube_api()
    api.apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "needs-claim", "namespace": ns},
               "spec": {"selector": {"matchLabels": {"app": "c"}}, "template": {
                   "metadata": {"labels": {"app": "c"}},
                   "spec": {"containers": [{"name": "c", "image": "vllm/vllm-router:v0.1.17"}],
                            "volumes": [{"name": "m", "persistentVolumeClaim": {"claimName": "model-cache"}}]}}}})
    message = '0/3 nodes are available: persistentvolumeclaim "model-cache" not found.'
    ev = kcluster.wait_for(lambda: kcluster.events(ns, reason="FailedScheduling"), 10, what="FailedScheduling")
    assert ev[0]["message"] == message and ev[0]["type"] == "Warning"
    pod = kcluster.pods(ns, "app=c")[0]
    assert _condition(pod, "PodScheduled")["reason"] == "Unschedulable"
    api.delete("Deployment", "needs-claim", ns)

    kcluster.add_pvc(ns, "model-cache")
    backend, dep, ns = _deploy(kcluster, plan, "A")
    backend.ready(dep, deadline_s=45)
    for p in kcluster.pods(ns, "orchestrator/role=worker"):
        assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache"}} in p["spec"]["volumes"]
    _teardown_and_check(kcluster, backend, dep, ns)


def test_gke_gpu_taint_is_tolerated_and_a_bare_key_toleration_is_not() -> None:
    from orchestrator.kcluster.scheduler import tolerates
    from orchestrator.plan.kubernetes import Toleration

    nodes = [gpu_node("h200-1", taints=[GKE_GPU_TAINT]), gpu_node("h200-2", taints=[GKE_GPU_TAINT]), cpu_node()]
    with EmulatedCluster(nodes=nodes) as cluster:
        backend, dep, ns = _deploy(cluster, _plan(), "A")
        cluster.wait_for(lambda: all(p["spec"].get("nodeName") for p in cluster.pods(ns)), 5,
                         what="every pod scheduled")
        backend.teardown(dep)
        cluster.wait_for(lambda: not cluster.pods(ns), 10, what="pods gone")
    # Kubernetes reads a toleration without operator as Equal: it does not tolerate a valued taint.
    assert not tolerates([{"key": "nvidia.com/gpu", "effect": "NoSchedule"}], GKE_GPU_TAINT)
    assert tolerates([{"key": "nvidia.com/gpu", "operator": "Exists"}], GKE_GPU_TAINT)
    assert tolerates([{"operator": "Exists"}], GKE_GPU_TAINT)
    assert Toleration().operator == "Exists"


# -- injected failures -----------------------------------------------------------------------


def test_image_pull_back_off_is_waited_through(kcluster: EmulatedCluster) -> None:
    kcluster.fail_image_pull(times=3, image="vllm/vllm-router:v0.1.17")
    backend, dep, ns = _deploy(kcluster, _plan(), "A")
    backend.ready(dep, deadline_s=45)  # the kubelet retries the pull; the backend waits
    router = kcluster.pods(ns, "orchestrator/role=router")[0]
    failed = [e["message"] for e in kcluster.events(ns, router["metadata"]["name"], "Failed")]
    assert any(m.startswith('Failed to pull image "vllm/vllm-router:v0.1.17": ') for m in failed)
    assert {"Error: ErrImagePull", "Error: ImagePullBackOff"} <= set(failed)
    assert kcluster.events(ns, router["metadata"]["name"], "BackOff")[0]["message"] == \
        'Back-off pulling image "vllm/vllm-router:v0.1.17"'
    assert router["status"]["containerStatuses"][0]["restartCount"] == 0
    _teardown_and_check(kcluster, backend, dep, ns)


def test_an_image_that_never_comes_fails_at_the_deadline_and_a_bad_name_at_once(kcluster: EmulatedCluster) -> None:
    kcluster.fail_image_pull(times=1000, image="vllm/vllm-router:v0.1.17")
    backend, dep, ns = _deploy(kcluster, _plan(), "A")
    with pytest.raises(TransientError) as err:
        backend.ready(dep, deadline_s=1.5)
    assert 'Failed: Failed to pull image "vllm/vllm-router:v0.1.17"' in str(err.value)
    router = kcluster.pods(ns, "orchestrator/role=router")[0]
    waiting = router["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] in ("ErrImagePull", "ImagePullBackOff")
    _teardown_and_check(kcluster, backend, dep, ns)

    plan = _plan(image_repository="vllm/vLLM-openai")  # upper case: not a valid reference
    backend, dep, ns = _deploy(kcluster, plan, "A")
    with pytest.raises(PermanentError) as perr:
        backend.ready(dep, deadline_s=20)
    assert "InvalidImageName" in str(perr.value)
    assert 'couldn\'t parse image name "vllm/vLLM-openai:' in str(perr.value)
    _teardown_and_check(kcluster, backend, dep, ns)


@pytest.mark.parametrize("preset,expected", [
    ("pod-security", 'is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
                     '(container "vllm" must set securityContext.allowPrivilegeEscalation=false)'),
    ("quota", "is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1, "
              "used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8"),
])
def test_admission_refusal_creates_no_pods_and_marks_the_deployment(
        kcluster: EmulatedCluster, preset: str, expected: str) -> None:
    kcluster.reject_pods(preset, selector="orchestrator/role=worker")
    plan = _plan()
    backend, dep, ns = _deploy(kcluster, plan, "A")
    worker = naming.object_name(dep.key, "worker")

    def failed() -> dict[str, Any] | None:
        d = kcluster.get("Deployment", worker, ns)
        return next((c for c in d["status"].get("conditions") or [] if c["type"] == "ReplicaFailure"), None)

    cond = kcluster.wait_for(failed, 10, what="ReplicaFailure")
    (rs,) = [r for n, r in kcluster.objects("ReplicaSet", ns).items() if n.startswith(worker)]
    assert cond["status"] == "True" and cond["reason"] == "FailedCreate"
    assert cond["message"].startswith(f'pods "{rs["metadata"]["name"]}-" {expected}')
    events = kcluster.events(ns, rs["metadata"]["name"], "FailedCreate")
    assert events and events[0]["type"] == "Warning"
    assert events[0]["message"] == f"Error creating: {cond['message']}"
    assert kcluster.pods(ns, "orchestrator/role=worker") == []
    with pytest.raises(PermanentError) as err:  # the backend reads the refusal and stops at once
        backend.ready(dep, deadline_s=20)
    assert f"the cluster refused to create the pods of {naming.run_name(dep.key)}" in str(err.value)
    assert expected in str(err.value)
    kcluster.allow_pods()  # the admin fixes it: the ReplicaSet creates the pods
    kcluster.wait_for(lambda: kcluster.pods(ns, "orchestrator/role=worker"), 10, what="pods created")
    backend.ready(dep, deadline_s=45)
    d = kcluster.get("Deployment", worker, ns)
    assert not [c for c in d["status"]["conditions"] if c["type"] == "ReplicaFailure"]
    _teardown_and_check(kcluster, backend, dep, ns)


def test_killed_worker_restarts_and_a_crash_looping_one_is_permanent(kcluster: EmulatedCluster) -> None:
    plan = _plan()
    backend, dep, ns = _deploy(kcluster, plan, "B")
    backend.ready(dep, deadline_s=45)
    name = kcluster.kill_role(ns, "decode")
    old_pid = None

    def restarted() -> dict[str, Any] | None:
        pod = kcluster.get("Pod", name, ns)
        cs = pod["status"]["containerStatuses"][0]
        return cs if cs["restartCount"] == 1 else None

    cs = kcluster.wait_for(restarted, 10, what="restartCount 1")
    assert cs["lastState"]["terminated"]["exitCode"] == 137 and cs["lastState"]["terminated"]["reason"] == "Error"
    assert not backend.alive(dep), "a restart since ready is not alive"
    kcluster.wait_for(lambda: _condition(kcluster.get("Pod", name, ns), "Ready")["status"] == "True", 30,
                      what="ready again")
    old_pid = kcluster.process(name, ns)["pid"]
    assert old_pid and kcluster.get("Pod", name, ns)["status"]["containerStatuses"][0]["restartCount"] == 1

    prefill = kcluster.kill_role(ns, "prefill", restart=False)
    kcluster.wait_for(lambda: "waiting" in kcluster.get("Pod", prefill, ns)["status"]["containerStatuses"][0][
        "state"], 10, what="the kubelet saw the crash")
    with pytest.raises(PermanentError) as err:
        backend.ready(dep, deadline_s=20)
    assert f"{prefill} (prefill)" in str(err.value)
    assert re.search(r"CrashLoopBackOff: back-off \d+\w* restarting failed container=vllm", str(err.value))
    assert "last exit" in str(err.value)
    events = kcluster.events(ns, prefill, "BackOff")
    assert events and events[0]["message"].startswith("Back-off restarting failed container vllm in pod")
    _teardown_and_check(kcluster, backend, dep, ns)


def test_a_vllm_flag_vllm_would_reject_crash_loops_with_vllms_words(kcluster: EmulatedCluster) -> None:
    plan = _plan(engine={"extra_args": ["--no-such-flag"]})
    backend, dep, ns = _deploy(kcluster, plan, "A")
    with pytest.raises(PermanentError) as err:
        backend.ready(dep, deadline_s=20)
    assert "CrashLoopBackOff" in str(err.value) and "last exit 2 Error" in str(err.value)
    worker = kcluster.pods(ns, "orchestrator/role=worker")[0]["metadata"]["name"]
    assert "vllm serve: error: unrecognized arguments: --no-such-flag" in kcluster.logs(worker, ns)
    core = client.CoreV1Api(kcluster.api_client())  # kubectl logs [--previous]
    assert "unrecognized arguments: --no-such-flag" in core.read_namespaced_pod_log(worker, ns)
    assert "unrecognized arguments: --no-such-flag" in core.read_namespaced_pod_log(worker, ns, previous=True)
    _teardown_and_check(kcluster, backend, dep, ns)


def test_api_faults_are_retried_or_refused_like_on_a_real_server(kcluster: EmulatedCluster) -> None:
    plan = _plan()
    kcluster.inject_fault("PATCH", "/deployments/", 409)
    kcluster.inject_fault("PATCH", "/configmaps/", 500, times=2)
    kcluster.inject_fault("GET", "/pods", 429)
    backend, dep, ns = _deploy(kcluster, plan, "A")
    assert kcluster.requests("PATCH", "/deployments/") == 3, "worker: 409, then applied; router: applied"
    assert kcluster.requests("PATCH", "/configmaps/") == 3, "owner: 500, 500, then applied"
    backend.ready(dep, deadline_s=45)
    _teardown_and_check(kcluster, backend, dep, ns)

    fault = kcluster.inject_fault("PATCH", "/deployments/", 403)
    before = kcluster.requests("PATCH", "/deployments/")
    with pytest.raises(PermanentError) as err:
        backend.deploy(plan, "A", RunKey(plan.name, "A", 0, attempt=1))
    assert "lacks the RBAC verb `patch` on `deployments`" in str(err.value)
    assert 'cannot patch resource "deployments" in API group "apps"' in str(err.value)
    assert kcluster.requests("PATCH", "/deployments/") == before + 1 and fault.hits == 1, "403 is not retried"
    # The half-done deploy deleted what it had applied (owner, RBAC, the worker Service...).
    assert kcluster.objects("ConfigMap", ns) == {} and kcluster.objects("Deployment", ns) == {}
    assert kcluster.requests("DELETE", f"/namespaces/{ns}/") >= 4


def test_deleting_the_owner_or_the_namespace_cascades_and_stops_processes(kcluster: EmulatedCluster) -> None:
    plan = _plan()
    kcluster.add_pvc(naming.experiment_namespace(plan.name), "scratch")  # not the run's
    backend, dep, ns = _deploy(kcluster, plan, "A")
    backend.ready(dep, deadline_s=45)
    assert len(kcluster.live_processes()) == 3
    api = backend.api
    assert api.delete("ConfigMap", naming.run_name(dep.key), ns)  # the owner only: GC does the rest
    kcluster.wait_for(lambda: not kcluster.pods(ns) and not kcluster.objects("Deployment", ns)
                      and not kcluster.objects("Service", ns), 20, what="dependents collected")
    kcluster.wait_for(lambda: not kcluster.live_processes(), 10, what="processes stopped")
    assert kcluster.objects("PersistentVolumeClaim", ns), "not owned by the run: kept"
    assert api.delete("Namespace", ns)
    kcluster.wait_for(lambda: api.get("Namespace", ns) is None, 10, what="namespace gone")
    assert kcluster.objects("PersistentVolumeClaim", ns) == {}


def test_removing_the_gpu_nodes_stops_the_workers_and_leaves_them_unschedulable(kcluster: EmulatedCluster) -> None:
    plan = _plan()
    backend, dep, ns = _deploy(kcluster, plan, "A")
    backend.ready(dep, deadline_s=45)
    assert kcluster.remove_gpu_nodes() == ["h200-1", "h200-2"]
    kcluster.wait_for(lambda: len(kcluster.live_processes()) == 1, 15, what="workers stopped, router left")
    with pytest.raises(PermanentError) as err:
        backend.ready(dep, deadline_s=20)
    assert "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector." in str(err.value)
    _teardown_and_check(kcluster, backend, dep, ns)


# -- the API server on its own ---------------------------------------------------------------


def test_api_server_semantics_through_the_official_client(kcluster: EmulatedCluster) -> None:
    api = kcluster.kube_api()
    core = client.CoreV1Api(kcluster.api_client())
    kcluster.add_namespace("t")
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "t",
                                                                 "labels": {"tier": "x"}}, "data": {"k": "1"}}
    first = api.apply(copy.deepcopy(cm))
    assert first["metadata"]["uid"] and first["metadata"]["resourceVersion"]
    cm["data"]["k"] = "2"
    second = api.apply(copy.deepcopy(cm))  # server-side apply updates in place
    assert second["metadata"]["uid"] == first["metadata"]["uid"] and second["data"] == {"k": "2"}
    assert int(second["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    api.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b", "namespace": "t",
                                                                     "labels": {"tier": "y"}}})
    assert [o["metadata"]["name"] for o in api.list("ConfigMap", "t", labels="tier in (x, z)")] == ["a"]
    assert [o["metadata"]["name"] for o in api.list("ConfigMap", "t", labels="tier!=x")] == ["b"]
    assert api.list("Node", labels="nvidia.com/gpu.product in (NVIDIA-H200)")[0]["status"]["allocatable"][
        "nvidia.com/gpu"] == "8"
    with pytest.raises(PermanentError):  # the namespace must exist, as on a real server
        api.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "nope"}})
    # A watch from a resourceVersion sees later changes only, as the router's watcher relies on.
    rv = core.list_namespaced_config_map("t").metadata.resource_version
    api.delete("ConfigMap", "b", "t")
    seen = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
        core.list_namespaced_config_map, "t", resource_version=rv, timeout_seconds=1)]
    assert seen == [("DELETED", "b")]
    assert api.get("ConfigMap", "b", "t") is None and api.delete("ConfigMap", "b", "t") is False
    # The pod proxy reaches a real process; here: none, so the server says so.
    with pytest.raises(PermanentError) as err:
        api.proxy_get("t", "missing", 8000, "/metrics")
    assert 'pods "missing" not found' in str(err.value)


def test_port_forward_from_outside_and_exit_mid_run_stops_every_process() -> None:
    with EmulatedCluster() as cluster:
        # Outside the cluster with no URL: a load-generator pod sends the load to the router's
        # Service; this process reaches the router (control) and the generator over port-forwards.
        plan = _plan(access="auto")
        backend, dep, ns = _deploy(cluster, plan, "B")
        backend.ready(dep, deadline_s=45)
        path = dep.fingerprint.details["access_path"]
        assert path["mode"] == "in-cluster load generator" and path["url"] == dep.endpoint.send_url
        assert dep.endpoint.send_url.startswith("http://127.96.") and dep.driver.remote
        assert dep.endpoint.url.startswith("http://127.0.0.1:")
        assert _stream(dep.endpoint.url, dep.endpoint.model, 12)[1] == 12
        assert cluster.requests("GET", "-router-") >= 2 and cluster.requests("GET", "-loadgen-") >= 1
        pids = [p["pid"] for p in cluster.live_processes()]
        assert len(pids) == 4  # prefill, decode, router, load generator
    # No teardown: leaving the context stops the processes by process group.
    assert not cluster.live_processes()
    for pid in pids:
        assert not _alive(pid)
    assert not cluster.errors


def _namespace_requests(cluster: EmulatedCluster, since: int = 0) -> list[tuple[str, str]]:
    """Requests on the Namespace resource itself (``/api/v1/namespaces[/NAME]``), not on the
    objects in one, after the first ``since`` requests of the log."""
    return [(m, p) for m, p in cluster.request_log()[since:]
            if re.fullmatch(r"/api/v1/namespaces(/[^/]+)?", p.split("?")[0])]


def test_final_cleanup_never_reads_a_configured_namespace(kcluster: EmulatedCluster) -> None:
    """Issue 29: in the cluster the chart sets ORCH_K8S_NAMESPACE to its own namespace, and its
    Role grants nothing on namespaces; the experiment's final cleanup read that Namespace and
    so failed every in-cluster experiment at its very end. A configured namespace is the
    user's: cleanup deletes the experiment's objects in it and never asks about it."""
    plan = _plan()
    kcluster.add_namespace("team-a")
    backend = KubernetesBackend(api=kcluster.kube_api(), namespace="team-a", poll_s=0.1, log=lambda line: None)
    dep = backend.deploy(plan, "A", RunKey(plan.name, "A", 0))
    backend.ready(dep, deadline_s=60)
    assert kcluster.objects("Deployment", "team-a")
    since = len(kcluster.request_log())
    assert backend.cleanup(plan.name, final=True) > 0
    assert _namespace_requests(kcluster, since) == []
    # A fresh process (a resumed controller) knows only the experiment: the same.
    assert KubernetesBackend(api=kcluster.kube_api(), namespace="team-a").cleanup(plan.name, final=True) == 0
    assert _namespace_requests(kcluster, since) == []
    assert "team-a" in kcluster.objects("Namespace")
    for kind in ("Deployment", "Service", "ConfigMap", "Role", "RoleBinding", "ServiceAccount"):
        assert [n for n in kcluster.objects(kind, "team-a") if n != "kube-root-ca.crt"] == [], kind
    kcluster.wait_for(lambda: not kcluster.pods("team-a"), 20, what="pods gone")
    kcluster.wait_for(lambda: not kcluster.live_processes(), 20, what="processes stopped")


def test_final_cleanup_deletes_the_namespace_the_tool_created(kcluster: EmulatedCluster) -> None:
    """The control of the test above: with no namespace configured or planned, the backend
    creates ``orch-<experiment>`` and the final cleanup deletes it, also from a fresh process
    (a rerun finishing an experiment an earlier process started)."""
    plan = _plan()
    backend, dep, ns = _deploy(kcluster, plan, "A")
    assert ns == naming.experiment_namespace(plan.name) and ns in kcluster.objects("Namespace")
    backend.cleanup(plan.name, final=True)
    kcluster.wait_for(lambda: ns not in kcluster.objects("Namespace"), 20, what="namespace gone")

    backend, dep, ns = _deploy(kcluster, plan, "A")
    kcluster.wait_for(lambda: ns in kcluster.objects("Namespace"), 20, what="namespace again")
    fresh = KubernetesBackend(api=kcluster.kube_api(), log=lambda line: None)
    assert fresh.cleanup(plan.name, final=True) > 0
    kcluster.wait_for(lambda: ns not in kcluster.objects("Namespace"), 20, what="namespace gone")
    kcluster.wait_for(lambda: not kcluster.live_processes(), 20, what="processes stopped")


def _forward_threads(other_than: set[threading.Thread]) -> list[str]:
    """Threads of port-forwards still running (our relays, the client's websocket proxies),
    other than ``other_than`` (those of earlier tests)."""
    return [t.name for t in threading.enumerate()
            if t.name.startswith(("pf-", "Kubernetes port forward proxy")) and t not in other_than]


def test_concurrent_port_forward_streams_leave_the_backends_client_alone(kcluster: EmulatedCluster) -> None:
    """Issue 29: the official client's ``portforward`` swaps ``call_api`` on the ApiClient it is
    given while a stream opens; concurrent relays on the backend's own ApiClient left it
    swapped, and the scrape's and teardown's ordinary calls then failed (``Missing required
    parameter `ports```). Many streamed completions, each its own TCP connection and so its own
    websocket stream, while the same backend scrapes through the pod proxy and lists pods."""
    plan = _plan(access="auto")
    earlier = set(threading.enumerate())
    backend, dep, ns = _deploy(kcluster, plan, "A")
    backend.ready(dep, deadline_s=60)
    assert dep.fingerprint.details["access_path"]["mode"] == "in-cluster load generator"
    url, model = dep.endpoint.url, dep.endpoint.model  # the router's port-forward (control)
    streams, rounds = 12, 3
    opened = kcluster.requests("GET", "/portforward")
    errors: list[str] = []
    calls = {"scrape": 0, "list": 0}
    stop = threading.Event()

    def shared_client_calls() -> None:
        while not stop.is_set():
            try:
                assert len(backend.scrape(dep)) == 3
                calls["scrape"] += 1
                assert len(backend.api.list("Pod", ns, labels=dep.handles_as(KubeHandles).run_selector)) == 3
                calls["list"] += 1
            except Exception as e:  # noqa: BLE001 - every failure is the finding
                errors.append(f"shared client: {type(e).__name__}: {e}")
                return

    scraper = threading.Thread(target=shared_client_calls, daemon=True)
    scraper.start()
    try:
        for _ in range(rounds):
            gate = threading.Barrier(streams)

            def one(gate: threading.Barrier = gate) -> int:
                gate.wait(timeout=60)
                return _stream(url, model, 6)[1]

            with concurrent.futures.ThreadPoolExecutor(streams) as pool:
                futures = [pool.submit(one) for _ in range(streams)]
                for f in futures:
                    try:
                        assert f.result(timeout=120) == 6
                    except Exception as e:  # noqa: BLE001
                        errors.append(f"stream: {type(e).__name__}: {e}")
    finally:
        stop.set()
        scraper.join(timeout=60)
    assert not errors, errors[:5]
    assert calls["scrape"] >= 1 and calls["list"] >= 1, calls
    assert kcluster.requests("GET", "/portforward") >= opened + streams * rounds, "one stream per connection"
    # The shared client still makes ordinary calls, and teardown and cleanup leave nothing.
    assert len(backend.scrape(dep)) == 3
    _teardown_and_check(kcluster, backend, dep, ns)
    backend.cleanup(plan.name, final=True)
    kcluster.wait_for(lambda: ns not in kcluster.objects("Namespace"), 20, what="namespace gone")
    kcluster.wait_for(lambda: not _forward_threads(earlier), 30, what="port-forward threads ended")
    assert not kcluster.errors


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_timings_are_short(kcluster: EmulatedCluster) -> None:
    """A bound pod gets its IP and starts within the configured delays (keeps the suite fast)."""
    t0 = time.monotonic()
    kcluster.add_namespace("t")
    api = kcluster.kube_api()
    api.apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "r", "namespace": "t"},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "r"}}, "template": {
                   "metadata": {"labels": {"app": "r"}},
                   "spec": {"containers": [{"name": "router", "image": "vllm/vllm-router:v0.1.17",
                                            "command": ["vllm-router"],
                                            "args": ["--host", "0.0.0.0", "--port", "8000", "--service-discovery",
                                                     "--selector", "app=none", "--service-discovery-namespace",
                                                     "t", "--prometheus-host", "0.0.0.0"],
                                            "ports": [{"name": "http", "containerPort": 8000}],
                                            "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}}}]}}}})
    kcluster.wait_for(lambda: api.get("Deployment", "r", "t")["status"].get("readyReplicas") == 1, 20,
                      what="router ready")
    assert time.monotonic() - t0 < 15
    api.delete("Deployment", "r", "t")
    kcluster.wait_for(lambda: not kcluster.pods("t"), 10, what="pod gone")


def test_vllm_command_lines_are_read_as_vllm_reads_them() -> None:
    from orchestrator.backends.kubernetes.render import vllm_args
    from orchestrator.kcluster.containers import ContainerError, vllm_launch

    plan = _plan(engine={"kv_cache_dtype": "fp8", "max_num_seqs": 48})
    node = {"metadata": {"labels": {"nvidia.com/gpu.product": H100}}}
    pod = {"metadata": {"labels": {"orchestrator/role": "decode"}}}

    def container(args: list[str], gpus: int = 1) -> dict[str, Any]:
        return {"image": "vllm/vllm-openai:v0.32.0", "command": ["vllm", "serve"], "args": args,
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}

    launch = vllm_launch(container(vllm_args(plan, plan.arm("B"), 1)), pod, node, "127.77.9.9")
    argv = launch.argv
    assert argv[argv.index("--gpu") + 1] == "H100-SXM" and argv[argv.index("--role") + 1] == "decode"
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8" and argv[argv.index("--max-num-seqs") + 1] == "48"
    assert argv[argv.index("--host") + 1] == "127.77.9.9" and argv[argv.index("--port") + 1] == "8000"
    # Served under the name every backend's requests carry; simulated as the catalog's model.
    assert argv[argv.index("--served-model-name") + 1] == "Qwen/Qwen3-8B" and argv[argv.index("--model") + 1] == "qwen3-8b"

    cases = {
        ("Qwen/Qwen3-8B", "--tensor-parallel-size", "2"): (1, "World size (2) is larger than the number of available GPUs (1)"),
        ("Qwen/Qwen3-8B", "--kv-transfer-config", "{bad"): (2, "argument --kv-transfer-config"),
        ("Qwen/Qwen3-8B", "--kv-cache-dtype", "fp9"): (2, "argument --kv-cache-dtype: invalid choice: 'fp9'"),
        ("Qwen/Qwen3-8B", "--max-num-seqs", "many"): (2, "argument --max-num-seqs: invalid int value: 'many'"),
        ("org/unknown-model",): (1, "org/unknown-model is not a local folder and is not a valid model identifier"),
        ("Qwen/Qwen3-8B", "--max-num-seqs", "64", "--max-num-batched-tokens", "32"): (
            1, "max_num_batched_tokens (32) must be greater than or equal to max_num_seqs (64)"),
    }
    for args, (code, words) in cases.items():
        with pytest.raises(ContainerError) as err:
            vllm_launch(container(list(args)), pod, node, "127.77.9.9")
        assert err.value.exit_code == code and words in err.value.message, (args, err.value.message)


def _blocks(cluster: EmulatedCluster, plan: Plan, blocks: int) -> list[Deployment]:
    """Arm A deployed, made ready and torn down once per block, as an experiment's blocks do,
    each by a backend built from the environment's settings (as each `orch` process builds one)."""
    deps = []
    for block in range(blocks):
        backend = KubernetesBackend(api=cluster.kube_api(), poll_s=0.1, log=lambda line: None)
        dep = backend.deploy(plan, "A", RunKey(plan.name, "A", block))
        backend.ready(dep, deadline_s=60)
        deps.append(dep)
        _teardown_and_check(cluster, backend, dep, dep.handles_as(KubeHandles).namespace)
    return deps


def test_weights_are_fetched_once_per_cache_not_per_attempt(kcluster: EmulatedCluster,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: without a cache every vLLM pod downloads the weights on every block (an emptyDir
    dies with its pod), and its emptyDir is sized and its disk requested; the chart's claim
    (ORCH_K8S_MODEL_CACHE_PVC) makes it one download for all blocks and pods; a node's hostPath
    one per node. Counted by the emulated kubelet, which does what vLLM does with HF_HOME. Each
    run stores its start-up time and weights source."""
    hf = "Qwen/Qwen3-8B"
    plan = _plan()  # arm A: 2 colocated replicas
    deps = _blocks(kcluster, plan, 2)
    fetched = [f for f in kcluster.weights.fetches if f.model == hf]
    assert len(fetched) == 4 and {f.volume for f in fetched} == {"emptyDir"}, fetched  # 2 pods x 2 blocks
    assert fetched[0].bytes == int(plan.model.weight_bytes())
    for dep in deps:
        startup = dep.fingerprint.details["startup"]
        assert startup["seconds"] > 0 and startup["weights"].startswith("download into an emptyDir")

    ns = "llm-bench"
    kcluster.add_pvc(ns, "orch-model-cache")
    before = len(kcluster.weights.fetches)
    monkeypatch.setenv("ORCH_K8S_MODEL_CACHE_PVC", "orch-model-cache")  # what the chart's modelCache sets
    deps = _blocks(kcluster, _plan(namespace=ns), 3)
    monkeypatch.delenv("ORCH_K8S_MODEL_CACHE_PVC")
    fetched = kcluster.weights.fetches[before:]
    assert len(fetched) == 1 and fetched[0].volume == "persistentVolumeClaim", fetched
    assert all(d.fingerprint.details["startup"]["weights"] == "PersistentVolumeClaim orch-model-cache" for d in deps)

    before = len(kcluster.weights.fetches)
    kcluster.add_namespace("hostpath")
    _blocks(kcluster, _plan(model_cache_host_path="/var/lib/models", namespace="hostpath"), 3)
    fetched = kcluster.weights.fetches[before:]
    nodes = {f.node for f in fetched}
    assert len(fetched) == len(nodes) <= 2 and {f.volume for f in fetched} == {"hostPath"}, fetched


@pytest.mark.parametrize("placement,observed", [("same-node", "same-node"), ("spread", "cross-node")])
def test_placement_pins_prefill_and_decode_and_the_run_stores_what_it_got(
        kcluster: EmulatedCluster, placement: str, observed: str) -> None:
    """Issue 29: kubernetes.placement is honoured by the scheduler's inter-pod (anti-)affinity,
    and the run's fingerprint stores the placement observed from its pods' nodes."""
    plan = _plan(placement=placement)
    backend, dep, ns = _deploy(kcluster, plan, "B")
    backend.ready(dep, deadline_s=60)
    nodes = {p["metadata"]["labels"]["orchestrator/role"]: p["spec"]["nodeName"]
             for p in kcluster.pods(ns) if p["metadata"]["labels"]["orchestrator/role"] in ("prefill", "decode")}
    assert (nodes["prefill"] == nodes["decode"]) == (placement == "same-node"), nodes
    got = dep.fingerprint.details["pd_placement"]
    assert got == {"observed": observed, "prefill": [nodes["prefill"]], "decode": [nodes["decode"]]}
    _teardown_and_check(kcluster, backend, dep, ns)


def test_spread_placement_on_one_gpu_node_is_unschedulable_in_the_schedulers_words() -> None:
    with EmulatedCluster(nodes=[gpu_node("h200-only"), cpu_node()]) as cluster:
        backend, dep, ns = _deploy(cluster, _plan(placement="spread"), "B")
        with pytest.raises(TransientError) as err:
            backend.ready(dep, deadline_s=3)
        assert "didn't match pod anti-affinity rules" in str(err.value), str(err.value)[:2000]
        _teardown_and_check(cluster, backend, dep, ns)
