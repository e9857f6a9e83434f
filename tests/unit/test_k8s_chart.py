"""The Helm chart that deploys the orchestrator: lints strictly, renders, its objects validate, and
what it renders can run: the image the Dockerfile builds, the GPU pools as Ray resources, a
long-lived controller, load generators inside the cluster, the DSNs from Secrets (the owner's to
the migration only), NetworkPolicies around the chart's and the arms' pods, pods a
"restricted" namespace admits.

Helm's own Go SDK does the work (helm-python-sdk; no helm binary). RayCluster is a KubeRay CRD
with no schema in kubernetes-validate: its shape is checked against KubeRay's documented fields
(ray.io/v1) and its pod templates are validated as core PodTemplates.
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from packaging.requirements import Requirement

from orchestrator.backends.base import RunKey
from orchestrator.backends.kubernetes import naming
from orchestrator.backends.kubernetes.api import RESOURCES
from orchestrator.backends.kubernetes.probe_job import ProbeJobSpec, render_probe_job
from orchestrator.backends.kubernetes.render import (
    HTTP_PORT,
    NIXL_PORT,
    ROUTER_METRICS_PORT,
    render_arm,
)
from orchestrator.cli.main import main
from orchestrator.control.controller import gpu_demand
from orchestrator.engines.sglang import BOOTSTRAP_PORT as SGLANG_BOOTSTRAP_PORT
from orchestrator.plan import load_plan_file, validate_plan
from orchestrator.plan.catalog import GPUS
from orchestrator.plan.kubernetes import KubernetesSettings
from tests.support.chart import render_chart
from tests.unit.test_k8s_render import EXAMPLES, assert_valid_k8s, pod_security_problems

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "orchestrator"
DOCKERFILE = ROOT / "Dockerfile"

# KubeRay's RayCluster (ray.io/v1) fields, from its API reference: what the chart may set.
RAYCLUSTER_SPEC = {"rayVersion", "headGroupSpec", "workerGroupSpecs", "enableInTreeAutoscaling",
                   "autoscalerOptions", "headServiceAnnotations", "suspend", "managedBy",
                   "gcsFaultToleranceOptions", "upgradeStrategy", "authOptions"}
HEAD_GROUP = {"rayStartParams", "template", "serviceType", "headService", "enableIngress",
              "resources", "labels"}
WORKER_GROUP = {"groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams", "template",
                "scaleStrategy", "numOfHosts", "idleTimeoutSeconds", "suspend", "resources", "labels"}


def render(values: dict[str, Any] | None = None, namespace: str = "bench",
           name: str = "orch") -> list[dict[str, Any]]:
    """The chart's objects for ``values`` (schema-checked by Helm), NOTES.txt left out."""
    return render_chart(values, namespace=namespace, name=name)


def _one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind]
    return obj


def _groups(ray: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["groupName"]: g for g in ray["spec"]["workerGroupSpecs"]}


def pod_specs(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod the chart makes, by role: head, each worker group, the controller."""
    ray = _one(objs, "RayCluster")
    pods = {"head": ray["spec"]["headGroupSpec"]["template"]["spec"]}
    pods.update({name: g["template"]["spec"] for name, g in _groups(ray).items()})
    pods["controller"] = _one(objs, "Deployment")["spec"]["template"]["spec"]
    return pods


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod.get("initContainers") or []) + list(pod["containers"])


def ray_custom_resources(param: str) -> dict[str, float]:
    """What `ray start` receives from a rayStartParams ``resources`` value: KubeRay writes
    ``--resources=<value>`` into a bash command line, so the shell's unquoting applies."""
    (arg,) = shlex.split(f"--resources={param}")
    return json.loads(arg.removeprefix("--resources="))


def assert_valid_object(obj: dict[str, Any]) -> None:
    if obj["kind"] != "RayCluster":
        assert_valid_k8s(obj, "chart:")
        return
    assert obj["apiVersion"] == "ray.io/v1"
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", obj["metadata"]["name"])
    spec = obj["spec"]
    assert set(spec) <= RAYCLUSTER_SPEC, set(spec) - RAYCLUSTER_SPEC
    assert isinstance(spec["rayVersion"], str)
    head = spec["headGroupSpec"]
    assert set(head) <= HEAD_GROUP, set(head) - HEAD_GROUP
    groups = spec["workerGroupSpecs"]
    names = [g["groupName"] for g in groups]
    assert len(set(names)) == len(names), names
    for g in groups:
        assert set(g) <= WORKER_GROUP, set(g) - WORKER_GROUP
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", g["groupName"])
        for k in ("replicas", "minReplicas", "maxReplicas"):
            assert isinstance(g[k], int) and not isinstance(g[k], bool), (g["groupName"], k)
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"], g["groupName"]
    for group in [head, *groups]:
        params = group["rayStartParams"]
        assert isinstance(params, dict)
        # KubeRay's field is map[string]string: every value a string, never a number or bool.
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in params.items()), params
        if "resources" in params:
            res = ray_custom_resources(params["resources"])
            assert res and all(isinstance(v, int | float) and v > 0 for v in res.values()), res
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": group["template"]}
        assert_valid_k8s(pod, "RayCluster pod template:")
        # KubeRay takes the first container as the Ray container.
        assert group["template"]["spec"]["containers"][0]["name"] in ("ray-head", "ray-worker")


