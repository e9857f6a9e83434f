"""The Helm chart that deploys the orchestrator: lints strictly, renders, and its objects validate.

Helm's own Go SDK does the work (helm-python-sdk; no helm binary). RayCluster is a KubeRay CRD
with no schema in kubernetes-validate: its pod templates are validated as core PodTemplates.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from orchestrator.backends.kubernetes.api import RESOURCES
from tests.unit.test_k8s_render import assert_valid_k8s

CHART = Path(__file__).resolve().parents[2] / "helm" / "orchestrator"


def render(values: dict[str, Any] | None = None, namespace: str = "bench") -> list[dict[str, Any]]:
    """The chart's objects for ``values`` (schema-checked by Helm), NOTES.txt left out."""
    chart = helm.Chart.load(str(CHART))
    out = chart.render(values or {}, name="orch", namespace=namespace, is_install=True)
    objs = []
    for path, text in sorted(out.items()):
        if path.endswith(".yaml"):
            objs.extend(d for d in yaml.safe_load_all(text) if d)
    return objs


def assert_valid_object(obj: dict[str, Any]) -> None:
    if obj["kind"] != "RayCluster":
        assert_valid_k8s(obj, "chart:")
        return
    assert obj["apiVersion"] == "ray.io/v1"
    spec = obj["spec"]
    templates = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
    for g in spec["workerGroupSpecs"]:
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"], g["groupName"]
        assert isinstance(g["rayStartParams"], dict)
    for tpl in templates:
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": tpl}
        assert_valid_k8s(pod, "RayCluster pod template:")


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
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "RayCluster", "Role", "RoleBinding", "ServiceAccount"]


def test_database_dsn_comes_from_a_secret_and_cannot_be_a_value() -> None:
    ray = next(o for o in render() if o["kind"] == "RayCluster")
    head = ray["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in head["env"]}
    assert env["ORCH_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "orchestrator-db", "key": "url"}
    with pytest.raises(helm.HelmError) as err:
        render({"database": {"url": "postgresql://u:p@db/orch"}})
    assert "url" in str(err.value)
    with pytest.raises(helm.HelmError):
        render({"database": {"existingSecret": ""}})


def test_head_runs_the_controller_and_workers_the_loadgen_shards() -> None:
    ray = next(o for o in render({"head": {"startCommand": ["orch", "status"]},
                                  "loadgenWorkers": {"replicas": 3, "minReplicas": 1, "maxReplicas": 5}})
               if o["kind"] == "RayCluster")
    head = ray["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0", "no shard is scheduled on the head"
    assert head["template"]["spec"]["containers"][0]["lifecycle"]["postStart"]["exec"]["command"] == ["orch", "status"]
    (group,) = ray["spec"]["workerGroupSpecs"]
    assert group["groupName"] == "loadgen" and group["replicas"] == 3
    assert_valid_object(ray)


def test_rbac_grants_what_the_backend_uses_and_nothing_cluster_wide_but_reading_nodes() -> None:
    objs = {o["kind"]: o for o in render()}
    granted: dict[str, set[str]] = {}
    for rule in objs["Role"]["rules"]:
        for res in rule["resources"]:
            granted.setdefault(res, set()).update(rule["verbs"])
    for kind, res in RESOURCES.items():
        if kind in ("Namespace", "Node"):
            continue
        need = {"get", "list"} if kind in ("Pod", "Event") else {"get", "list", "patch", "create", "delete"}
        assert need <= granted.get(res.plural, set()), (res.plural, need)
    assert "pods/proxy" in granted and "pods/log" in granted
    assert objs["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    assert objs["RoleBinding"]["metadata"]["namespace"] == "bench"
