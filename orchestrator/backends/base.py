"""The backend contract: what control needs from any place an arm can run.

A backend turns one arm of a registered plan into a serving stack and back into nothing:

    budget = backend.startup_budget_s(plan, arm)    # how long a cold start may take here
    dep = backend.deploy(plan, arm, key)            # start it; returns at once
    backend.ready(dep, budget)                      # serves exactly N tokens with ignore_eos
    ... load points; backend.alive(dep) after each; backend.scrape(dep) around each ...
    backend.teardown(dep)                           # nothing of the run is left; idempotent
    backend.cleanup(experiment)                     # leftovers of crashed attempts (resume)
    backend.cleanup(experiment, final=True)         # the experiment is over: shared objects too

Meanings every backend keeps (the conformance suite, ``tests/integration/backend_suite.py``,
checks them against sim, external, kubernetes and local):

- ``ready`` waits for the one readiness check of ``orchestrator.backends.readiness``: the
  endpoint answers and a test completion returns exactly the asked tokens. A wrong count is a
  ``PermanentError`` (the engine ignores the output limit; waiting does not fix it).
- ``TransientError`` for what a retry may fix (a 5xx, a 409, a 429, a start that ran out of
  budget), with ``delay``: the executor waits that long before the next attempt.
  ``PermanentError`` for what it will not (a 403, no node with the GPU type, a missing volume,
  a binary missing): the executor stops the experiment with the message, which names the fix.
- ``deploy`` that fails half-way removes what it created before raising.
- ``fingerprint``: a typed ``Fingerprint`` of what the deployment observably runs on; the
  back-to-back guard, the store and the exporters read it by attribute.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol, TypeVar, runtime_checkable

from orchestrator.loadgen.driver import HTTP_DRIVER, LoadDriver
from orchestrator.plan import Plan

# Default start-up budget of a backend whose servers start in seconds (sim, external).
QUICK_START_BUDGET_S = 180.0


@dataclass(frozen=True)
class Endpoint:
    """Where load goes: an OpenAI-compatible base URL (router or single server)."""

    url: str  # e.g. http://127.0.0.1:8000 (no trailing /v1)
    model: str  # the `model` field requests must carry
    metrics_urls: tuple[str, ...] = ()  # /metrics of every engine worker (and the router)
    # Extra request headers (an API key read from the environment): never printed or stored.
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # Where the load generator sends, when it is not this process (an in-cluster generator
    # reaches the router's Service; this process reaches it through ``url``). None: ``url``.
    load_url: str | None = None

    @property
    def send_url(self) -> str:
        """The base URL the deployment's load driver sends to."""
        return self.load_url or self.url


@dataclass(frozen=True)
class RunKey:
    """Names the resources of one run attempt, so leftovers of a crash can be found by label."""

    experiment: str
    arm: str
    block: int
    attempt: int = 0

    @property
    def is_lead_in(self) -> bool:
        """A lead-in run (``design.carryover.lead_in_s``): unmeasured; its attempt is -1, -2, ..."""
        return self.attempt < 0

    @property
    def attempt_label(self) -> str:
        """``t1`` for attempt 1, ``lead1`` for the first lead-in of the block (a label value must
        start with a letter or digit)."""
        return f"lead{-self.attempt}" if self.is_lead_in else f"t{self.attempt}"

    @property
    def slug(self) -> str:
        """DNS-1123-safe identifier, e.g. ``exp12-a-b0-t1`` (``exp12-a-b0-lead1`` for a lead-in)."""
        return f"{self.experiment}-{self.arm}-b{self.block}-{self.attempt_label}".lower()

    def labels(self) -> dict[str, str]:
        """Labels every resource of this run carries."""
        return {
            "orchestrator/experiment": self.experiment.lower(),
            "orchestrator/arm": self.arm.lower(),
            "orchestrator/block": str(self.block),
            "orchestrator/attempt": str(self.attempt) if not self.is_lead_in else self.attempt_label,
        }


