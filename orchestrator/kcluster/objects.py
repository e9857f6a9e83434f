"""The API server's vocabulary: resources, Status errors, routes, patches, watch events and
injected faults (pure helpers of ``apiserver``)."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import aiohttp.web
import kmock
import yaml

from orchestrator.kcluster.selectors import (
    matches_labels,
)

Obj = dict[str, Any]
Key = tuple[str, str | None, str]  # (plural, namespace, name)


@dataclass(frozen=True)
class Res:
    plural: str
    kind: str
    group: str  # "" for core
    version: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """How error messages name the resource: ``pods``, ``deployments.apps``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCES: dict[str, Res] = {r.plural: r for r in [
    Res("namespaces", "Namespace", "", "v1", False),
    Res("nodes", "Node", "", "v1", False),
    Res("persistentvolumes", "PersistentVolume", "", "v1", False),
    Res("pods", "Pod", "", "v1", True),
    Res("services", "Service", "", "v1", True),
    Res("endpoints", "Endpoints", "", "v1", True),
    Res("configmaps", "ConfigMap", "", "v1", True),
    Res("secrets", "Secret", "", "v1", True),
    Res("serviceaccounts", "ServiceAccount", "", "v1", True),
    Res("events", "Event", "", "v1", True),
    Res("persistentvolumeclaims", "PersistentVolumeClaim", "", "v1", True),
    Res("resourcequotas", "ResourceQuota", "", "v1", True),
    Res("deployments", "Deployment", "apps", "v1", True),
    Res("replicasets", "ReplicaSet", "apps", "v1", True),
    Res("statefulsets", "StatefulSet", "apps", "v1", True),
    Res("jobs", "Job", "batch", "v1", True),
    Res("roles", "Role", "rbac.authorization.k8s.io", "v1", True),
    Res("rolebindings", "RoleBinding", "rbac.authorization.k8s.io", "v1", True),
    Res("clusterroles", "ClusterRole", "rbac.authorization.k8s.io", "v1", False),
    Res("clusterrolebindings", "ClusterRoleBinding", "rbac.authorization.k8s.io", "v1", False),
    Res("leases", "Lease", "coordination.k8s.io", "v1", True),
]}
KIND_TO_PLURAL = {r.kind: r.plural for r in RESOURCES.values()}
# Kinds whose spec changes bump metadata.generation.
GENERATION_KINDS = {"deployments", "replicasets", "statefulsets", "jobs", "services", "persistentvolumeclaims"}


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ApiError(Exception):
    """A Status answer: ``code`` with ``reason`` and ``message``, as the API server sends them."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details = details or {}
        self.headers = headers or {}

    def status(self) -> Obj:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details, "code": self.code}

    def response(self) -> aiohttp.web.Response:
        return aiohttp.web.json_response(self.status(), status=self.code, headers=self.headers)


def not_found(res: Res, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{res.qualified} "{name}" not found',
                    {"name": name, "kind": res.plural, **({"group": res.group} if res.group else {})})


@dataclass
class Fault:
    """An injected answer to the next ``times`` requests of ``method`` whose path holds ``part``."""

    method: str
    part: str
    code: int
    times: int = 1
    message: str | None = None
    hits: int = 0


FAULT_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
                 409: "Conflict", 410: "Expired", 422: "Invalid", 429: "TooManyRequests",
                 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


@dataclass
class Route:
    res: Res
    namespace: str | None
    name: str | None
    sub: str | None  # subresource path: "status", "log", "proxy/metrics", ...


def parse_route(path: str) -> Route | None:
    """``/api/v1[/namespaces/NS]/PLURAL[/NAME[/SUB]]`` or ``/apis/G/V/...``; None if not a resource."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, rest = "", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest:
        return None
    ns = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        ns, rest = rest[1], rest[2:]
    res = RESOURCES.get(rest[0])
    if res is None or res.group != group:
        return None
    name = rest[1] if len(rest) > 1 else None
    sub = "/".join(rest[2:]) or None
    if res.plural == "namespaces" and ns is not None:  # /api/v1/namespaces/NS/<unknown>
        return None
    return Route(res, ns if res.namespaced else None, name, sub)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: dicts merge recursively, None deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def watch_event(etype: str, obj: Obj, old: Obj | None, accept: Callable[[Obj], bool]) -> Obj | None:
    """The event a watcher with selector ``accept`` sees (label transitions become ADDED/DELETED)."""
    new_ok = accept(obj)
    old_ok = accept(old) if old is not None else False
    if etype == "ADDED":
        return {"type": "ADDED", "object": obj} if new_ok else None
    if etype == "DELETED":
        return {"type": "DELETED", "object": obj} if (new_ok or old_ok) else None
    if new_ok and old_ok:
        return {"type": "MODIFIED", "object": obj}
    if new_ok:
        return {"type": "ADDED", "object": obj}
    if old_ok:
        return {"type": "DELETED", "object": obj}
    return None


def body_of(request: kmock.Request, default: Any = None) -> Any:
    data = request.data
    if isinstance(data, dict):
        return copy.deepcopy(data)
    raw = request.body or b""
    if not raw.strip():
        if default is not None:
            return default
        raise ApiError(400, "BadRequest", "the request body is empty")
    try:
        out = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise ApiError(400, "BadRequest", f"error decoding YAML: {e}") from e
    if not isinstance(out, dict):
        raise ApiError(400, "BadRequest", "the body is not an object")
    return out


def conflict(res: Res, name: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {res.qualified} "{name}": the object '
                    "has been modified; please apply your changes to the latest version and try again",
                    {"name": name, "kind": res.plural})


VERBS = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def fault_error(f: Fault, request: kmock.Request, route: Route | None) -> ApiError:
    """The Status a real server would send for ``f.code`` on this request."""
    res = route.res if route else None
    name = route.name if route else None
    verb = VERBS.get(request.method.value, request.method.value.lower())
    if request.method.value == "GET" and route and not route.name:
        verb = "watch" if request.params.get("watch") == "true" else "list"
    reason = FAULT_REASONS.get(f.code, "InternalError")
    headers: dict[str, str] = {}
    if f.message:
        message = f.message
    elif f.code == 403 and res:
        where = f' in the namespace "{route.namespace}"' if route and route.namespace else " at the cluster scope"
        quoted = f' "{name}"' if name else ""
        message = (f'{res.qualified}{quoted} is forbidden: User '
                   f'"system:serviceaccount:orchestrator:orchestrator" cannot {verb} resource "{res.plural}" '
                   f'in API group "{res.group}"{where}')
    elif f.code == 409 and res:
        message = conflict(res, name or "").message
    elif f.code == 429:
        message = "the server has received too many requests and has asked us to try again later"
        headers["Retry-After"] = "1"
    elif f.code == 500:
        message = "Internal error occurred: injected fault"
    elif f.code == 503:
        message = "the server is currently unable to handle the request"
    else:
        message = f"injected {f.code}"
    return ApiError(f.code, reason, message, {"name": name or "", "kind": res.plural if res else ""}, headers)


def _proxy_params(request: kmock.Request) -> dict[str, str]:
    return dict(request.params or {})


def first_container_port(pod: Obj) -> int:
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            return int(p["containerPort"])
    return 80


def named_port(pod: Obj, port: str) -> int:
    if port.isdigit():
        return int(port)
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
    raise ApiError(503, "ServiceUnavailable", f"no such port {port!r} on the pod")


def matches(obj: Obj, labels: str | None) -> bool:
    return matches_labels((obj.get("metadata") or {}).get("labels") or {}, labels)