@cache
def check_chart() -> None:
    """Lint strictly and render with defaults; used by test_yaml_files for every chart file."""
    report = helm.lint(str(CHART), strict=True, kube_version="v1.29.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert not problems, problems
    for obj in render():
        assert_valid_object(obj)


def test_chart_lints_strictly_and_every_rendered_object_validates() -> None:
    check_chart()
    kinds = sorted(o["kind"] for o in render())
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Deployment", *["NetworkPolicy"] * 4, "RayCluster", "Role",
                     "RoleBinding", "Secret", "ServiceAccount"]
    values = {"imagePullSecrets": ["regcred"], "gpuPools": {"H100-SXM": 16, "H200": 0},
              "state": {"existingClaim": "orch-state"}, "database": {"migrate": False},
              "serviceAccount": {"create": False, "name": "existing"}, "rbac": {"create": False},
              "nodeSelector": {"pool": "cpu"}, "tolerations": [{"key": "dedicated", "operator": "Exists"}],
              "rayAuth": {"existingSecret": "my-ray-token"}, "networkPolicy": {"enabled": False}}
    objs = render(values)
    assert sorted(o["kind"] for o in objs) == ["Deployment", "RayCluster"]
    for obj in objs:
        assert_valid_object(obj)


def _dsn_keys(objs: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[str, str]]:
    """(Secret, key) of ORCH_DATABASE_URL in every container, by (pod role, container)."""
    keys = {}
    for role, pod in pod_specs(objs).items():
        for c in _containers(pod):
            env = {e["name"]: e for e in c["env"]}
            ref = env["ORCH_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
            assert set(env["ORCH_DATABASE_URL"]) == {"name", "valueFrom"}, (role, c["name"])
            keys[(role, c["name"])] = (ref["name"], ref["key"])
            assert all("value" not in e or "postgres" not in e["value"] for e in c["env"])
    return keys


def test_database_dsn_comes_from_a_secret_and_cannot_be_a_value() -> None:
    keys = _dsn_keys(render({"database": {"existingSecret": "pg", "secretKey": "dsn", "ownerSecretKey": "own"}}))
    assert keys.pop(("controller", "db-upgrade")) == ("pg", "own")
    assert set(keys.values()) == {("pg", "dsn")} and len(keys) == 4
    with pytest.raises(helm.HelmError) as err:
        render({"database": {"url": "postgresql://u:p@db/orch"}})
    assert "url" in str(err.value)
    with pytest.raises(helm.HelmError):
        render({"database": {"existingSecret": ""}})


def test_the_owner_dsn_migrates_and_the_runtime_dsn_runs() -> None:
    """DESIGN section 12: `orch db upgrade` (the init container) as the migration owner, every
    other container as the runtime role; by default too, and a configuration in which the runtime
    would run as the owner does not render."""
    for values, owner in (({}, ("orchestrator-db", "owner_url")),
                          ({"database": {"existingSecret": "pg", "secretKey": "runtime", "ownerSecretKey": "owner"}},
                           ("pg", "owner")),
                          # the owner's DSN in a Secret of its own (e.g. a database operator's superuser Secret)
                          ({"database": {"ownerExistingSecret": "pg-superuser", "ownerSecretKey": "url"}},
                           ("pg-superuser", "url"))):
        keys = _dsn_keys(render(values))
        assert [k for k, v in keys.items() if v == owner] == [("controller", "db-upgrade")], values
        runtime = {v for k, v in keys.items() if k != ("controller", "db-upgrade")}
        assert len(runtime) == 1 and owner not in runtime, (values, runtime)
        assert {k[0] for k in keys} == {"head", "experiments", "loadgen", "controller"}
    for db in ({"ownerSecretKey": ""}, {"ownerSecretKey": "url"}, {"ownerExistingSecret": "orchestrator-db", "ownerSecretKey": "url"}):
        with pytest.raises(helm.HelmError, match="database.ownerSecretKey"):
            render({"database": db})
    # Without the chart's migration the owner's DSN is nowhere: the runtime's in every container.
    keys = _dsn_keys(render({"database": {"migrate": False, "ownerSecretKey": ""}}))
    assert set(keys.values()) == {("orchestrator-db", "url")} and ("controller", "db-upgrade") not in keys
    values = yaml.safe_load((CHART / "values.yaml").read_text())["database"]
    assert values["ownerSecretKey"] and values["ownerSecretKey"] != values["secretKey"]


def test_image_defaults_to_what_the_dockerfile_builds_from_this_checkout() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"], "the image is tagged with the package version"
    expected = f"orchestrator:{chart['appVersion']}"
    assert "example" not in values["image"]["repository"]
    for role, pod in pod_specs(render()).items():
        for c in _containers(pod):
            assert c["image"] == expected, (role, c["name"])
    pod = pod_specs(render({"image": {"repository": "ghcr.io/acme/orchestrator", "tag": "dev"}}))["head"]
    assert pod["containers"][0]["image"] == "ghcr.io/acme/orchestrator:dev"

    text = DOCKERFILE.read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    (base,) = re.findall(r"^FROM (\S+)", text, re.M)
    assert re.fullmatch(r"python:3\.11[-.\w]*", base), base
    # Ray in the image is the chart's rayVersion, and one the package accepts.
    assert args["RAY_VERSION"] == values["rayVersion"] == _one(render(), "RayCluster")["spec"]["rayVersion"]
    ray_req = next(Requirement(d) for d in project["dependencies"] if Requirement(d).name == "ray")
    assert ray_req.specifier.contains(args["RAY_VERSION"]), (ray_req, args["RAY_VERSION"])
    # vllm-router from PyPI, the version of the router image arms run by default.
    router_tag = KubernetesSettings().router_image.rsplit(":", 1)[1]
    assert router_tag.lstrip("v") == args["VLLM_ROUTER_VERSION"]
    installs = " ".join(re.findall(r"pip install ([^\n]+)", text))
    # default: the dashboard agent KubeRay probes; client: the Ray Client server the controller uses.
    assert '"ray[default,client]==${RAY_VERSION}"' in installs and '"vllm-router==${VLLM_ROUTER_VERSION}"' in installs
    assert re.search(r"pip install [^\n]* \.(\s|$)", text), "the package is installed from the checkout"
    for path in ("orchestrator/", "migrations/", "manifests/", "pyproject.toml", "setup.py"):
        assert re.search(rf"^COPY .*\b{re.escape(path)}", text, re.M), path
    assert "kubectl" not in text
    # A numeric non-root user, the one the chart's pods run as.
    (user,) = re.findall(r"^USER (\S+)$", text, re.M)
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    assert int(uid) == values["podSecurityContext"]["runAsUser"]
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)


