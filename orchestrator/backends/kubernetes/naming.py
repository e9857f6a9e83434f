"""Names and labels of a run's objects: valid for Kubernetes whatever the experiment is called."""

from __future__ import annotations

import hashlib
import re

from orchestrator.backends.base import RunKey

LABEL_PREFIX = "orchestrator/"
ROLE_LABEL = LABEL_PREFIX + "role"
RUN_LABEL = LABEL_PREFIX + "run"
EXPERIMENT_LABEL = LABEL_PREFIX + "experiment"
MANAGED_BY = {"app.kubernetes.io/managed-by": "orchestrator"}
# Longest role suffix ("-prefill", "-router"): names stay DNS-1035 labels (Services need it).
_ROLE_ROOM = len("-prefill")


def _shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, keeping it unique with a short hash when cut."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    return f"{text[: limit - 7].rstrip('-._')}-{digest}"


def dns_label(text: str, limit: int = 63) -> str:
    """A DNS-1035 label (lowercase alphanumerics and '-', starts with a letter) from ``text``."""
    s = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not s or not s[0].isalpha():
        s = f"x-{s}".rstrip("-")
    return _shorten(s, limit).rstrip("-")


def label_value(text: str) -> str:
    """A valid label value (<= 63 of [A-Za-z0-9_.-], alphanumeric at both ends)."""
    s = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")
    return _shorten(s, 63).strip("-_.")


def run_name(key: RunKey) -> str:
    """Base name of a run's objects, e.g. ``orch-exp-a-b0-t0``; roles add a suffix."""
    return dns_label(f"orch-{key.slug}", 63 - _ROLE_ROOM)


def object_name(key: RunKey, role: str) -> str:
    """Name of the Deployment/Service of ``role`` (worker, prefill, decode, router)."""
    return f"{run_name(key)}-{role}"


def experiment_namespace(experiment: str) -> str:
    """The namespace of an experiment that names none: ``orch-<experiment>``."""
    return dns_label(f"orch-{experiment}")


def run_labels(key: RunKey) -> dict[str, str]:
    """Labels every object of the run carries (the keys of RunKey.labels, values made valid)."""
    labels = {k: label_value(v) for k, v in key.labels().items()}
    labels[RUN_LABEL] = label_value(run_name(key))
    return {**labels, **MANAGED_BY}


def selector(labels: dict[str, str]) -> str:
    """An equality label selector, e.g. ``a=b,c=d``."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
