"""Discovery and version, as kubectl and client libraries read them from a real API server.

``/version`` (Kubernetes 1.31.4 unless the cluster is given another), ``/api`` (APIVersions), ``/api/v1`` and
``/apis/GROUP/VERSION`` (APIResourceList: each resource's kind, singular name, namespaced,
verbs, short names such as ``po``, ``svc``, ``no``, ``ns``, ``deploy``, ``cm``, categories, and
the subresources the server serves), ``/apis`` (APIGroupList) and ``/apis/GROUP`` (APIGroup).
The legacy documents only: a client asking for aggregated discovery
(``application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList``) gets plain JSON and
falls back to them, as kubectl does against a server without aggregated discovery.
``/healthz``, ``/livez`` and ``/readyz`` answer ``ok``; ``/openapi/...`` is not served (404).
"""

from __future__ import annotations

from typing import Any

import aiohttp.web

from orchestrator.kcluster.objects import RESOURCES, ApiError, Res

Obj = dict[str, Any]

DEFAULT_VERSION = "1.31.4"


def version_info(version: str = DEFAULT_VERSION) -> Obj:
    """``/version`` of a release ``MAJOR.MINOR.PATCH``."""
    major, minor, _ = parse_version(version)
    return {"major": str(major), "minor": str(minor), "gitVersion": f"v{version.lstrip('v')}",
            "gitCommit": "a78aa47129b8539636eb86a9d00e31b2720fe06b", "gitTreeState": "clean",
            "buildDate": "2024-12-10T11:37:19Z", "goVersion": "go1.22.9", "compiler": "gc",
            "platform": "linux/amd64"}


def parse_version(version: str) -> tuple[int, int, int]:
    parts = version.lstrip("v").split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a Kubernetes version MAJOR.MINOR.PATCH: {version!r}")
    return int(parts[0]), int(parts[1]), int(parts[2])

ALL = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
# plural -> (short names, categories, verbs)
INFO: dict[str, tuple[list[str], list[str], list[str]]] = {
    "namespaces": (["ns"], [], ["create", "delete", "get", "list", "patch", "update", "watch"]),
    "nodes": (["no"], [], ALL),
    "persistentvolumes": (["pv"], [], ALL),
    "pods": (["po"], ["all"], ALL),
    "services": (["svc"], ["all"], ALL),
    "endpoints": (["ep"], [], ALL),
    "configmaps": (["cm"], [], ALL),
    "secrets": ([], [], ALL),
    "serviceaccounts": (["sa"], [], ALL),
    "events": (["ev"], [], ALL),
    "persistentvolumeclaims": (["pvc"], [], ALL),
    "resourcequotas": (["quota"], [], ALL),
    "deployments": (["deploy"], ["all"], ALL),
    "replicasets": (["rs"], ["all"], ALL),
    "statefulsets": (["sts"], ["all"], ALL),
    "jobs": ([], ["all"], ALL),
    "roles": ([], [], ALL),
    "rolebindings": ([], [], ALL),
    "clusterroles": ([], [], ALL),
    "clusterrolebindings": ([], [], ALL),
    "leases": ([], [], ALL),
}
# The subresources this server serves: parent plural -> [(subresource, kind, verbs)].
SUBRESOURCES: dict[str, list[tuple[str, str, list[str]]]] = {
    "pods": [("status", "Pod", ["get", "patch", "update"]), ("log", "Pod", ["get"]),
             ("proxy", "PodProxyOptions", ["create", "delete", "get", "patch", "update"]),
             ("portforward", "PodPortForwardOptions", ["create", "get"])],
    "services": [("status", "Service", ["get", "patch", "update"]),
                 ("proxy", "ServiceProxyOptions", ["create", "delete", "get", "patch", "update"])],
    "deployments": [("status", "Deployment", ["get", "patch", "update"])],
    "replicasets": [("status", "ReplicaSet", ["get", "patch", "update"])],
    "statefulsets": [("status", "StatefulSet", ["get", "patch", "update"])],
    "jobs": [("status", "Job", ["get", "patch", "update"])],
    "nodes": [("status", "Node", ["get", "patch", "update"])],
    "namespaces": [("status", "Namespace", ["get", "patch", "update"])],
}
NON_RESOURCE_OK = ("/healthz", "/livez", "/readyz")


def group_versions() -> dict[str, list[Res]]:
    """``group/version`` (``v1`` for core) -> its resources."""
    out: dict[str, list[Res]] = {}
    for res in RESOURCES.values():
        out.setdefault(res.api_version, []).append(res)
    return out


def _resource(res: Res) -> list[Obj]:
    short, categories, verbs = INFO.get(res.plural, ([], [], ALL))
    main: Obj = {"name": res.plural, "singularName": res.kind.lower(), "namespaced": res.namespaced,
                 "kind": res.kind, "verbs": verbs}
    if short:
        main["shortNames"] = short
    if categories:
        main["categories"] = categories
    subs = [{"name": f"{res.plural}/{sub}", "singularName": "", "namespaced": res.namespaced,
             "kind": kind, "verbs": sub_verbs} for sub, kind, sub_verbs in SUBRESOURCES.get(res.plural, [])]
    return [main, *subs]


def resource_list(group_version: str) -> Obj | None:
    resources = group_versions().get(group_version)
    if resources is None:
        return None
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": [r for res in sorted(resources, key=lambda r: r.plural) for r in _resource(res)]}


def _group(name: str) -> Obj:
    gv = next(gv for gv in group_versions() if gv.startswith(f"{name}/"))
    version = {"groupVersion": gv, "version": gv.split("/", 1)[1]}
    return {"name": name, "versions": [version], "preferredVersion": version}


def groups() -> list[str]:
    return sorted({res.group for res in RESOURCES.values() if res.group})


def document(path: str, host: str, version: str = DEFAULT_VERSION) -> Obj | str | None:
    """The discovery document (or plain text) at ``path``; None: not a discovery path."""
    path = path.rstrip("/") or "/"
    if path == "/version":
        return version_info(version)
    if path in NON_RESOURCE_OK:
        return "ok"
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}]}
    if path == "/api/v1":
        return resource_list("v1")
    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g) for g in groups()]}
    parts = path.strip("/").split("/")
    if parts[0] == "apis" and len(parts) == 2 and parts[1] in groups():
        return {"kind": "APIGroup", "apiVersion": "v1", **_group(parts[1])}
    if parts[0] == "apis" and len(parts) == 3:
        return resource_list(f"{parts[1]}/{parts[2]}")
    if path == "/":
        paths = ["/api", "/api/v1", "/apis", *(f"/apis/{g}" for g in groups()),
                 *(f"/apis/{gv}" for gv in group_versions() if "/" in gv), *NON_RESOURCE_OK, "/version"]
        return {"paths": sorted(paths)}
    return None


def respond(path: str, host: str, version: str = DEFAULT_VERSION) -> aiohttp.web.Response:
    doc = document(path, host, version)
    if doc is None:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    if isinstance(doc, str):
        return aiohttp.web.Response(text=doc, content_type="text/plain")
    return aiohttp.web.json_response(doc)
