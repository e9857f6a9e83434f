"""The control plane's controllers, one pass at a time: namespace deletion, the garbage
collector, the Deployment, ReplicaSet and Job controllers, the scheduler and the node lifecycle.

Deployments own ReplicaSets ``<deployment>-<pod-template-hash>`` which own the pods
``<replicaset>-<5 chars>`` (ownerReferences with ``controller: true``), as on a real cluster;
pods carry the template's labels plus ``pod-template-hash``. Both update strategies replace old
pods before new ones start (Recreate's behaviour). Pod creation can be refused by an injected
admission rule (Pod Security, quota): the ReplicaSet then gets ``ReplicaFailure`` /
``FailedCreate`` and a Warning event ``FailedCreate``, and the Deployment the same condition.

Jobs (``job``) own pods ``<job>-<5 chars>``: one at a time (parallelism and completions 1, the
only shape modelled), replaced while failures stay within ``backoffLimit``; a pod that
succeeded makes the Job ``SuccessCriteriaMet`` then ``Complete``; too many failures
(``BackoffLimitExceeded``) or ``activeDeadlineSeconds`` (``DeadlineExceeded``: its active pod is
deleted) make it ``FailureTarget`` then ``Failed`` once no pod runs (Kubernetes 1.31's order);
``ttlSecondsAfterFinished`` deletes a finished Job (Background: its pods go too).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import random
import time
from typing import TYPE_CHECKING, Any

from orchestrator.kcluster.objects import RESOURCES, ApiError, now
from orchestrator.kcluster.scheduler import schedule, untolerated_taint
from orchestrator.kcluster.selectors import quantity

if TYPE_CHECKING:
    from orchestrator.kcluster.cluster import EmulatedCluster

Obj = dict[str, Any]
SAFE = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery rand.SafeEncodeString's alphabet
HASH_LABEL = "pod-template-hash"


def safe_encode(data: bytes, length: int) -> str:
    n = int.from_bytes(hashlib.sha256(data).digest(), "big")
    out = ""
    for _ in range(length):
        n, r = divmod(n, len(SAFE))
        out += SAFE[r]
    return out


def template_hash(template: Obj) -> str:
    return safe_encode(json.dumps(template, sort_keys=True).encode(), 10)


def rand5(rng: random.Random) -> str:
    return "".join(rng.choice(SAFE) for _ in range(5))


def owner_uids(obj: Obj) -> list[str]:
    return [r.get("uid") for r in (obj.get("metadata") or {}).get("ownerReferences") or []]


def controller_uid(obj: Obj) -> str | None:
    for r in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if r.get("controller"):
            return r.get("uid")
    return None


def deleting(obj: Obj) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def is_ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def qos_class(spec: Obj) -> str:
    requests = limits = False
    guaranteed = True
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        requests = requests or bool(req)
        limits = limits or bool(lim)
        for k in ("cpu", "memory"):
            if k not in lim or quantity(req.get(k, lim.get(k))) != quantity(lim[k]):
                guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def pod_from_template(tpl: Obj, name: str, owner: Obj) -> Obj:
    """A Pending pod made from a workload's pod template, owned (as its controller) by `owner`."""
    meta = owner["metadata"]
    tpl_meta = tpl.get("metadata") or {}
    pod_spec = copy.deepcopy(tpl.get("spec") or {})
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "generateName": f"{meta['name']}-", "namespace": meta["namespace"],
                     "labels": dict(tpl_meta.get("labels") or {}),
                     "annotations": dict(tpl_meta.get("annotations") or {}),
                     "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"],
                                          "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
        "spec": pod_spec,
        "status": {"phase": "Pending", "qosClass": qos_class(pod_spec)},
    }


def merge_conditions(old: list[Obj], new: list[Obj], with_update_time: bool = False) -> list[Obj]:
    """``new`` conditions keeping the transition (and update) times of unchanged ones."""
    before = {c.get("type"): c for c in old or []}
    out = []
    stamp = now()
    for c in new:
        prev = before.get(c["type"])
        c = dict(c)
        if prev is not None and prev.get("status") == c["status"]:
            c["lastTransitionTime"] = prev.get("lastTransitionTime", stamp)
        else:
            c["lastTransitionTime"] = stamp
        if with_update_time:
            same = prev is not None and all(prev.get(k) == c.get(k) for k in ("status", "reason", "message"))
            c["lastUpdateTime"] = prev.get("lastUpdateTime", stamp) if prev is not None and same else stamp
        out.append(c)
    return out


