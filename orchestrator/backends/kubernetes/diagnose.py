"""Read pod status the way an operator would: ready, pending and why, crash-looping and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.backends.kubernetes import naming

# Waiting reasons no amount of waiting fixes: the image or the container config is wrong.
FATAL_WAITING = {
    "CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
    "CreateContainerConfigError", "CreateContainerError",
}
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
    fatal_reason: str | None  # crash loop or image problem, with the last exit if known

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
    fatal = None
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
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
    )


def no_matching_node(state: PodState) -> bool:
    """The scheduler found no node with the required labels (as opposed to busy nodes)."""
    reason = state.pending_reason or ""
    return "Unschedulable" in reason and any(s in reason for s in NO_MATCHING_NODE)


def warning_events(events: list[dict[str, Any]], pod_names: set[str], limit: int = 5) -> list[str]:
    """The last ``limit`` Warning events about our pods, as 'pod: Reason: message'."""
    out = []
    for ev in events:
        obj = ev.get("involvedObject") or {}
        if ev.get("type") == "Warning" and obj.get("name") in pod_names:
            out.append(f"{obj['name']}: {ev.get('reason')}: {ev.get('message')}")
    return out[-limit:]