def test_gpu_pools_are_ray_resources_of_one_experiments_worker() -> None:
    ray = _one(render(), "RayCluster")
    head = ray["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0", "no experiment or shard is scheduled on the head"
    assert "resources" not in head["rayStartParams"]
    exp = _groups(ray)["experiments"]
    assert exp["replicas"] == exp["minReplicas"] == exp["maxReplicas"] == 1, "the pools are counted once"
    pools = ray_custom_resources(exp["rayStartParams"]["resources"])
    assert pools == {"H200": 8}, "0-GPU types are left out"
    assert exp["rayStartParams"]["num-cpus"] == "4"

    ray = _one(render({"gpuPools": {"H200": 0, "H100-SXM": 16, "H100-PCIe": 2},
                       "experiments": {"concurrency": 2}}), "RayCluster")
    exp = _groups(ray)["experiments"]
    pools = ray_custom_resources(exp["rayStartParams"]["resources"])
    assert pools == {"H100-SXM": 16, "H100-PCIe": 2}
    assert exp["rayStartParams"]["num-cpus"] == "2"
    # What `orch submit` checks (controller.submit): every example's larger arm fits the pools
    # of its GPU type, and the names are the plan catalog's.
    for path in EXAMPLES:
        plan = load_plan_file(path)
        demand = gpu_demand(plan)
        full = ray_custom_resources(_groups(_one(render({"gpuPools": {g: 64 for g in demand}}), "RayCluster"))
                                    ["experiments"]["rayStartParams"]["resources"])
        assert all(full.get(g, 0) >= n for g, n in demand.items()), (path.name, demand, full)
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]["gpuPools"]["properties"]) == set(GPUS)
    with pytest.raises(helm.HelmError) as err:
        render({"gpuPools": {"H100": 8}})  # an alias: Ray would count a pool no plan asks for
    assert "H100" in str(err.value)
    with pytest.raises(helm.HelmError) as err:
        render({"gpuPools": {"H200": 0}})
    assert "gpuPools" in str(err.value)


