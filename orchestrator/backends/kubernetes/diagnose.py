"""Read pod status the way an operator would: ready, pending and why, crash-looping and why,
and say which of these waiting cannot fix (with the fix: an image the registry does not have,
a crash loop) and which it may (a pull failing for now, busy GPUs)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from orchestrator.backends.kubernetes import naming

# Waiting reasons no amount of waiting fixes: the image name or the container config is wrong.
FATAL_WAITING = {"CrashLoopBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError"}
# A pull that failed is retried by the kubelet with backoff (a registry hiccup, a rate limit, a
# mirror catching up): waited for, up to the start-up budget, and shown.
PULL_WAITING = {"ErrImagePull", "ImagePullBackOff"}
# ... unless the registry said the image is not there (containerd: "<ref>: not found", a
# registry's "manifest unknown", Docker Hub's "pull access denied, repository does not exist or
# may require authorization"): no retry brings it, so the run fails at once naming the image.
IMAGE_MISSING = ("not found", "manifest unknown", "repository does not exist", "pull access denied")
# The scheduler's words for "no node has the labels this pod requires".
NO_MATCHING_NODE = ("didn't match Pod's node affinity/selector", "node(s) didn't match")


@dataclass(frozen=True)
class PodState:
    """What one pod is doing, in words."""

    name: str
    role: str
    phase: str
    ready: bool
    node: str | None
    pending_reason: str | None  # the scheduler's message when unschedulable
    fatal_reason: str | None  # crash loop or container config problem, with the last exit if known
    pulling: str | None = None  # an image pull failing for now (ErrImagePull / ImagePullBackOff)

    @property
    def stage(self) -> str:
        """One word for the progress line: unscheduled, pulling, starting, ready, failed."""
        if self.ready:
            return "ready"
        if self.fatal_reason:
            return "failed"
        if self.pulling:
            return "pulling"
        if not self.node:
            return "unscheduled"
        return "starting"

    def line(self) -> str:
        why = self.fatal_reason or self.pending_reason
        state = "ready" if self.ready else self.phase
        return f"{self.name} ({self.role}): {state}" + (f" - {why}" if why else "")


def pod_state(pod: dict[str, Any]) -> PodState:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = (conditions.get("Ready") or {}).get("status") == "True"
    pending = None
    sched = conditions.get("PodScheduled") or {}
    if sched.get("status") == "False":
        pending = f"{sched.get('reason') or 'not scheduled'}: {sched.get('message') or ''}".strip(": ")
    fatal = pulling = None
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in PULL_WAITING and image_missing(waiting.get("message") or ""):
            fatal = (f"container {cs.get('name')} {waiting['reason']}: image {cs.get('image') or '?'} cannot be "
                     f"pulled: {waiting.get('message')} (the image or its tag does not exist in the registry, or "
                     "the nodes may not read it: check kubernetes.image_repository and the engine version, "
                     "kubernetes.router_image, kubernetes.image_pull_secrets)")
            break
        if waiting.get("reason") in PULL_WAITING:
            pulling = f"container {cs.get('name')} {waiting['reason']}" + (
                f": {waiting['message']}" if waiting.get("message") else "")
        if waiting.get("reason") in FATAL_WAITING:
            last = ((cs.get("lastState") or {}).get("terminated")) or {}
            fatal = f"container {cs.get('name')} {waiting['reason']}"
            if waiting.get("message"):
                fatal += f": {waiting['message']}"
            if last:
                fatal += (f" (restarts {cs.get('restartCount', 0)}, last exit {last.get('exitCode')} "
                          f"{last.get('reason') or ''})").replace(" )", ")")
            break
    return PodState(
        name=meta.get("name", "?"),
        role=(meta.get("labels") or {}).get(naming.ROLE_LABEL, "?"),
        phase=status.get("phase") or "Unknown",
        ready=ready,
        node=(pod.get("spec") or {}).get("nodeName"),
        pending_reason=pending,
        fatal_reason=fatal,
        pulling=pulling,
    )


def image_missing(message: str) -> bool:
    """Whether a pull failure's message says the image does not exist (or may not be read)."""
    text = message.lower()
    return any(s in text for s in IMAGE_MISSING)


def no_matching_node(state: PodState) -> bool:
    """The scheduler found no node with the required labels (as opposed to busy nodes)."""
    reason = state.pending_reason or ""
    return "Unschedulable" in reason and any(s in reason for s in NO_MATCHING_NODE)


def unschedulable_fix(state: PodState) -> str | None:
    """The fix for a pod the scheduler cannot place and never will as things stand: an
    untolerated taint (with no node merely busy) or a missing claim. None when waiting may
    help (GPUs busy) or the reason is another."""
    reason = state.pending_reason or ""
    if "Unschedulable" not in reason and "FailedScheduling" not in reason:
        return None
    if "persistentvolumeclaim" in reason and "not found" in reason:
        return ("the model cache claim does not exist in the namespace: create it, or drop "
                "kubernetes.model_cache_pvc to download the weights into an emptyDir")
    if "untolerated taint" in reason and "Insufficient" not in reason:
        m = re.search(r"untolerated taints? (\{[^}]*\})", reason)
        taint = m.group(1) if m else ""
        return (f"the GPU nodes carry a taint the pods do not tolerate {taint}: add it to "
                "kubernetes.tolerations, e.g. {key: <taint key>, operator: Exists}")
    return None


def progress_line(states: list[PodState], expected: int) -> str:
    """E.g. ``3 pods: 1 ready, 1 starting, 1 pulling`` (for the start-up progress)."""
    counts: dict[str, int] = {}
    for s in states:
        counts[s.stage] = counts.get(s.stage, 0) + 1
    order = ("ready", "starting", "pulling", "unscheduled", "failed")
    parts = [f"{counts[k]} {k}" for k in order if counts.get(k)]
    missing = expected - len(states)
    if missing > 0:
        parts.append(f"{missing} not created yet")
    return f"{expected} pods: " + (", ".join(parts) or "none yet")


def replica_failure(deployment: dict[str, Any]) -> str | None:
    """The message of a Deployment whose pods the cluster refuses to create (admission: Pod
    Security, a ResourceQuota, a LimitRange), from its ReplicaFailure condition."""
    for c in (deployment.get("status") or {}).get("conditions") or []:
        if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
            return f"{c.get('reason') or 'FailedCreate'}: {c.get('message') or ''}".rstrip(": ")
    return None


def failed_create_events(events: list[dict[str, Any]], prefixes: tuple[str, ...]) -> list[str]:
    """FailedCreate events of the ReplicaSets of our Deployments (names start with theirs)."""
    out = []
    for ev in events:
        obj = ev.get("involvedObject") or {}
        if ev.get("reason") == "FailedCreate" and str(obj.get("name", "")).startswith(prefixes):
            out.append(str(ev.get("message") or ""))
    return out


def warning_events(events: list[dict[str, Any]], pod_names: set[str], limit: int = 5) -> list[str]:
    """The last ``limit`` Warning events about our pods, as 'pod: Reason: message'."""
    out = []
    for ev in events:
        obj = ev.get("involvedObject") or {}
        if ev.get("type") == "Warning" and obj.get("name") in pod_names:
            out.append(f"{obj['name']}: {ev.get('reason')}: {ev.get('message')}")
    return out[-limit:]
