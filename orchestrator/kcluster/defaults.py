"""What the API server fills in when it admits an object: defaults of namespaces, Services
(clusterIP), Deployments, Jobs (their selector and generated pod labels), pods and claims."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.kcluster.objects import ApiError, Obj


def apply_defaults(plural: str, obj: Obj, allocate_cluster_ip: Callable[[Obj], str | None]) -> None:
    """The fields the API server defaults on creation (a Service's clusterIP from ``allocate_cluster_ip``)."""
    spec: Any = obj.setdefault("spec", {}) if plural not in ("configmaps", "secrets", "events",
                                                             "serviceaccounts", "roles", "rolebindings",
                                                             "clusterroles", "clusterrolebindings",
                                                             "endpoints") else None
    if plural == "namespaces":
        spec.setdefault("finalizers", ["kubernetes"])
        obj["status"] = {"phase": "Active"}
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
    elif plural == "services":
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for p in spec.get("ports") or []:
            p.setdefault("protocol", "TCP")
            p.setdefault("targetPort", p.get("port"))
        if spec.get("clusterIP") in (None, ""):
            ip = allocate_cluster_ip(obj)
            if ip:
                spec["clusterIP"] = ip
        if spec.get("clusterIP"):
            spec["clusterIPs"] = [spec["clusterIP"]]
        obj.setdefault("status", {"loadBalancer": {}})
    elif plural == "deployments":
        spec.setdefault("replicas", 1)
        spec.setdefault("strategy", {"type": "RollingUpdate",
                                     "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        obj.setdefault("status", {})
    elif plural == "jobs":
        job_defaults(obj)
    elif plural == "pods":
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("serviceAccountName", "default")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        obj.setdefault("status", {"phase": "Pending", "qosClass": "Burstable"})
    elif plural == "persistentvolumeclaims":
        # A dynamic provisioner binds at once (volumeBindingMode Immediate).
        spec.setdefault("accessModes", ["ReadWriteOnce"])
        spec.setdefault("volumeName", f"pvc-{obj['metadata']['uid']}")
        size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "100Gi")
        obj["status"] = {"phase": "Bound", "accessModes": spec["accessModes"], "capacity": {"storage": size}}


def job_defaults(job: Obj) -> None:
    """A Job as the API server admits it: defaults, the selector and pod labels it generates
    (``batch.kubernetes.io/controller-uid``, ``job-name``), a restartPolicy it accepts."""
    meta, spec = job["metadata"], job["spec"]
    tpl_spec = (spec.get("template") or {}).get("spec") or {}
    if tpl_spec.get("restartPolicy") not in ("Never", "OnFailure"):
        raise ApiError(422, "Invalid", f'Job.batch "{meta["name"]}" is invalid: spec.template.spec.restartPolicy: '
                       f'Required value: valid values: "OnFailure", "Never"')
    for k, v in (("backoffLimit", 6), ("completions", 1), ("parallelism", 1), ("completionMode", "NonIndexed"),
                 ("suspend", False), ("manualSelector", False)):
        spec.setdefault(k, v)
    uid, name = meta["uid"], meta["name"]
    generated = {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
                 "controller-uid": uid, "job-name": name}
    spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    tpl_meta = spec["template"].setdefault("metadata", {})
    tpl_meta["labels"] = {**(tpl_meta.get("labels") or {}), **generated}
    job.setdefault("status", {})
