"""Cluster settings of a plan as rendered: tolerations as Kubernetes reads them, where weights
come from (and the default that works on a fresh namespace), RDMA for NIXL, and the checks
`orch plan validate` makes before anything reaches a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.base import RunKey
from orchestrator.backends.kubernetes.diagnose import pod_state, progress_line, unschedulable_fix
from orchestrator.backends.kubernetes.render import kv_transport, render_arm, toleration
from orchestrator.errors import PlanError
from orchestrator.plan import load_plan_file, validate_plan
from orchestrator.plan.kubernetes import Toleration

ROOT = Path(__file__).resolve().parents[2]


def _plan(**k8s: Any):
    base = load_plan_file(ROOT / "examples" / "quickstart.yaml").model_dump(mode="json", exclude_defaults=True)
    base["kubernetes"] = {**base.get("kubernetes", {}), **k8s}
    return validate_plan(base)


def _pool(plan, arm: str = "B", role: str = "decode") -> dict[str, Any]:
    objs = render_arm(plan, arm, RunKey(plan.name, arm, 0))
    return next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["labels"]["orchestrator/role"] == role)


def test_toleration_keeps_operator_exists_so_a_valued_taint_is_tolerated() -> None:
    # Left out, operator means Equal with value "": {key: dedicated} would not tolerate dedicated=h200.
    assert toleration(Toleration(key="dedicated", operator="Exists")) == {"operator": "Exists", "key": "dedicated"}
    assert toleration(Toleration(key="dedicated", operator="Equal", value="h200", effect="NoSchedule")) == {
        "operator": "Equal", "key": "dedicated", "value": "h200", "effect": "NoSchedule"}
    assert toleration(Toleration()) == {"operator": "Exists"}
    plan = _plan(tolerations=[{"key": "dedicated", "operator": "Exists"}])
    assert _pool(plan)["spec"]["template"]["spec"]["tolerations"] == [{"operator": "Exists", "key": "dedicated"}]


def test_default_weights_download_into_an_empty_dir_so_a_fresh_namespace_never_waits_on_a_claim() -> None:
    # ... sized for the weights (Qwen3-8B: 16.4 GB bf16, a quarter more, 10 GiB of caches), and the
    # node's disk asked for, so the scheduler places it where it fits (issue 29).
    pool = _pool(_plan())["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in pool["volumes"]}
    assert vols["model-cache"] == {"name": "model-cache", "emptyDir": {"sizeLimit": "30Gi"}}
    res = pool["containers"][0]["resources"]
    assert res["requests"]["ephemeral-storage"] == res["limits"]["ephemeral-storage"] == "30Gi"
    with_claim = _pool(_plan(namespace="inference", model_cache_pvc="weights"))["spec"]["template"]["spec"]
    assert "ephemeral-storage" not in with_claim["containers"][0]["resources"]["requests"]


def test_weights_from_a_claim_or_a_host_path() -> None:
    pvc = _plan(namespace="inference", model_cache_pvc="weights")
    vols = {v["name"]: v for v in _pool(pvc)["spec"]["template"]["spec"]["volumes"]}
    assert vols["model-cache"] == {"name": "model-cache", "persistentVolumeClaim": {"claimName": "weights"}}
    host = _plan(model_cache_host_path="/mnt/nvme/models")
    vols = {v["name"]: v for v in _pool(host)["spec"]["template"]["spec"]["volumes"]}
    assert vols["model-cache"]["hostPath"] == {"path": "/mnt/nvme/models", "type": "DirectoryOrCreate"}


def test_a_claim_without_a_namespace_and_two_sources_are_refused_with_their_paths() -> None:
    with pytest.raises(PlanError) as err:
        _plan(model_cache_pvc="weights")
    assert any("kubernetes.model_cache_pvc" in p and "kubernetes.namespace" in p for p in err.value.problems)
    with pytest.raises(PlanError) as err:
        _plan(namespace="x", model_cache_pvc="w", model_cache_host_path="/m")
    assert any("kubernetes.model_cache_host_path" in p and "one source" in p for p in err.value.problems)


def test_rdma_for_nixl_asks_for_the_device_ipc_lock_rc_and_the_secondary_network() -> None:
    plain = _plan()
    assert kv_transport(plain, plain.arm("B")) == "nixl/tcp" and kv_transport(plain, plain.arm("A")) is None
    c = _pool(plain)["spec"]["template"]["spec"]["containers"][0]
    assert "rdma/ib" not in c["resources"]["limits"]
    assert "IPC_LOCK" not in str(c.get("securityContext", {}))
    plan = _plan(kv_network={"rdma": True, "ucx_net_devices": "mlx5_0:1", "network_annotation": "sriov-net"})
    assert kv_transport(plan, plan.arm("B")) == "nixl/rdma"
    for role in ("prefill", "decode"):
        dep = _pool(plan, role=role)
        c = dep["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["UCX_TLS"].split(",")[0] == "rc" and env["UCX_NET_DEVICES"] == "mlx5_0:1"
        assert c["resources"]["limits"]["rdma/ib"] == "1" and c["resources"]["requests"]["rdma/ib"] == "1"
        # IPC_LOCK (pinned memory) is the one capability added back to the dropped ALL.
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert dep["spec"]["template"]["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "sriov-net"


def _pending(message: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "labels": {"orchestrator/role": "decode"}},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}}


def test_what_waiting_cannot_fix_is_named_with_its_fix_and_busy_gpus_are_waited_for() -> None:
    taint = pod_state(_pending("0/2 nodes are available: 2 node(s) had untolerated taint {dedicated: h200}."))
    assert "kubernetes.tolerations" in (unschedulable_fix(taint) or "") and "{dedicated: h200}" in (unschedulable_fix(taint) or "")
    claim = pod_state(_pending('0/2 nodes are available: persistentvolumeclaim "model-cache" not found.'))
    assert "model_cache_pvc" in (unschedulable_fix(claim) or "")
    busy = pod_state(_pending("0/3 nodes are available: 1 node(s) had untolerated taint {a: b}, 2 Insufficient nvidia.com/gpu."))
    assert unschedulable_fix(busy) is None


def test_image_pull_back_off_is_waited_for_and_shown_not_fatal() -> None:
    pod = {"metadata": {"name": "p", "labels": {"orchestrator/role": "worker"}}, "spec": {"nodeName": "n1"},
           "status": {"phase": "Pending", "containerStatuses": [
               {"name": "vllm", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling"}}}]}}
    s = pod_state(pod)
    assert s.fatal_reason is None and s.pulling and s.stage == "pulling"
    assert progress_line([s], 3) == "3 pods: 1 pulling, 2 not created yet"


def test_access_path_guard_voids_a_point_whose_path_is_a_material_share_of_the_ttft_limit() -> None:
    from orchestrator.analysis.guards import access_path
    from orchestrator.plan import SERVICE_CLASSES

    th = _plan().guards
    interactive = SERVICE_CLASSES["interactive"]  # TTFT limit 300 ms: 5% is 15 ms
    assert access_path(None, th, interactive).passed  # load sent directly (in cluster)
    assert access_path(0.004, th, interactive).passed
    g = access_path(0.040, th, interactive)
    assert not g.passed and g.value == pytest.approx(40.0) and g.threshold == pytest.approx(15.0)
