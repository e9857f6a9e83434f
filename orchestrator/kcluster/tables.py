"""Server-side printing: the ``meta.k8s.io/v1`` Table a real API server answers when a client
(kubectl get) asks for ``application/json;as=Table;v=v1;g=meta.k8s.io``, with the columns of
the real printers for nodes, pods, namespaces, Deployments, ReplicaSets, Services, ConfigMaps,
Jobs and Events (Name and Age for the rest), ages written as kubectl writes them (``5m10s``)."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]
Column = tuple[str, str, int]  # name, type, priority (1: -o wide only)


def wants_table(accept: str | None) -> bool:
    return "as=Table" in (accept or "")


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery's duration.HumanDuration."""
    s = int(max(seconds, 0))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{h // 24}d{h % 24}h" if h % 24 else f"{h // 24}d"
    if h < 24 * 365 * 2:
        return f"{h // 24}d"
    return f"{h // (24 * 365)}y"


def age(stamp: str | None) -> str:
    if not stamp:
        return "<unknown>"
    then = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return human_duration((datetime.datetime.now(datetime.UTC) - then).total_seconds())


def _meta(o: Obj) -> Obj:
    return o.get("metadata") or {}


def _pod_status(p: Obj) -> str:
    status = p.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Unknown"
    running = False
    for cs in reversed(status.get("containerStatuses") or []):
        state = cs.get("state") or {}
        if (state.get("waiting") or {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif state.get("terminated"):
            t = state["terminated"]
            reason = t.get("reason") or (f"Signal:{t['signal']}" if t.get("signal") else f"ExitCode:{t.get('exitCode')}")
        elif state.get("running") and cs.get("ready"):
            running = True
    if reason == "Completed" and running:
        reason = "Running"
    if _meta(p).get("deletionTimestamp"):
        reason = "Terminating"
    return str(reason)


def _pod_row(p: Obj) -> list[Any]:
    st = p.get("status") or {}
    css = st.get("containerStatuses") or []
    total = len((p.get("spec") or {}).get("containers") or [])
    restarts = sum(int(c.get("restartCount", 0)) for c in css)
    return [_meta(p).get("name"), f"{sum(bool(c.get('ready')) for c in css)}/{total}", _pod_status(p), restarts,
            age(_meta(p).get("creationTimestamp")), st.get("podIP") or "<none>",
            (p.get("spec") or {}).get("nodeName") or "<none>", "<none>", "<none>"]


def _node_row(n: Obj) -> list[Any]:
    st = n.get("status") or {}
    ready: Obj = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), {})
    status = "Ready" if ready.get("status") == "True" else "NotReady"
    if (n.get("spec") or {}).get("unschedulable"):
        status += ",SchedulingDisabled"
    roles = sorted(k.split("/", 1)[1] for k in (_meta(n).get("labels") or {})
                   if k.startswith("node-role.kubernetes.io/"))
    info = st.get("nodeInfo") or {}
    ips = {a.get("type"): a.get("address") for a in st.get("addresses") or []}
    return [_meta(n).get("name"), status, ",".join(roles) or "<none>", age(_meta(n).get("creationTimestamp")),
            info.get("kubeletVersion", ""), ips.get("InternalIP", "<none>"), ips.get("ExternalIP", "<none>"),
            info.get("osImage", ""), info.get("kernelVersion", ""), info.get("containerRuntimeVersion", "")]


def _deployment_row(d: Obj) -> list[Any]:
    st, spec = d.get("status") or {}, d.get("spec") or {}
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    return [_meta(d).get("name"), f"{st.get('readyReplicas', 0)}/{spec.get('replicas', 1)}",
            st.get("updatedReplicas", 0), st.get("availableReplicas", 0), age(_meta(d).get("creationTimestamp")),
            ",".join(c.get("name", "") for c in containers), ",".join(c.get("image", "") for c in containers),
            ",".join(f"{k}={v}" for k, v in labels.items())]


def _replicaset_row(r: Obj) -> list[Any]:
    st, spec = r.get("status") or {}, r.get("spec") or {}
    return [_meta(r).get("name"), spec.get("replicas", 0), st.get("replicas", 0), st.get("readyReplicas", 0),
            age(_meta(r).get("creationTimestamp"))]


def _service_row(s: Obj) -> list[Any]:
    spec = s.get("spec") or {}
    ports = ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in spec.get("ports") or [])
    selector = ",".join(f"{k}={v}" for k, v in (spec.get("selector") or {}).items())
    return [_meta(s).get("name"), spec.get("type", "ClusterIP"), spec.get("clusterIP") or "<none>", "<none>",
            ports or "<none>", age(_meta(s).get("creationTimestamp")), selector or "<none>"]


