"""Rendered manifests: strictly valid Kubernetes objects, what the arm asks for, and unchanged.

Expected-output files live in tests/fixtures/k8s/. After an intended change, regenerate them with
``ORCH_REGENERATE=1 .venv/bin/python -m pytest tests/unit/test_k8s_render.py``: that run rewrites
the files and still fails, so a stale file never passes silently; review the diff, rerun.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from orchestrator.backends.base import RunKey
from orchestrator.backends.kubernetes import naming
from orchestrator.backends.kubernetes.render import render_arm, router_args, to_yaml
from orchestrator.cli.main import main
from orchestrator.errors import UserError
from orchestrator.plan import load_plan_file, validate_plan
from orchestrator.plan.catalog import VLLM_IMAGE_TAG

ROOT = Path(__file__).resolve().parents[2]
# Examples whose arms are provisioned (an external arm runs elsewhere: nothing to render).
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml") if load_plan_file(p).backend != "external")
EXTERNAL = ROOT / "examples" / "external-ab.yaml"
FIXTURES = ROOT / "tests" / "fixtures" / "k8s"
# Every minor release in this range must accept every object (strict: unknown fields fail).
K8S_VERSIONS = ("1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0")
DISAGG = ROOT / "examples" / "disagg-vs-colocated-h200.yaml"


def assert_valid_k8s(obj: dict[str, Any], where: str = "") -> None:
    """Fail unless ``obj`` validates strictly against the schemas of every version in range."""
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"{where} {obj.get('kind')}/{obj.get('metadata', {}).get('name')} "
                        f"invalid for Kubernetes {version} at {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            pytest.fail(f"{where}: {e.message}")


def _render(path: Path, arm: str) -> list[dict[str, Any]]:
    plan = load_plan_file(path)
    return render_arm(plan, arm, RunKey(plan.name, arm, 0))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("arm", ["A", "B"])
def test_every_object_of_every_example_arm_validates_strictly(path: Path, arm: str) -> None:
    for obj in _render(path, arm):
        assert_valid_k8s(obj, f"{path.name} arm {arm}:")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("arm", ["A", "B"])
def test_rendered_manifests_match_the_expected_files(path: Path, arm: str) -> None:
    text = to_yaml(_render(path, arm))
    expected = FIXTURES / f"{path.stem}-{arm}.yaml"
    if os.environ.get("ORCH_REGENERATE") == "1":
        expected.parent.mkdir(parents=True, exist_ok=True)
        expected.write_text(text)
        pytest.fail(f"regenerated {expected.relative_to(ROOT)}; review the diff and rerun without ORCH_REGENERATE")
    assert expected.exists(), f"missing {expected}; run with ORCH_REGENERATE=1 to create it"
    assert text == expected.read_text(), (
        f"{path.name} arm {arm} renders differently from {expected.relative_to(ROOT)}; "
        "if intended, regenerate with ORCH_REGENERATE=1"
    )


def _by_role(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["labels"][naming.ROLE_LABEL]: o for o in objs if o["kind"] == kind}


def test_disaggregated_arm_selects_h200_requests_tp_gpus_and_carries_nixl_on_both_pools() -> None:
    plan = load_plan_file(DISAGG)
    data = plan.model_dump(mode="json", by_alias=True)
    data["arms"]["B"]["prefill"] = {"replicas": 2, "tp": 2}
    data["arms"]["B"]["decode"] = {"replicas": 1, "tp": 4}
    plan = validate_plan(data)
    deployments = _by_role(render_arm(plan, "B", RunKey(plan.name, "B", 0)), "Deployment")
    assert set(deployments) == {"prefill", "decode", "router"}
    for role, tp in (("prefill", 2), ("decode", 4)):
        pod = deployments[role]["spec"]["template"]["spec"]
        term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        expr = term["nodeSelectorTerms"][0]["matchExpressions"][0]
        assert expr == {"key": "nvidia.com/gpu.product", "operator": "In",
                        "values": ["NVIDIA-H200", "NVIDIA-H200-141GB-HBM3e"]}
        c = pod["containers"][0]
        assert c["resources"]["requests"]["nvidia.com/gpu"] == str(tp)
        assert c["resources"]["limits"]["nvidia.com/gpu"] == str(tp)
        args = c["args"]
        assert args[args.index("--tensor-parallel-size") + 1] == str(tp)
        kv = json.loads(args[args.index("--kv-transfer-config") + 1])
        assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        env = {e["name"]: e for e in c["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert {"name": "nixl", "containerPort": 5600, "protocol": "TCP"} in c["ports"]
        assert c["image"] == f"vllm/vllm-openai:{VLLM_IMAGE_TAG}"
    router = deployments["router"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--vllm-pd-disaggregation" in router
    assert router[router.index("--prefill-selector") + 2] == "orchestrator/role=prefill"
    assert router[router.index("--decode-selector") + 2] == "orchestrator/role=decode"
    assert router[router.index("--policy") + 1] == "cache_aware"


def test_colocated_arm_has_no_nixl_and_router_discovers_its_workers() -> None:
    plan = load_plan_file(DISAGG)
    objs = render_arm(plan, "A", RunKey(plan.name, "A", 0))
    deployments = _by_role(objs, "Deployment")
    assert set(deployments) == {"worker", "router"}
    worker = deployments["worker"]
    assert worker["spec"]["replicas"] == 4
    c = worker["spec"]["template"]["spec"]["containers"][0]
    assert "--kv-transfer-config" not in c["args"]
    assert all(e["name"] != "VLLM_NIXL_SIDE_CHANNEL_HOST" for e in c["env"])
    labels = naming.run_labels(RunKey(plan.name, "A", 0))
    args = router_args(plan, "A", "ns1", labels)
    at = args.index("--selector")
    assert args[at + 1:at + 3] == [f"orchestrator/run={labels['orchestrator/run']}", "orchestrator/role=worker"]
    assert not args[at + 3].startswith("orchestrator/")  # the selector ends there


def test_every_object_is_labelled_and_namespaced_and_cluster_settings_apply() -> None:
    plan = load_plan_file(DISAGG)
    data = plan.model_dump(mode="json", by_alias=True)
    data["kubernetes"] = {
        "namespace": "llm-bench",
        "gpu_products": {"H200": ["H200-custom"]},
        "model_cache_pvc": None,
        "shm_size": "20Gi",
        "node_selector": {"pool": "gpu"},
    }
    plan = validate_plan(data)
    key = RunKey(plan.name, "B", 3, attempt=1)
    objs = render_arm(plan, "B", key)
    assert all(o["kind"] != "Namespace" for o in objs), "a given namespace is not created"
    for o in objs:
        meta = o["metadata"]
        assert meta["namespace"] == "llm-bench"
        for k in ("orchestrator/experiment", "orchestrator/run", "orchestrator/arm", "orchestrator/role"):
            assert k in meta["labels"], (o["kind"], k)
        assert meta["labels"]["orchestrator/block"] == "3"
        assert_valid_k8s(o)
    pod = _by_role(objs, "Deployment")["decode"]["spec"]["template"]["spec"]
    expr = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert expr["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["H200-custom"]
    assert pod["nodeSelector"] == {"pool": "gpu"}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["model-cache"] == {"name": "model-cache", "emptyDir": {"sizeLimit": "30Gi"}}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "20Gi"}


def test_names_stay_valid_for_long_or_odd_experiment_names() -> None:
    key = RunKey("9_Very.Long_experiment_name_" + "x" * 80, "B", 12, 3)
    for role in ("worker", "prefill", "decode", "router"):
        name = naming.object_name(key, role)
        assert len(name) <= 63 and name[0].isalpha() and name.replace("-", "").isalnum(), name
    for v in naming.run_labels(key).values():
        assert len(v) <= 63 and v[0].isalnum() and v[-1].isalnum(), v
    other = RunKey("9_Very.Long_experiment_name_" + "x" * 81, "B", 12, 3)
    assert naming.run_name(key) != naming.run_name(other), "cut names stay distinct"


def test_bad_cluster_settings_are_plan_errors_with_their_path() -> None:
    data = yaml.safe_load(DISAGG.read_text())
    data["kubernetes"] = {"shm_size": "lots", "gpu_products": {"B300": ["x"]}, "namespce": "x"}
    from orchestrator.errors import PlanError

    with pytest.raises(PlanError) as err:
        validate_plan(data)
    text = "\n".join(err.value.problems)
    assert "kubernetes.namespce: unknown field" in text
    assert "kubernetes.gpu_products" in text and "B300" in text


def test_cli_render_writes_one_valid_file_per_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["k8s", "render", str(DISAGG), "--arm", "B", "--out", str(tmp_path), "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    files = [Path(f) for f in doc["files"]]
    assert [f.name for f in files] == sorted(f.name for f in tmp_path.iterdir())
    kinds = [yaml.safe_load(f.read_text())["kind"] for f in files]
    assert kinds.count("Deployment") == 3 and "Namespace" in kinds
    for f in files:
        assert_valid_k8s(yaml.safe_load(f.read_text()), f.name)


def test_cli_render_unknown_arm_is_one_line_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["k8s", "render", str(DISAGG), "--arm", "C", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["--arm: no arm 'C' in " + str(DISAGG) + "; arms are A, B"]


def test_an_external_arm_has_nothing_to_render() -> None:
    plan = load_plan_file(EXTERNAL)
    with pytest.raises(UserError, match="external endpoint"):
        render_arm(plan, "A", RunKey(plan.name, "A", 0))


# --- Pod Security Standards (https://kubernetes.io/docs/concepts/security/pod-security-standards/)
# The checks of the "baseline" and "restricted" levels (policy version 1.29+) over a pod spec, as
# the PodSecurity admission plugin makes them for a namespace labelled
# pod-security.kubernetes.io/enforce=<level>. Windows-only and deprecated-annotation checks are
# left out: nothing here sets them.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}


def pod_security_problems(pod: dict[str, Any], level: str) -> list[str]:
    """What keeps ``pod`` (a PodSpec) out of a namespace enforcing ``level`` (baseline or
    restricted); empty when it is admitted."""
    assert level in ("baseline", "restricted")
    out: list[str] = []
    psc = pod.get("securityContext") or {}
    containers = [(c["name"], c) for key in ("initContainers", "containers", "ephemeralContainers")
                  for c in pod.get(key) or []]
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            out.append(f"{field}: true")
    for vol in pod.get("volumes") or []:
        kind = next(k for k in vol if k != "name")
        if kind == "hostPath":
            out.append(f"volume {vol['name']}: hostPath")
        elif level == "restricted" and kind not in RESTRICTED_VOLUMES:
            out.append(f"volume {vol['name']}: {kind} is not allowed by restricted")
    for s in psc.get("sysctls") or []:
        if s["name"] not in SAFE_SYSCTLS:
            out.append(f"sysctl {s['name']}")
    contexts = [("pod", psc)] + [(n, c.get("securityContext") or {}) for n, c in containers]
    for where, sc in contexts:
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"{where}: seccompProfile Unconfined")
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            out.append(f"{where}: appArmorProfile Unconfined")
        se = sc.get("seLinuxOptions") or {}
        if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
            out.append(f"{where}: seLinuxOptions {se}")
        if level == "restricted" and sc.get("runAsUser") == 0:
            out.append(f"{where}: runAsUser 0")
    for name, c in containers:
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount {sc['procMount']}")
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            out.append(f"{name}: adds capabilities {sorted(added - BASELINE_CAPABILITIES)}")
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                out.append(f"{name}: hostPort {p['hostPort']}")
        if level == "baseline":
            continue
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        if sc.get("runAsNonRoot") is False or not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
            out.append(f"{name}: runAsNonRoot is not true")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile is {seccomp or 'unset'} (RuntimeDefault or Localhost)")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds capabilities beyond NET_BIND_SERVICE")
    return out


def _pod_specs(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["labels"][naming.ROLE_LABEL]: o["spec"]["template"]["spec"]
            for o in objs if o["kind"] == "Deployment"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("arm", ["A", "B"])
def test_vllm_pods_are_baseline_and_router_pods_restricted(path: Path, arm: str) -> None:
    pods = _pod_specs(_render(path, arm))
    assert "router" in pods and len(pods) >= 2
    for role, pod in pods.items():
        level = "restricted" if role == "router" else "baseline"
        assert pod_security_problems(pod, level) == [], (path.name, arm, role, level)
        c = pod["containers"][0]
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        # Every engine (vLLM, SGLang) and router container drops every capability and adds none
        # back (RDMA for NIXL adds IPC_LOCK alone: test_k8s_settings).
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}, (path.name, arm, role)
    vllm = next(p for r, p in pods.items() if r != "router")
    env = {e["name"]: e.get("value") for e in vllm["containers"][0]["env"]}
    mounts = {m["mountPath"]: m["name"] for m in vllm["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in vllm["volumes"]}
    # Everything vLLM writes lands on a volume: its caches under HOME, weights under HF_HOME.
    for var in ("HOME", "HF_HOME"):
        assert env[var] in mounts, (var, env[var], mounts)
        assert "hostPath" not in volumes[mounts[env[var]]]


def test_the_pod_security_check_finds_what_each_level_refuses() -> None:
    plan = load_plan_file(DISAGG)
    pods = _pod_specs(render_arm(plan, "B", RunKey(plan.name, "B", 0)))
    router, prefill = pods["router"], pods["prefill"]
    assert pod_security_problems(prefill, "restricted"), "vLLM runs as root: not restricted"
    for mutate, level in [
        (lambda p: p["containers"][0]["securityContext"].update(privileged=True), "baseline"),
        (lambda p: p["containers"][0]["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]}), "baseline"),
        (lambda p: p.setdefault("volumes", []).append({"name": "h", "hostPath": {"path": "/m"}}), "baseline"),
        (lambda p: p.update(hostIPC=True), "baseline"),
        (lambda p: p["securityContext"].update(seccompProfile={"type": "Unconfined"}), "baseline"),
        (lambda p: p["containers"][0]["securityContext"].pop("capabilities"), "restricted"),
        (lambda p: p["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"), "restricted"),
        (lambda p: p["securityContext"].pop("runAsNonRoot"), "restricted"),
        (lambda p: p["securityContext"].pop("seccompProfile"), "restricted"),
    ]:
        pod = copy.deepcopy(router)
        mutate(pod)
        assert pod_security_problems(pod, level), (level, pod)
    for mutate in (lambda p: p["containers"][0]["securityContext"].update(capabilities={"add": ["IPC_LOCK"]}),
                   lambda p: p["containers"][0]["securityContext"].update(privileged=True)):
        pod = copy.deepcopy(prefill)
        mutate(pod)
        assert pod_security_problems(pod, "baseline"), pod


def test_image_pull_secrets_go_into_every_pod_and_bad_names_are_refused() -> None:
    data = yaml.safe_load(DISAGG.read_text())
    data["kubernetes"] = {"image_pull_secrets": ["registry-creds", "mirror.example-com"]}
    plan = validate_plan(data)
    for arm in ("A", "B"):
        objs = render_arm(plan, arm, RunKey(plan.name, arm, 0))
        pods = _pod_specs(objs)
        assert len(pods) >= 2
        for pod in pods.values():
            assert pod["imagePullSecrets"] == [{"name": "registry-creds"}, {"name": "mirror.example-com"}]
        for o in objs:
            assert_valid_k8s(o)
    default = load_plan_file(DISAGG)
    assert all("imagePullSecrets" not in p for p in _pod_specs(render_arm(default, "B", RunKey(default.name, "B", 0))).values())
    from orchestrator.errors import PlanError

    data["kubernetes"] = {"image_pull_secrets": ["Registry_Creds"]}
    with pytest.raises(PlanError) as err:
        validate_plan(data)
    assert "kubernetes.image_pull_secrets" in "\n".join(err.value.problems)


def test_the_load_generator_of_a_run_is_restricted_valid_and_none_of_the_arms_pods() -> None:
    """Issue 29: outside the cluster each run gets a load-generator Deployment (`orch loadgen
    agent`, the plan's kubernetes.loadgen_image): valid for every Kubernetes version in range,
    Pod Security restricted, cleaned up with the experiment's label, and not selected by the
    arm's run label (so it is never scraped as a worker nor counted in the fingerprint)."""
    from orchestrator.backends.kubernetes.render import render_load_generator
    from orchestrator.plan.kubernetes import LOADGEN_IMAGE

    plan = load_plan_file(DISAGG)
    key = RunKey(plan.name, "B", 1, 2)
    arm = render_arm(plan, "B", key)
    ns = arm[-1]["metadata"]["namespace"]
    obj = render_load_generator(plan, key, ns)
    assert_valid_k8s(obj, "loadgen:")
    pod = obj["spec"]["template"]["spec"]
    assert pod_security_problems(pod, "restricted") == []
    c = pod["containers"][0]
    assert c["image"] == LOADGEN_IMAGE and c["command"][:3] == ["orch", "loadgen", "agent"]
    assert pod["automountServiceAccountToken"] is False  # it never talks to the API server
    labels = obj["spec"]["template"]["metadata"]["labels"]
    run_labels = naming.run_labels(key)
    assert labels[naming.EXPERIMENT_LABEL] == run_labels[naming.EXPERIMENT_LABEL]
    assert labels[naming.RUN_LABEL] != run_labels[naming.RUN_LABEL]
    assert labels["app.kubernetes.io/managed-by"] == "orchestrator" and labels[naming.ROLE_LABEL] == "loadgen"
    assert obj["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert obj["metadata"]["namespace"] == ns
    # The image defaults to the tag the Dockerfile and the chart build (orchestrator:<appVersion>).
    chart = yaml.safe_load((ROOT / "helm" / "orchestrator" / "Chart.yaml").read_text())
    assert f"orchestrator:{chart['appVersion']}" == LOADGEN_IMAGE
    other = validate_plan({**plan.model_dump(mode="json", by_alias=True, exclude_none=True),
                           "kubernetes": {**plan.kubernetes.model_dump(mode="json"), "loadgen_image": "r.io/o/orch:9"}})
    assert render_load_generator(other, key, ns)["spec"]["template"]["spec"]["containers"][0]["image"] == "r.io/o/orch:9"


def test_a_lead_in_run_renders_valid_objects_apart_from_the_measured_run() -> None:
    """A lead-in (``design.carryover.lead_in_s``; attempt -1) is deployed like a run: its objects
    validate strictly, its labels say lead1, and no name collides with the block's measured run."""
    plan = load_plan_file(DISAGG)
    lead = render_arm(plan, "B", RunKey(plan.name, "B", 4, -1))
    run = render_arm(plan, "B", RunKey(plan.name, "B", 4, 0))
    for obj in lead:
        assert_valid_k8s(obj, "lead-in:")
        if obj["kind"] != "Namespace":  # the experiment's, shared by its runs
            assert obj["metadata"]["labels"]["orchestrator/attempt"] == "lead1"
    names = lambda objs: {(o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] != "Namespace"}  # noqa: E731
    assert names(lead) and not names(lead) & names(run)
    long_key = RunKey("9_Very.Long_experiment_name_" + "x" * 80, "B", 12, -3)
    for v in naming.run_labels(long_key).values():
        assert len(v) <= 63 and v[0].isalnum() and v[-1].isalnum(), v
