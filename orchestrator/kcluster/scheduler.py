"""The scheduler's decisions and words: which node a pod fits, and, when none, the message
kube-scheduler writes into PodScheduled (and the FailedScheduling event).

Filters in kube-scheduler's order, the first failing one naming a node's reason:
NodeUnschedulable, TaintToleration, NodeAffinity (nodeSelector and required node affinity),
NodeResourcesFit (every short resource is a reason), InterPodAffinity (required terms). Before them, VolumeBinding's PreFilter:
a missing or unbound PersistentVolumeClaim fails the pod on every node at once.
Among feasible nodes the least allocated one wins (kube-scheduler's default scoring).
The real message's "preemption: ..." suffix is left out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from orchestrator.kcluster.selectors import match_expression, match_label_selector_object, quantity

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def pod_requests(pod: Obj) -> dict[str, float]:
    """Requests of the pod's containers, summed (extended resources default to their limits)."""
    out: dict[str, float] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        req = dict(res.get("requests") or {})
        for k, v in (res.get("limits") or {}).items():
            if "/" in k and k not in req:  # extended resource: request = limit
                req[k] = v
        for k, v in req.items():
            out[k] = out.get(k, 0.0) + quantity(v)
    out["pods"] = 1.0
    return out


def tolerates(tolerations: Iterable[Obj], taint: Obj) -> bool:
    """Kubernetes' ToleratesTaint over a pod's tolerations."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        key = t.get("key") or ""
        if not key:
            if op == "Exists":
                return True
            continue
        if key != taint.get("key"):
            continue
        if op == "Exists" or (op == "Equal" and (t.get("value") or "") == (taint.get("value") or "")):
            return True
    return False


def untolerated_taint(pod: Obj, node: Obj) -> Obj | None:
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in BLOCKING_EFFECTS and not tolerates(tolerations, taint):
            return taint
    return None


def matches_node(pod: Obj, node: Obj) -> bool:
    """nodeSelector and requiredDuringScheduling node affinity (terms ORed, expressions ANDed)."""
    spec = pod.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is None:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}
    for term in required.get("nodeSelectorTerms") or []:
        exprs = term.get("matchExpressions") or []
        fexprs = term.get("matchFields") or []
        if not exprs and not fexprs:
            continue
        if all(match_expression(labels, e) for e in exprs) and all(match_expression(fields, e) for e in fexprs):
            return True
    return False


def free_resources(node: Obj, bound: Iterable[Obj]) -> dict[str, float]:
    """What is left on ``node`` after the requests of the pods ``bound`` to it."""
    alloc = {k: quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
    for pod in bound:
        for k, v in pod_requests(pod).items():
            alloc[k] = alloc.get(k, 0.0) - v
    return alloc


def node_reasons(pod: Obj, node: Obj, bound: list[Obj]) -> list[str]:
    """Why ``pod`` cannot go on ``node`` (empty: it fits)."""
    if (node.get("spec") or {}).get("unschedulable"):
        return ["node(s) were unschedulable"]
    taint = untolerated_taint(pod, node)
    if taint is not None:
        return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"]
    if not matches_node(pod, node):
        return ["node(s) didn't match Pod's node affinity/selector"]
    free = free_resources(node, bound)
    short = []
    for k, v in pod_requests(pod).items():
        if v <= 0:
            continue
        if k == "pods":
            if free.get("pods", 110.0) < 1:
                short.append("Too many pods")
        elif free.get(k, 0.0) < v - 1e-9:
            short.append(f"Insufficient {k}")
    return short


# -- inter-pod affinity (InterPodAffinity: required terms only, as kube-scheduler filters) ------


def _terms(pod: Obj, kind: str) -> list[Obj]:
    aff = ((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {}
    return list(aff.get("requiredDuringSchedulingIgnoredDuringExecution") or [])


def _term_matches(term: Obj, owner: Obj, other: Obj) -> bool:
    """Whether ``other`` is a pod ``owner``'s term selects: its labelSelector, in the term's
    namespaces (default: the owner's; namespaceSelector is not modelled)."""
    ns = (owner.get("metadata") or {}).get("namespace")
    if (other.get("metadata") or {}).get("namespace") not in (term.get("namespaces") or [ns]):
        return False
    labels = (other.get("metadata") or {}).get("labels") or {}
    return match_label_selector_object(labels, term.get("labelSelector") or {})


def _domain(node: Obj, key: str) -> str | None:
    return ((node.get("metadata") or {}).get("labels") or {}).get(key)


def _in_domain(term: Obj, node: Obj, nodes: list[Obj], bound_by_node: dict[str, list[Obj]]) -> list[Obj]:
    """The pods on nodes in ``node``'s domain of the term's topologyKey."""
    key = term.get("topologyKey") or ""
    value = _domain(node, key)
    if value is None:
        return []
    return [p for n in nodes if _domain(n, key) == value for p in bound_by_node.get(n["metadata"]["name"], [])]


def inter_pod_reasons(pod: Obj, node: Obj, nodes: list[Obj], bound_by_node: dict[str, list[Obj]]) -> list[str]:
    """Why ``pod`` may not go on ``node`` by inter-pod (anti-)affinity, in kube-scheduler's words:
    its required affinity terms (a term no pod anywhere matches is met when the pod matches it
    itself: the first of a group), its required anti-affinity terms, and the existing pods'
    required anti-affinity towards it."""
    everyone = [p for ps in bound_by_node.values() for p in ps]
    for term in _terms(pod, "podAffinity"):
        near = [p for p in _in_domain(term, node, nodes, bound_by_node) if _term_matches(term, pod, p)]
        first = not any(_term_matches(term, pod, p) for p in everyone) and _term_matches(term, pod, pod)
        if not near and not (first and _domain(node, term.get("topologyKey") or "") is not None):
            return ["node(s) didn't match pod affinity rules"]
    for term in _terms(pod, "podAntiAffinity"):
        if any(_term_matches(term, pod, p) for p in _in_domain(term, node, nodes, bound_by_node)):
            return ["node(s) didn't match pod anti-affinity rules"]
    for other in nodes:
        for p in bound_by_node.get(other["metadata"]["name"], []):
            for term in _terms(p, "podAntiAffinity"):
                key = term.get("topologyKey") or ""
                if (_domain(other, key) is not None and _domain(other, key) == _domain(node, key)
                        and _term_matches(term, p, pod)):
                    return ["node(s) didn't satisfy existing pods anti-affinity rules"]
    return []


def schedule(pod: Obj, nodes: list[Obj], bound_by_node: dict[str, list[Obj]],
             claim_state: Callable[[str], str | None]) -> tuple[str | None, str | None]:
    """``(node name, None)`` or ``(None, the scheduler's message)``.

    ``claim_state(name)``: the claim's phase (``Bound``, ``Pending``) or None if it does not exist."""
    n = len(nodes)
    for vol in (pod.get("spec") or {}).get("volumes") or []:
        claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
        if not claim:
            continue
        phase = claim_state(claim)
        if phase is None:
            return None, f'0/{n} nodes are available: persistentvolumeclaim "{claim}" not found.'
        if phase != "Bound":
            return None, f"0/{n} nodes are available: pod has unbound immediate PersistentVolumeClaims."
    if n == 0:
        return None, "no nodes available to schedule pods"
    reasons: Counter[str] = Counter()
    feasible: list[tuple[float, str]] = []
    for node in nodes:
        name = node["metadata"]["name"]
        bound = bound_by_node.get(name, [])
        why = node_reasons(pod, node, bound) or inter_pod_reasons(pod, node, nodes, bound_by_node)
        if why:
            reasons.update(why)
            continue
        alloc = {k: quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
        free = free_resources(node, [*bound, pod])
        share = [free.get(k, 0.0) / alloc[k] for k in ("cpu", "memory") if alloc.get(k)]
        feasible.append((-(sum(share) / len(share)) if share else 0.0, name))
    if feasible:
        return min(feasible)[1], None
    text = ", ".join(sorted(f"{count} {reason}" for reason, count in reasons.items()))
    return None, f"0/{n} nodes are available: {text}."