def _job_row(j: Obj) -> list[Any]:
    st, spec = j.get("status") or {}, j.get("spec") or {}
    conds = {c.get("type") for c in st.get("conditions") or [] if c.get("status") == "True"}
    status = "Complete" if "Complete" in conds else "Failed" if "Failed" in conds else "Running"
    return [_meta(j).get("name"), status, f"{st.get('succeeded', 0)}/{spec.get('completions', 1)}", "",
            age(_meta(j).get("creationTimestamp"))]


def _event_row(e: Obj) -> list[Any]:
    inv = e.get("involvedObject") or {}
    return [age(e.get("lastTimestamp") or _meta(e).get("creationTimestamp")), e.get("type", ""),
            e.get("reason", ""), f"{str(inv.get('kind', '')).lower()}/{inv.get('name', '')}", e.get("message", "")]


S, INT = "string", "integer"
PRINTERS: dict[str, tuple[list[Column], Callable[[Obj], list[Any]]]] = {
    "pods": ([("Name", S, 0), ("Ready", S, 0), ("Status", S, 0), ("Restarts", INT, 0), ("Age", S, 0),
              ("IP", S, 1), ("Node", S, 1), ("Nominated Node", S, 1), ("Readiness Gates", S, 1)], _pod_row),
    "nodes": ([("Name", S, 0), ("Status", S, 0), ("Roles", S, 0), ("Age", S, 0), ("Version", S, 0),
               ("Internal-IP", S, 1), ("External-IP", S, 1), ("OS-Image", S, 1), ("Kernel-Version", S, 1),
               ("Container-Runtime", S, 1)], _node_row),
    "namespaces": ([("Name", S, 0), ("Status", S, 0), ("Age", S, 0)],
                   lambda o: [_meta(o).get("name"), (o.get("status") or {}).get("phase", ""),
                              age(_meta(o).get("creationTimestamp"))]),
    "deployments": ([("Name", S, 0), ("Ready", S, 0), ("Up-to-date", INT, 0), ("Available", INT, 0), ("Age", S, 0),
                     ("Containers", S, 1), ("Images", S, 1), ("Selector", S, 1)], _deployment_row),
    "replicasets": ([("Name", S, 0), ("Desired", INT, 0), ("Current", INT, 0), ("Ready", INT, 0), ("Age", S, 0)],
                    _replicaset_row),
    "services": ([("Name", S, 0), ("Type", S, 0), ("Cluster-IP", S, 0), ("External-IP", S, 0),
                  ("Port(s)", S, 0), ("Age", S, 0), ("Selector", S, 1)], _service_row),
    "configmaps": ([("Name", S, 0), ("Data", INT, 0), ("Age", S, 0)],
                   lambda o: [_meta(o).get("name"), len(o.get("data") or {}) + len(o.get("binaryData") or {}),
                              age(_meta(o).get("creationTimestamp"))]),
    "jobs": ([("Name", S, 0), ("Status", S, 0), ("Completions", S, 0), ("Duration", S, 0), ("Age", S, 0)], _job_row),
    "events": ([("Last Seen", S, 0), ("Type", S, 0), ("Reason", S, 0), ("Object", S, 0), ("Message", S, 0)],
               _event_row),
}
DEFAULT: tuple[list[Column], Callable[[Obj], list[Any]]] = (
    [("Name", S, 0), ("Age", S, 0)], lambda o: [_meta(o).get("name"), age(_meta(o).get("creationTimestamp"))])


def table(plural: str, items: list[Obj], resource_version: str) -> Obj:
    """The Table of ``items``; each row carries the object's metadata (PartialObjectMetadata),
    which kubectl reads for the NAMESPACE column of ``-A``."""
    columns, row = PRINTERS.get(plural, DEFAULT)
    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [{"name": n, "type": t, "format": "name" if n == "Name" else "", "description": "",
                               "priority": p} for n, t, p in columns],
        "rows": [{"cells": row(o), "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                              "metadata": _meta(o)}} for o in items],
    }