@dataclass(frozen=True)
class Fingerprint:
    """What a deployment observably runs on. Observed values where the backend can read them
    (node labels, image digests, the server's /version), the registered ones otherwise, and
    ``*_source`` says which. Sets (products, pools, drivers, images) are sorted tuples."""

    backend: str
    gpu_type: str | None = None  # the GPU type the arm runs on (registered catalog name, or "cpu")
    engine_version: str | None = None
    engine_version_source: str = "registered"  # registered | /version | /metrics | package
    gpu_products: tuple[str, ...] = ()  # observed product names (node labels, device name)
    node_pools: tuple[str, ...] = ()  # e.g. "karpenter.sh/nodepool=h200-pool", "local"
    driver_versions: tuple[str, ...] = ()
    images: tuple[str, ...] = ()  # image references with digest (repo@sha256:...)
    nodes: tuple[str, ...] = ()
    kv_transport: str | None = None  # KV transfer of a P/D arm: "nixl/tcp", "nixl/rdma", ...
    topology: str = ""  # e.g. "vllm-router cache_aware P/D"
    namespace: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)  # backend-specific, descriptive only

    # Fields the back-to-back guard compares between the arms of a block.
    COMPARED = ("gpu_type", "engine_version", "gpu_products", "node_pools", "driver_versions", "images")

    def observed(self, **changes: Any) -> Fingerprint:
        """A copy with what was observed after deploy (tuples sorted)."""
        clean: dict[str, Any] = {
            k: tuple(sorted(set(v))) if isinstance(v, list | set | tuple) else v for k, v in changes.items()}
        return replace(self, **clean)

    def compared_value(self, name: str) -> str:
        """One compared field as text: tuples joined, None as ''."""
        v = getattr(self, name)
        if isinstance(v, tuple):
            return ",".join(v)
        return "" if v is None else str(v)

    def image_digests(self) -> tuple[str, ...]:
        """The digests of the images (what an image tag hides)."""
        return tuple(sorted({i.split("@", 1)[1] for i in self.images if "@" in i}))

    def to_dict(self) -> dict[str, Any]:
        """JSON form stored with the run (lists for tuples)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, Mapping) else v
        # Columns the store keeps for filtering (runs.image_digest, runs.driver).
        out["image_digest"] = ",".join(self.image_digests()) or None
        out["driver"] = ",".join(self.driver_versions) or None
        return out

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> Fingerprint:
        """Read a stored fingerprint (also the untyped dicts of runs stored before this type;
        keys this type does not know are ignored)."""
        doc = dict(doc or {})
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in doc and doc[f.name] is not None:
                v = doc[f.name]
                kw[f.name] = tuple(v) if isinstance(v, list) else v
        # Older rows: node_pool (one), driver (one), images as {tag: id}.
        if "node_pools" not in kw and doc.get("node_pool"):
            kw["node_pools"] = (str(doc["node_pool"]),)
        if "driver_versions" not in kw and doc.get("driver"):
            kw["driver_versions"] = (str(doc["driver"]),)
        if isinstance(kw.get("images"), dict):
            kw["images"] = tuple(sorted(str(v) for v in kw["images"].values()))
        if "details" in kw and not isinstance(kw["details"], Mapping):
            kw.pop("details")
        kw.setdefault("backend", str(doc.get("backend") or "unknown"))
        extra = {k: v for k, v in doc.items() if k not in known and k not in ("image_digest", "driver", "node_pool")}
        if extra and "details" not in kw:
            kw["details"] = extra
        return cls(**kw)


H = TypeVar("H")


@dataclass
class Deployment:
    """A deployed arm: its endpoint, fingerprint and backend-private handles."""

    key: RunKey
    endpoint: Endpoint
    fingerprint: Fingerprint
    # Backend-private: the deploying backend's own record (processes, names, secrets); read it
    # back with ``handles_as`` (each backend's type, so no field is looked up by a string).
    handles: object = field(default=None, repr=False)
    # How a point's load reaches it: HTTP on the wall clock, or the virtual backend's own clock.
    driver: LoadDriver = field(default=HTTP_DRIVER, repr=False)

    def handles_as(self, kind: type[H]) -> H:
        """The handles, as the backend that deployed this arm recorded them."""
        if not isinstance(self.handles, kind):
            raise TypeError(f"deployment {self.key.slug} holds {type(self.handles).__name__} handles, "
                            f"not {kind.__name__}: it was deployed by another backend")
        return self.handles


@runtime_checkable
class Backend(Protocol):
    """What control needs from any place an arm can run (see the module docstring)."""

    name: str

    def startup_budget_s(self, plan: Plan, arm: str) -> float:
        """Seconds a cold start of the arm may take here before ``ready`` gives up (a vLLM
        start on a cluster pulls images and loads weights: minutes)."""
        ...

    def sends_load_here(self, plan: Plan) -> bool:
        """Whether this process's load generator sends the plan's load (so its ceiling is worth
        calibrating): not on a virtual clock, nor where a pod in the cluster sends it."""
        ...

    def deploy(self, plan: Plan, arm: str, key: RunKey) -> Deployment:
        """Start the arm's workers and router; return at once (readiness is `ready`).
        A deploy that fails half-way removes what it created before raising."""
        ...

    def ready(self, deployment: Deployment, deadline_s: float) -> None:
        """Block until the endpoint serves a test completion of exactly the asked tokens, or
        raise (PermanentError for what waiting cannot fix, TransientError at the deadline)."""
        ...

    def alive(self, deployment: Deployment) -> bool:
        """Whether every server of the deployment still runs (checked after each point)."""
        ...

    def scrape(self, deployment: Deployment) -> dict[str, str]:
        """Prometheus text of every metrics URL of the deployment: {url: text}."""
        ...

    def teardown(self, deployment: Deployment) -> None:
        """Stop and remove everything of the deployment; idempotent."""
        ...

    def cleanup(self, experiment: str, final: bool = False) -> int:
        """Remove leftovers of crashed attempts of an experiment (by label or state file);
        ``final``: the experiment is over here, also remove what its runs shared (a namespace
        the backend created). Returns how many things were removed."""
        ...