def test_controller_is_a_long_lived_deployment_and_loadgen_workers_run_in_the_cluster(
        capsys: pytest.CaptureFixture[str]) -> None:
    objs = render({"loadgenWorkers": {"replicas": 3, "minReplicas": 1, "maxReplicas": 5},
                   "controller": {"checkIntervalSeconds": 5}})
    ray = _one(objs, "RayCluster")
    for pod in pod_specs(objs).values():
        for c in _containers(pod):
            assert "lifecycle" not in c, "a hook cannot host a long-running process"
    dep = _one(objs, "Deployment")
    assert dep["metadata"]["name"] == "orch-orchestrator-controller"
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["orch", "controller", "serve"] and c["args"] == ["--interval", "5"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    # Ray Client on the head's Service (KubeRay names it <cluster>-head-svc; port 10001 is the
    # head container's "client" port).
    assert env["RAY_ADDRESS"] == f"ray://{ray['metadata']['name']}-head-svc:10001"
    head_ports = {p["name"]: p["containerPort"] for p in ray["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]}
    assert head_ports["client"] == 10001
    assert [i["command"] for i in pod["initContainers"]] == [["orch", "db", "upgrade"]]
    assert "initContainers" not in pod_specs(render({"database": {"migrate": False}}))["controller"]
    selector = dep["spec"]["selector"]["matchLabels"]
    assert selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    for group in [ray["spec"]["headGroupSpec"], *ray["spec"]["workerGroupSpecs"]]:
        labels = group["template"]["metadata"]["labels"]
        assert not selector.items() <= labels.items(), "the Deployment selects only its own pods"
    # The command the Deployment runs exists and is the long-running one.
    assert main(["controller", "serve", "--help"]) == 0
    assert "Usage: orch controller serve" in capsys.readouterr().out
    loadgen = _groups(ray)["loadgen"]
    assert loadgen["replicas"] == 3 and loadgen["maxReplicas"] == 5
    assert ray_custom_resources(loadgen["rayStartParams"]["resources"]) == {"loadgen": 1}
    with pytest.raises(helm.HelmError, match="too long"):
        render(name="a-release-name-far-too-long-for-kuberay")


def test_every_pod_is_restricted_and_pulls_with_the_given_secrets() -> None:
    for values in ({}, {"imagePullSecrets": ["regcred", "mirror"], "state": {"existingClaim": "st"}}):
        pods = pod_specs(render(values))
        assert set(pods) == {"head", "experiments", "loadgen", "controller"}
        for role, pod in pods.items():
            assert pod_security_problems(pod, "restricted") == [], (role, pod_security_problems(pod, "restricted"))
            secrets = [s["name"] for s in pod.get("imagePullSecrets", [])]
            assert secrets == values.get("imagePullSecrets", []), role
            # Run state on a volume at ORCH_STATE_DIR (writable by the non-root user via fsGroup).
            c = pod["containers"][0]
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert env["ORCH_STATE_DIR"].startswith(c["volumeMounts"][0]["mountPath"] + "/")
    exp = pod_specs(render({"state": {"existingClaim": "st"}}))["experiments"]
    assert exp["volumes"] == [{"name": "state", "persistentVolumeClaim": {"claimName": "st"}}]
    with pytest.raises(helm.HelmError):
        render({"imagePullSecrets": ["Not_A_Name"]})


def test_rbac_grants_what_the_backend_uses_and_nothing_cluster_wide_but_reading_nodes() -> None:
    objs = {o["kind"]: o for o in render()}
    granted: dict[str, set[str]] = {}
    for rule in objs["Role"]["rules"]:
        for res in rule["resources"]:
            granted.setdefault(res, set()).update(rule["verbs"])
    for kind, res in RESOURCES.items():
        if kind in ("Namespace", "Node"):
            continue
        read_only = kind in ("Pod", "Event", "PersistentVolumeClaim")
        need = {"get", "list"} if read_only else {"get", "list", "patch", "create", "delete"}
        assert need <= granted.get(res.plural, set()), (res.plural, need)
        if read_only:
            assert granted[res.plural] <= {"get", "list", "watch"}, res.plural
    assert "pods/proxy" in granted and "pods/log" in granted
    assert objs["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    assert objs["Role"]["metadata"]["namespace"] == objs["RoleBinding"]["metadata"]["namespace"] == "bench"
    sa = objs["ServiceAccount"]["metadata"]["name"]
    for role, pod in pod_specs(list(objs.values())).items():
        assert pod["serviceAccountName"] == sa, role


def _env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_ray_token_auth_is_on_in_every_ray_process_and_client() -> None:
    """Every container that runs Ray or talks to it (head, both worker groups, the controller)
    has RAY_AUTH_MODE=token and the token from one Secret: the chart's random one, or the
    user's; a Ray older than token auth is refused at render time instead of running open."""
    objs = render()
    secret = _one(objs, "Secret")
    token = base64.b64decode(secret["data"]["auth_token"]).decode()
    assert len(token) == 48 and token.isalnum()
    assert token != base64.b64decode(_one(render(), "Secret")["data"]["auth_token"]).decode(), "random per install"
    ref = {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "auth_token"}}
    for role, pod in pod_specs(objs).items():
        for c in pod["containers"]:
            env = _env_of(c)
            assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == ref, (role, c["name"])
    # `orch db upgrade` talks to the database only: it gets no Ray token (nor Ray's settings).
    for values in ({}, {"rayAuth": {"existingSecret": "my-ray-token"}}):
        (init,) = pod_specs(render(values))["controller"]["initContainers"]
        assert init["name"] == "db-upgrade"
        assert not {n for n in _env_of(init) if n.startswith("RAY_")}, _env_of(init)
        assert set(_env_of(init)) == {"ORCH_DATABASE_URL"}

    own = render({"rayAuth": {"existingSecret": "my-ray-token", "secretKey": "token"}})
    assert "Secret" not in {o["kind"] for o in own}
    for role, pod in pod_specs(own).items():
        assert _env_of(pod["containers"][0])["RAY_AUTH_TOKEN"] == {
            "secretKeyRef": {"name": "my-ray-token", "key": "token"}}, role

    with pytest.raises(helm.HelmError, match=r"needs Ray >= 2.52"):
        render({"rayVersion": "2.40.0"})
    open_ray = render({"rayVersion": "2.40.0", "rayAuth": {"enabled": False}})
    for pod in pod_specs(open_ray).values():
        assert "RAY_AUTH_MODE" not in _env_of(pod["containers"][0])


def test_dashboard_listens_in_the_head_pod_only() -> None:
    head = _one(render(), "RayCluster")["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    exposed = _one(render({"head": {"dashboardHost": "0.0.0.0"}}), "RayCluster")["spec"]["headGroupSpec"]
    assert exposed["rayStartParams"]["dashboard-host"] == "0.0.0.0"


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against a pod's labels."""
    if not all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, vals = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(key) not in vals or op == "NotIn" and key in labels and labels[key] in vals:
            return False
        if op == "Exists" and key not in labels or op == "DoesNotExist" and key in labels:
            return False
    return True


@dataclass(frozen=True)
class Source:
    """Where a connection comes from: a pod of the release namespace (its labels) or an address."""

    labels: tuple[tuple[str, str], ...] = ()
    ip: str | None = None

    @classmethod
    def pod(cls, labels: dict[str, str]) -> Source:
        return cls(labels=tuple(sorted(labels.items())))


def _peer_admits(peer: dict[str, Any], src: Source) -> bool:
    if src.ip is not None:  # an address outside the pods: only an ipBlock names it
        if "ipBlock" not in peer:
            return False
        ip = ipaddress.ip_address(src.ip)
        block = peer["ipBlock"]
        return ip in ipaddress.ip_network(block["cidr"]) and not any(
            ip in ipaddress.ip_network(x) for x in block.get("except") or [])
    if "ipBlock" in peer or "namespaceSelector" in peer:
        return False  # the chart's peers of the release namespace are pod selectors
    return _matches(peer["podSelector"], dict(src.labels))


def admitted(policies: list[dict[str, Any]], dest: dict[str, str], port: int, src: Source) -> bool:
    """Whether NetworkPolicy (ingress) lets ``src`` reach ``port`` of a pod labelled ``dest`` in
    the release namespace: not isolated, or some rule of a policy selecting it admits both."""
    selecting = [p["spec"] for p in policies
                 if "Ingress" in p["spec"]["policyTypes"] and _matches(p["spec"]["podSelector"], dest)]
    if not selecting:
        return True
    for spec in selecting:
        for rule in spec.get("ingress") or []:
            ports = rule.get("ports")
            if ports and not any(isinstance(pp["port"], int) and pp["port"] <= port <= pp.get("endPort", pp["port"])
                                 and pp.get("protocol", "TCP") == "TCP" for pp in ports):
                continue
            peers = rule.get("from")
            if not peers or any(_peer_admits(peer, src) for peer in peers):
                return True
    return False


def _policies(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == "NetworkPolicy"]


def _chart_pod_labels(objs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    ray = _one(objs, "RayCluster")["spec"]
    out = {"head": ray["headGroupSpec"]["template"]["metadata"]["labels"]}
    out.update({g["groupName"]: g["template"]["metadata"]["labels"] for g in ray["workerGroupSpecs"]})
    out["controller"] = _one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return out


def _arm_pods(plan_data: dict[str, Any], arm: str) -> dict[str, dict[str, Any]]:
    """The pod templates the backend deploys for ``arm``, by role, in the release namespace."""
    plan = validate_plan(plan_data)
    objs = render_arm(plan, arm, RunKey(plan.name, arm, 0), namespace="bench")
    return {o["spec"]["template"]["metadata"]["labels"][naming.ROLE_LABEL]: o["spec"]["template"]
            for o in objs if o["kind"] == "Deployment"}


def test_network_policy_admits_only_the_charts_own_pods() -> None:
    """The policy selects every pod of the chart (head, workers, controller) and admits traffic
    from those pods only (and the peers the user lists); the arms' pods have policies of their own."""
    objs = render()
    policy = next(p for p in _policies(objs) if p["metadata"]["name"] == "orch-orchestrator")["spec"]
    assert policy["policyTypes"] == ["Ingress"]  # egress stays open: arms, database, API server
    ray = _one(objs, "RayCluster")["spec"]
    templates = [ray["headGroupSpec"]["template"], *(g["template"] for g in ray["workerGroupSpecs"]),
                 _one(objs, "Deployment")["spec"]["template"]]
    for t in templates:
        assert _matches(policy["podSelector"], t["metadata"]["labels"]), t["metadata"]["labels"]
    (rule,) = policy["ingress"]
    assert "ports" not in rule and len(rule["from"]) == 1
    assert _matches(rule["from"][0]["podSelector"], templates[0]["metadata"]["labels"])
    router = yaml.safe_load((ROOT / "manifests" / "router.yaml").read_text())
    assert not _matches(policy["podSelector"], router["spec"]["template"]["metadata"]["labels"])
    other_release = {**templates[0]["metadata"]["labels"], "app.kubernetes.io/instance": "other"}
    assert not _matches(policy["podSelector"], other_release)
    # No arm pod reaches Ray (GCS, Ray Client, dashboard): a served model cannot drive the cluster.
    arm = _arm_pods(load_plan_file(EXAMPLES[0]).model_dump(mode="json", by_alias=True), "A")
    for t in arm.values():
        for port in (6379, 8265, 10001):
            assert not admitted(_policies(objs), templates[0]["metadata"]["labels"], port,
                                Source.pod(t["metadata"]["labels"]))

    prom = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    extra = next(p for p in _policies(render({"networkPolicy": {"extraIngressFrom": [prom]}}))
                 if p["metadata"]["name"] == "orch-orchestrator")
    assert extra["spec"]["ingress"][0]["from"][1] == prom
    assert_valid_object(extra)


def test_network_policy_covers_the_arms_pods_port_by_port() -> None:
    """The arms' pods (the backend's, labelled managed-by=orchestrator): the serving port only
    from the load generators and controller (the chart's pods), the routers and the API server's
    pod proxy; the routers' metrics port only from the chart's pods and that proxy; the KV
    hand-off (NIXL's side channel, SGLang's bootstrap) only from P/D peers; nothing else, and
    none of it on the chart's own pods. Rendered only with networkPolicy.enabled."""
    api_server = Source(ip="10.0.0.5")
    objs = render({"networkPolicy": {"apiServerFrom": [{"ipBlock": {"cidr": "10.0.0.0/28"}}]}})
    policies = _policies(objs)
    assert len(policies) == 4
    for p in policies:
        assert_valid_object(p)
        assert p["spec"]["policyTypes"] == ["Ingress"] and p["metadata"]["namespace"] == "bench"
    chart = _chart_pod_labels(objs)
    disagg = load_plan_file(ROOT / "examples" / "disagg-vs-colocated-h200.yaml").model_dump(mode="json", by_alias=True)
    sglang_pd = copy.deepcopy(disagg)
    sglang_pd["arms"]["B"].setdefault("engine", {})["kind"] = "sglang"
    vllm_a, vllm_b, sglang_b = _arm_pods(disagg, "A"), _arm_pods(disagg, "B"), _arm_pods(sglang_pd, "B")
    assert set(vllm_a) == {"worker", "router"} and set(vllm_b) == set(sglang_b) == {"prefill", "decode", "router"}
    probe = render_probe_job(ProbeJobSpec(gpu="H200", namespace="bench", image="pytorch/pytorch:2"))
    probe_labels = next(o for o in probe if o["kind"] == "Job")["spec"]["template"]["metadata"]["labels"]

    def lab(t: dict[str, Any]) -> dict[str, str]:
        return t["metadata"]["labels"]

    loaders = [Source.pod(chart[r]) for r in ("loadgen", "experiments", "controller")]
    routers = [Source.pod(lab(pods["router"])) for pods in (vllm_a, vllm_b, sglang_b)]
    pd_peers = [Source.pod(lab(pods[r])) for pods in (vllm_b, sglang_b) for r in ("prefill", "decode")]
    strangers = [Source.pod({}), Source.pod({"app": "curl"}), Source(ip="192.168.7.7"), Source.pod(probe_labels),
                 Source.pod({**chart["loadgen"], "app.kubernetes.io/instance": "other"})]
    workers = [lab(vllm_a["worker"]), *(lab(pods[r]) for pods in (vllm_b, sglang_b) for r in ("prefill", "decode"))]
    colocated = Source.pod(lab(vllm_a["worker"]))
    assert HTTP_PORT == 8000 and ROUTER_METRICS_PORT == 29000 and NIXL_PORT == 5600

    for dest in workers + [lab(pods["router"]) for pods in (vllm_a, vllm_b, sglang_b)]:
        role = dest[naming.ROLE_LABEL]
        is_router, is_pd = role == "router", role in ("prefill", "decode")
        for src in loaders + [api_server] + ([] if is_router else routers):
            assert admitted(policies, dest, HTTP_PORT, src), (role, src)
        for src in strangers + [colocated]:
            assert not admitted(policies, dest, HTTP_PORT, src), (role, src)
        others = loaders + routers + strangers + [api_server, colocated] + ([] if is_pd else pd_peers)
        for port in (22, 6379, 8080, 10001):  # nothing unlisted
            for src in others:
                assert not admitted(policies, dest, port, src), (role, port, src)
        for src in loaders + [api_server]:
            assert admitted(policies, dest, ROUTER_METRICS_PORT, src) == is_router, (role, src)
        for src in strangers + routers + [colocated] + ([] if is_pd else pd_peers):
            assert not admitted(policies, dest, ROUTER_METRICS_PORT, src), (role, src)

    # A workstation's run sends its load from a pod of its own next to the router (issue 29):
    # the serving port admits it, nothing else does.
    from orchestrator.backends.base import RunKey
    from orchestrator.backends.kubernetes.render import render_load_generator

    plan = load_plan_file(ROOT / "examples" / "disagg-vs-colocated-h200.yaml")
    run_loadgen = Source.pod(lab(render_load_generator(plan, RunKey("e", "B", 0), "bench")["spec"]["template"]))
    for dest in workers + [lab(pods["router"]) for pods in (vllm_a, vllm_b, sglang_b)]:
        assert admitted(policies, dest, HTTP_PORT, run_loadgen), dest[naming.ROLE_LABEL]
        for port in (ROUTER_METRICS_PORT, NIXL_PORT, SGLANG_BOOTSTRAP_PORT, 22):
            assert not admitted(policies, dest, port, run_loadgen), (dest[naming.ROLE_LABEL], port)

    # The KV hand-off: every port a P/D worker declares beyond the serving port (NIXL's side
    # channel, SGLang's bootstrap) from P/D peers only.
    kv_ports = {(p["containerPort"]) for pods in (vllm_b, sglang_b) for r in ("prefill", "decode")
                for p in pods[r]["spec"]["containers"][0]["ports"] if p["containerPort"] != HTTP_PORT}
    assert kv_ports == {NIXL_PORT, SGLANG_BOOTSTRAP_PORT}, kv_ports
    for dest in workers[1:]:
        for port in kv_ports:
            for src in pd_peers:
                assert admitted(policies, dest, port, src), (dest[naming.ROLE_LABEL], port, src)
            for src in [*loaders, *routers, colocated, *strangers, api_server]:
                assert not admitted(policies, dest, port, src), (dest[naming.ROLE_LABEL], port, src)
    for port in (NIXL_PORT, SGLANG_BOOTSTRAP_PORT):  # a colocated worker is no P/D peer
        assert not admitted(policies, lab(vllm_a["worker"]), port, pd_peers[0])

    # The chart's own pods are not under the arms' policies, nor the arms' pods under the chart's.
    arm_policies = [p for p in policies if p["metadata"]["name"] != "orch-orchestrator"]
    assert {p["metadata"]["name"] for p in arm_policies} == {
        "orch-orchestrator-arms", "orch-orchestrator-arm-routers", "orch-orchestrator-arms-kv"}
    for labels in chart.values():
        assert not any(_matches(p["spec"]["podSelector"], labels) for p in arm_policies), labels
    # Every port an arm pod declares is reachable by whoever needs it (no declared port left shut).
    for pods in (vllm_a, vllm_b, sglang_b):
        for role, t in pods.items():
            for p in t["spec"]["containers"][0]["ports"]:
                src = pd_peers[0] if p["containerPort"] not in (HTTP_PORT, ROUTER_METRICS_PORT) else loaders[0]
                assert admitted(policies, lab(t), p["containerPort"], src), (role, p)

    # Without apiServerFrom the API server's proxy is not admitted (NOTES.txt says so); the
    # extra peers of the serving port are the user's; networkPolicy.enabled=false renders none.
    plain = _policies(render())
    assert not admitted(plain, workers[0], HTTP_PORT, api_server)
    ingress = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
    with_ingress = _policies(render({"networkPolicy": {"armIngressFrom": [ingress]}}))
    arms = next(p for p in with_ingress if p["metadata"]["name"] == "orch-orchestrator-arms")
    assert arms["spec"]["ingress"][0]["from"][-1] == ingress
    routers_policy = next(p for p in with_ingress if p["metadata"]["name"] == "orch-orchestrator-arm-routers")
    assert ingress not in routers_policy["spec"]["ingress"][0]["from"]
    assert _policies(render({"networkPolicy": {"enabled": False}})) == []
    notes = helm.Chart.load(str(CHART)).render({}, name="orch", namespace="bench", is_install=True)
    assert "networkPolicy.apiServerFrom is empty" in next(v for k, v in notes.items() if k.endswith("NOTES.txt"))


def test_model_cache_is_one_shared_claim_every_experiment_uses() -> None:
    """Issue 29: weights once, not per attempt: modelCache.enabled creates a ReadWriteMany claim
    (kept on uninstall) and names it to every process that deploys arms (ORCH_K8S_MODEL_CACHE_PVC);
    existingClaim names the user's own instead; off by default (it needs a StorageClass with
    ReadWriteMany), and then no process is told of any claim."""
    def claim_env(objs: list[dict[str, Any]]) -> set[str | None]:
        return {next((e.get("value") for e in c.get("env") or [] if e["name"] == "ORCH_K8S_MODEL_CACHE_PVC"), None)
                for spec in pod_specs(objs).values() for c in _containers(spec)
                if any(e["name"] == "ORCH_K8S_NAMESPACE" for e in c.get("env") or [])}

    plain = render()
    assert not [o for o in plain if o["kind"] == "PersistentVolumeClaim"]
    assert claim_env(plain) == {None}

    objs = render({"modelCache": {"enabled": True, "size": "800Gi", "storageClassName": "efs"}})
    (pvc,) = [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    assert_valid_object(pvc)
    assert pvc["metadata"]["name"] == "orch-orchestrator-model-cache" and pvc["metadata"]["namespace"] == "bench"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["spec"]["storageClassName"] == "efs"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "800Gi"
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim_env(objs) == {"orch-orchestrator-model-cache"}

    mine = render({"modelCache": {"existingClaim": "weights"}})
    assert not [o for o in mine if o["kind"] == "PersistentVolumeClaim"]
    assert claim_env(mine) == {"weights"}
    with pytest.raises(helm.HelmError):
        render({"modelCache": {"enabled": True, "size": "lots"}})


def test_the_workstation_role_grants_what_the_charts_role_grants() -> None:
    """manifests/workstation-rbac.yaml is the chart's Role (what the backend does in the arms'
    namespace, the load generator's Deployment and port-forwards included) for a user outside
    the cluster, and read-only nodes as the chart's ClusterRole: the workstation e2e test runs
    under it, so it must not drift from the chart's."""
    docs = [d for d in yaml.safe_load_all((ROOT / "manifests" / "workstation-rbac.yaml").read_text()) if d]
    objs = render()

    def rules(kind: str, objects: list[dict[str, Any]]) -> list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]]:
        (role,) = [o for o in objects if o["kind"] == kind]
        return sorted((tuple(r.get("apiGroups", [])), tuple(sorted(r["resources"])), tuple(sorted(r["verbs"])))
                      for r in role["rules"])

    assert rules("Role", docs) == rules("Role", objs)
    assert rules("ClusterRole", docs) == rules("ClusterRole", objs)
    for binding in ("RoleBinding", "ClusterRoleBinding"):
        (b,) = [d for d in docs if d["kind"] == binding]
        assert b["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "you@example.com"}]
