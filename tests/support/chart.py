"""The Helm chart (helm/orchestrator) rendered by Helm's own Go SDK (helm-python-sdk), and its
permissions installed into an emulated cluster, so a test can run as the chart's service account.

    identity, kubeconfig = install_chart_rbac(cluster, "llm-bench")
    env = {"KUBECONFIG": kubeconfig, "ORCH_K8S_NAMESPACE": "llm-bench", ...}   # as the chart's pods
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import yaml

from orchestrator.kcluster import EmulatedCluster

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "orchestrator"
RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


def render_chart(values: dict[str, Any] | None = None, namespace: str = "bench",
                 name: str = "orch") -> list[dict[str, Any]]:
    """The chart's objects for ``values`` (schema-checked by Helm), NOTES.txt left out."""
    import helm_python as helm

    chart = helm.Chart.load(str(CHART))
    out = chart.render(values or {}, name=name, namespace=namespace, is_install=True)
    objs: list[dict[str, Any]] = []
    for path, text in sorted(out.items()):
        if path.endswith(".yaml"):
            objs.extend(d for d in yaml.safe_load_all(text) if d)
    return objs


def install_chart_rbac(cluster: EmulatedCluster, namespace: str = "llm-bench",
                       release: str = "bench", values: dict[str, Any] | None = None) -> tuple[str, str]:
    """Apply the chart's ServiceAccount, Role, RoleBinding, ClusterRole and ClusterRoleBinding
    (release ``release`` in ``namespace``, created if missing) as an admin installing it would;
    (the identity its pods run as, a kubeconfig of that identity with ``namespace`` as default)."""
    objs = [o for o in render_chart(values, namespace=namespace, name=release) if o["kind"] in RBAC_KINDS]
    assert {o["kind"] for o in objs} == set(RBAC_KINDS), [o["kind"] for o in objs]
    identity = cluster.apply_chart_rbac(objs, namespace)
    assert identity.startswith(f"system:serviceaccount:{namespace}:"), identity
    return identity, cluster.kubeconfig_for(identity, namespace=namespace)


def keep_whole_audit(cluster: EmulatedCluster) -> None:
    """Keep every authorization decision from now on (the API server keeps the last 20000: a
    long run would push the early ones out before ``refusals`` reads them)."""
    cluster.apiserver.audit = collections.deque(cluster.apiserver.audit, maxlen=None)


def refusals(cluster: EmulatedCluster, identity: str | None = None) -> list[tuple[str, str, str, str, bool]]:
    """The requests the API server's RBAC refused (of ``identity``, or of anyone): (user, verb,
    resource or path, namespace, False), from its audit log."""
    audit = cluster._call(lambda: list(cluster.apiserver.audit))
    return [a for a in audit if not a[4] and (identity is None or a[0] == identity)]
