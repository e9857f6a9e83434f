"""The Backend protocol: deploy an arm, wait until it serves, scrape it, tear it down.

Every backend (sim, local, kubernetes) passes one shared suite of tests. Errors: a backend
raises ``TransientError`` for what a retry may fix (a 5xx, a 409, a slow start within the
deadline budget) and ``PermanentError`` for what it will not (a 403, no node with the GPU type,
a binary missing), with the remedy in the message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from orchestrator.plan import Plan


@dataclass(frozen=True)
class Endpoint:
    """Where load goes: an OpenAI-compatible base URL (router or single server)."""

    url: str  # e.g. http://127.0.0.1:8000 (no trailing /v1)
    model: str  # the `model` field requests must carry
    metrics_urls: tuple[str, ...] = ()  # /metrics of every engine worker (and the router)
    # Extra request headers (an API key read from the environment): never printed or stored.
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class RunKey:
    """Names the resources of one run attempt, so leftovers of a crash can be found by label."""

    experiment: str
    arm: str
    block: int
    attempt: int = 0

    @property
    def slug(self) -> str:
        """DNS-1123-safe identifier, e.g. ``exp12-a-b0-t1``."""
        return f"{self.experiment}-{self.arm}-b{self.block}-t{self.attempt}".lower()

    def labels(self) -> dict[str, str]:
        """Labels every resource of this run carries."""
        return {
            "orchestrator/experiment": self.experiment.lower(),
            "orchestrator/arm": self.arm.lower(),
            "orchestrator/block": str(self.block),
            "orchestrator/attempt": str(self.attempt),
        }


@dataclass
class Deployment:
    """A deployed arm: its endpoint, environment fingerprint and backend-private handles."""

    key: RunKey
    endpoint: Endpoint
    fingerprint: dict[str, Any] = field(default_factory=dict)  # engine_version, gpu_type, nodes, ...
    handles: dict[str, Any] = field(default_factory=dict, repr=False)  # backend-private (pids, secrets)


@runtime_checkable
class Backend(Protocol):
    """What control needs from any place an arm can run."""

    name: str

    def deploy(self, plan: Plan, arm: str, key: RunKey) -> Deployment:
        """Start the arm's workers and router; return at once (readiness is `ready`)."""
        ...

    def ready(self, deployment: Deployment, deadline_s: float) -> None:
        """Block until health answers and a test completion returns the asked tokens, or raise."""
        ...

    def scrape(self, deployment: Deployment) -> dict[str, str]:
        """Prometheus text of every metrics URL of the deployment: {url: text}."""
        ...

    def teardown(self, deployment: Deployment) -> None:
        """Stop and remove everything of the deployment; idempotent."""
        ...

    def cleanup(self, experiment: str) -> int:
        """Remove leftovers of crashed attempts of an experiment (by label or state file);
        returns how many things were removed."""
        ...