class Controllers:
    """The controller manager and the scheduler, stepped by the cluster's loop."""

    def __init__(self, cluster: EmulatedCluster):
        self.c = cluster
        self.api = cluster.apiserver
        self.rng = random.Random(7)
        self._sched_msgs: dict[str, str] = {}  # pod uid -> last FailedScheduling message
        self._job_clock: dict[str, tuple[float, float | None]] = {}  # job uid -> (started, finished), monotonic

    def sync(self) -> None:
        self.namespaces()
        self.garbage_collector()
        self.node_lifecycle()
        for dep in self.api.obj_list("deployments"):
            if not deleting(dep):
                self.deployment(dep)
        for rs in self.api.obj_list("replicasets"):
            if not deleting(rs):
                self.replicaset(rs)
        for job in self.api.obj_list("jobs"):
            if not deleting(job):
                self.job(job)
        self.scheduler()
        for dep in self.api.obj_list("deployments"):
            self.deployment_status(dep)

    # -- deletion --------------------------------------------------------------------------------

    def namespaces(self) -> None:
        for ns in self.api.obj_list("namespaces"):
            if not deleting(ns):
                continue
            name = ns["metadata"]["name"]
            contents = [(p, n) for (p, nsn, n) in list(self.api.store.objects) if nsn == name and RESOURCES[p].namespaced]
            for plural, n in contents:
                obj = self.api.obj_get(plural, name, n)
                if obj is not None and not deleting(obj):
                    self.api.obj_delete(plural, name, n)
            if not contents:
                self.api.obj_remove("namespaces", None, name)

    def garbage_collector(self) -> None:
        objects = self.api.store.objects
        uids = {(o.get("metadata") or {}).get("uid") for o in objects.values()}
        for (plural, ns, name), obj in list(objects.items()):
            meta = obj.get("metadata") or {}
            refs = owner_uids(obj)
            if refs and not any(u in uids for u in refs) and not deleting(obj):
                with contextlib.suppress(ApiError):
                    self.api.obj_delete(plural, ns, name, "Background")
            if deleting(obj) and "foregroundDeletion" in (meta.get("finalizers") or []):
                deps = [(k, o) for k, o in objects.items() if meta.get("uid") in owner_uids(o)]
                if not deps:
                    self.api.obj_remove(plural, ns, name)
                for (dp, dns, dn), o in deps:
                    if not deleting(o):
                        self.api.obj_delete(dp, dns, dn, "Background")

    def node_lifecycle(self) -> None:
        nodes = {n["metadata"]["name"]: n for n in self.api.obj_list("nodes")}
        for pod in self.api.obj_list("pods"):
            node_name = (pod.get("spec") or {}).get("nodeName")
            if not node_name or deleting(pod):
                continue
            meta = pod["metadata"]
            node = nodes.get(node_name)
            if node is None:  # the node went away: its pods are garbage (pod GC)
                self.api.obj_delete("pods", meta["namespace"], meta["name"], grace_s=0)
                continue
            taint = untolerated_taint(pod, {"spec": {"taints": [
                t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") == "NoExecute"]}})
            if taint is not None:
                self.api.record_event(pod, "TaintManagerEviction",
                                      f"Marking for deletion Pod {meta['namespace']}/{meta['name']}",
                                      component="taint-eviction-controller")
                self.api.obj_delete("pods", meta["namespace"], meta["name"])

    # -- deployments and replica sets ------------------------------------------------------------

    def _owned(self, plural: str, namespace: str, uid: str) -> list[Obj]:
        return [o for o in self.api.obj_list(plural, namespace) if controller_uid(o) == uid]

    def deployment(self, dep: Obj) -> None:
        meta, spec = dep["metadata"], dep.get("spec") or {}
        ns = meta["namespace"]
        tpl = spec.get("template") or {}
        h = template_hash(tpl)
        desired = int(spec.get("replicas", 1))
        rss = self._owned("replicasets", ns, meta["uid"])
        current = next((r for r in rss if (r["metadata"].get("labels") or {}).get(HASH_LABEL) == h), None)
        old = [r for r in rss if r is not current]
        old_pods = [p for r in old for p in self._owned("pods", ns, r["metadata"]["uid"])]
        for r in old:
            if (r.get("spec") or {}).get("replicas", 0) != 0:
                r = copy.deepcopy(r)
                r["spec"]["replicas"] = 0
                self.api.obj_put(r, "replicasets")
        target = 0 if old_pods else desired
        revision = str(1 + max([int((r["metadata"].get("annotations") or {}).get(
            "deployment.kubernetes.io/revision", "0")) for r in rss] or [0]))
        if current is None:
            if self.api.terminating(ns):  # a namespace being deleted takes no new content
                return
            name = f"{meta['name']}-{h}"
            labels = {**((tpl.get("metadata") or {}).get("labels") or {}), HASH_LABEL: h}
            template = copy.deepcopy(tpl)
            template.setdefault("metadata", {})["labels"] = labels
            selector = copy.deepcopy(spec.get("selector") or {})
            selector.setdefault("matchLabels", {})[HASH_LABEL] = h
            self.api.obj_create({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": name, "namespace": ns, "labels": labels,
                             "annotations": {"deployment.kubernetes.io/desired-replicas": str(desired),
                                             "deployment.kubernetes.io/max-replicas": str(desired),
                                             "deployment.kubernetes.io/revision": revision},
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                                  "name": meta["name"], "uid": meta["uid"],
                                                  "controller": True, "blockOwnerDeletion": True}]},
                "spec": {"replicas": target, "selector": selector, "template": template},
                "status": {"replicas": 0},
            }, "replicasets")
            self.api.record_event(dep, "ScalingReplicaSet", f"Scaled up replica set {name} from 0 to {target}",
                                  component="deployment-controller")
            ann = copy.deepcopy(dep)
            ann["metadata"].setdefault("annotations", {})["deployment.kubernetes.io/revision"] = revision
            self.api.obj_put(ann, "deployments")
        elif (current.get("spec") or {}).get("replicas") != target:
            before = current["spec"].get("replicas", 0)
            current = copy.deepcopy(current)
            current["spec"]["replicas"] = target
            self.api.obj_put(current, "replicasets")
            verb = "up" if target > before else "down"
            self.api.record_event(dep, "ScalingReplicaSet", f"Scaled {verb} replica set "
                                  f"{current['metadata']['name']} from {before} to {target}",
                                  component="deployment-controller")

    def replicaset(self, rs: Obj) -> None:
        meta, spec = rs["metadata"], rs.get("spec") or {}
        ns = meta["namespace"]
        pods = [p for p in self._owned("pods", ns, meta["uid"]) if not deleting(p)]
        want = int(spec.get("replicas", 1))
        failure = None
        if len(pods) < want:
            tpl = spec.get("template") or {}
            for _ in range(want - len(pods)):
                name = f"{meta['name']}-{rand5(self.rng)}"
                refusal = self.c.admission_refusal(ns, meta["name"], tpl)
                if refusal is not None:
                    failure = refusal
                    self.api.record_event(rs, "FailedCreate", f"Error creating: {refusal}", "Warning",
                                          component="replicaset-controller")
                    break
                try:
                    self.api.obj_create(pod_from_template(tpl, name, rs), "pods")
                except ApiError as e:  # the namespace is being terminated
                    failure = e.message
                    self.api.record_event(rs, "FailedCreate", f"Error creating: {e.message}", "Warning",
                                          component="replicaset-controller")
                    break
                self.api.record_event(rs, "SuccessfulCreate", f"Created pod: {name}", component="replicaset-controller")
        elif len(pods) > want:
            victims = sorted(pods, key=lambda p: (is_ready(p), bool(p["spec"].get("nodeName")),
                                                  p["metadata"].get("creationTimestamp", "")))
            for p in victims[: len(pods) - want]:
                self.api.obj_delete("pods", ns, p["metadata"]["name"])
                self.api.record_event(rs, "SuccessfulDelete", f"Deleted pod: {p['metadata']['name']}",
                                      component="replicaset-controller")
        pods = [p for p in self._owned("pods", ns, meta["uid"]) if not deleting(p)]
        old_status = rs.get("status") or {}
        conds = [c for c in old_status.get("conditions") or [] if c.get("type") != "ReplicaFailure"]
        if failure is not None:
            conds.append({"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": failure})
        elif len(pods) < want and any(c.get("type") == "ReplicaFailure" for c in old_status.get("conditions") or []):
            conds = old_status.get("conditions") or []  # still short: the failure stands
        ready = sum(is_ready(p) for p in pods)
        status = {"replicas": len(pods), "fullyLabeledReplicas": len(pods), "readyReplicas": ready,
                  "availableReplicas": ready, "observedGeneration": meta.get("generation", 1)}
        if conds:
            status["conditions"] = merge_conditions(old_status.get("conditions") or [], conds)
        if status != old_status:
            rs = copy.deepcopy(rs)
            rs["status"] = status
            self.api.obj_put(rs, "replicasets")

    def deployment_status(self, dep: Obj) -> None:
        meta, spec = dep["metadata"], dep.get("spec") or {}
        ns = meta["namespace"]
        desired = int(spec.get("replicas", 1))
        h = template_hash(spec.get("template") or {})
        rss = self._owned("replicasets", ns, meta["uid"])
        current = next((r for r in rss if (r["metadata"].get("labels") or {}).get(HASH_LABEL) == h), None)
        pods = [p for r in rss for p in self._owned("pods", ns, r["metadata"]["uid"]) if not deleting(p)]
        cur_pods = [p for p in pods if current and controller_uid(p) == current["metadata"]["uid"]]
        ready = sum(is_ready(p) for p in pods)
        strategy = (spec.get("strategy") or {})
        max_unavailable = 0
        if strategy.get("type", "RollingUpdate") == "RollingUpdate":
            mu = str((strategy.get("rollingUpdate") or {}).get("maxUnavailable", "25%"))
            max_unavailable = int(desired * int(mu[:-1]) / 100) if mu.endswith("%") else int(mu)
        available_ok = ready >= desired - max_unavailable
        rs_name = current["metadata"]["name"] if current else f"{meta['name']}-{h}"
        complete = len(cur_pods) == desired and sum(is_ready(p) for p in cur_pods) == desired and len(pods) == desired
        conds = [
            {"type": "Available", "status": "True" if available_ok else "False",
             "reason": "MinimumReplicasAvailable" if available_ok else "MinimumReplicasUnavailable",
             "message": "Deployment has minimum availability." if available_ok
             else "Deployment does not have minimum availability."},
            {"type": "Progressing", "status": "True",
             "reason": "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
             "message": f'ReplicaSet "{rs_name}" has successfully progressed.' if complete
             else f'ReplicaSet "{rs_name}" is progressing.'},
        ]
        failure = next((c for c in ((current or {}).get("status") or {}).get("conditions") or []
                        if c.get("type") == "ReplicaFailure" and c.get("status") == "True"), None)
        if failure is not None:
            conds.append({"type": "ReplicaFailure", "status": "True", "reason": failure.get("reason"),
                          "message": failure.get("message")})
        old_status = dep.get("status") or {}
        status = {"observedGeneration": meta.get("generation", 1), "replicas": len(pods),
                  "updatedReplicas": len(cur_pods), "readyReplicas": ready, "availableReplicas": ready,
                  "unavailableReplicas": max(desired - ready, 0),
                  "conditions": merge_conditions(old_status.get("conditions") or [], conds, with_update_time=True)}
        for k in ("readyReplicas", "availableReplicas", "unavailableReplicas"):
            if not status[k]:
                del status[k]  # the API server omits zero counts
        if status != old_status:
            dep = copy.deepcopy(dep)
            dep["status"] = status
            self.api.obj_put(dep, "deployments")

    # -- jobs ------------------------------------------------------------------------------------

    def job(self, job: Obj) -> None:
        meta, spec = job["metadata"], job.get("spec") or {}
        ns, uid = meta["namespace"], meta["uid"]
        old_status = job.get("status") or {}
        conds = {c["type"]: c for c in old_status.get("conditions") or []}
        t = time.monotonic()
        started, finished = self._job_clock.setdefault(uid, (t, None))
        if "Complete" in conds or "Failed" in conds:
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None and finished is not None and t - finished >= float(ttl):
                self.api.obj_delete("jobs", ns, meta["name"], "Background")
                self._job_clock.pop(uid, None)
            return
        pods = self._owned("pods", ns, uid)
        phase = [(p.get("status") or {}).get("phase") for p in pods]
        succeeded, failed = phase.count("Succeeded"), phase.count("Failed")
        active = [p for p, ph in zip(pods, phase, strict=True) if ph not in ("Succeeded", "Failed") and not deleting(p)]
        target = conds.get("FailureTarget") or conds.get("SuccessCriteriaMet")
        deadline = spec.get("activeDeadlineSeconds")
        if target is None:
            if succeeded >= int(spec.get("completions", 1)):
                target = {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
                          "message": "Reached expected number of succeeded pods"}
            elif failed > int(spec.get("backoffLimit", 6)):
                target = {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
                          "message": "Job has reached the specified backoff limit"}
            elif deadline is not None and t - started >= float(deadline):
                target = {"type": "FailureTarget", "status": "True", "reason": "DeadlineExceeded",
                          "message": "Job was active longer than specified deadline"}
            if target is not None and target["type"] == "FailureTarget":
                for p in active:
                    self.api.obj_delete("pods", ns, p["metadata"]["name"])
                self.api.record_event(job, target["reason"], target["message"], "Warning", component="job-controller")
        if target is None and not active:
            self._job_pod(job)
        new_conds = [target] if target is not None else []
        running = [p for p, ph in zip(pods, phase, strict=True) if ph not in ("Succeeded", "Failed")
                   and self.api.obj_get("pods", ns, p["metadata"]["name"]) is not None]
        if target is not None and not running:  # the end, once no pod of the Job runs
            final = "Complete" if target["type"] == "SuccessCriteriaMet" else "Failed"
            new_conds.append({**target, "type": final})
            self._job_clock[uid] = (started, t)
            if final == "Complete":
                self.api.record_event(job, "Completed", "Job completed", component="job-controller")
        status: Obj = {"startTime": old_status.get("startTime") or now(), "active": len(active),
                       "succeeded": succeeded, "failed": failed, "ready": sum(is_ready(p) for p in active),
                       "uncountedTerminatedPods": {}}
        for k in ("active", "succeeded", "failed"):
            if not status[k]:
                del status[k]  # the API server omits zero counts
        if new_conds:
            status["conditions"] = merge_conditions(old_status.get("conditions") or [], new_conds)
        if any(c["type"] == "Complete" for c in new_conds):
            status["completionTime"] = now()
        if status != old_status:
            job = copy.deepcopy(job)
            job["status"] = status
            self.api.obj_put(job, "jobs")

    def _job_pod(self, job: Obj) -> None:
        meta = job["metadata"]
        ns = meta["namespace"]
        tpl = (job.get("spec") or {}).get("template") or {}
        refusal = self.c.admission_refusal(ns, meta["name"], tpl)
        if refusal is not None:
            self.api.record_event(job, "FailedCreate", f"Error creating: {refusal}", "Warning", component="job-controller")
            return
        name = f"{meta['name']}-{rand5(self.rng)}"
        try:
            self.api.obj_create(pod_from_template(tpl, name, job), "pods")
        except ApiError as e:  # the namespace is being terminated
            self.api.record_event(job, "FailedCreate", f"Error creating: {e.message}", "Warning", component="job-controller")
            return
        self.api.record_event(job, "SuccessfulCreate", f"Created pod: {name}", component="job-controller")

    # -- the scheduler ---------------------------------------------------------------------------

    def scheduler(self) -> None:
        pods = self.api.obj_list("pods")
        pending = [p for p in pods if not (p.get("spec") or {}).get("nodeName") and not deleting(p)]
        if not pending:
            return
        nodes = self.api.obj_list("nodes")
        bound: dict[str, list[Obj]] = {}
        for p in pods:
            n = (p.get("spec") or {}).get("nodeName")
            if n:
                bound.setdefault(n, []).append(p)
        pending.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
        for pod in pending:
            meta = pod["metadata"]

            def claim_state(name: str, ns: str = meta["namespace"]) -> str | None:
                pvc = self.api.obj_get("persistentvolumeclaims", ns, name)
                return None if pvc is None else (pvc.get("status") or {}).get("phase", "Pending")

            node, message = schedule(pod, nodes, bound, claim_state)
            new = copy.deepcopy(pod)
            status = new.setdefault("status", {})
            if node is not None:
                new["spec"]["nodeName"] = node
                status["conditions"] = [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                         "lastTransitionTime": now()}]
                status["phase"] = "Pending"
                self.api.obj_put(new, "pods")
                bound.setdefault(node, []).append(new)
                self._sched_msgs.pop(meta["uid"], None)
                self.api.record_event(new, "Scheduled", f"Successfully assigned {meta['namespace']}/"
                                      f"{meta['name']} to {node}", component="default-scheduler")
                continue
            status["phase"] = "Pending"
            status["conditions"] = merge_conditions(status.get("conditions") or [], [
                {"type": "PodScheduled", "status": "False", "lastProbeTime": None,
                 "reason": "Unschedulable", "message": message}])
            if new != pod:
                self.api.obj_put(new, "pods")
            if self._sched_msgs.get(meta["uid"]) != message:
                self._sched_msgs[meta["uid"]] = message or ""
                self.api.record_event(new, "FailedScheduling", message or "", "Warning",
                                      component="default-scheduler")
