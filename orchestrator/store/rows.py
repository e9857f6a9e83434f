"""What the repository hands back: plain frozen values, never live ORM objects (they would be
detached from their session the moment the call returns)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestrator.plan import Plan

EXPERIMENT_STATUSES = ("queued", "running", "done", "failed", "cancelled")
TERMINAL_STATUSES = ("done", "failed", "cancelled")
RUN_STATUSES = ("running", "done", "failed", "aborted")


@dataclass(frozen=True, slots=True)
class Registration:
    """A registered plan. ``created`` is False when the same plan was registered before."""

    id: int
    sha256: str
    name: str
    registered_at: datetime
    canonical_json: str
    created: bool = False


@dataclass(frozen=True, slots=True)
class ExperimentInfo:
    id: int
    name: str
    registration_id: int
    status: str
    controller_id: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class PointOwner:
    """Whose a load point is: the database (``store``: its identity, migration 0011), the
    experiment and the run, and the run's status. What a spool file of the point is keyed by
    and checked against (control/spool.py)."""

    store: str
    experiment_id: int
    run_id: int
    run_status: str


@dataclass(frozen=True, slots=True)
class RunInfo:
    id: int
    experiment_id: int
    config_id: int
    arm: str
    block: int
    position: int
    attempt: int
    status: str
    valid: bool | None
    invalid_reason: str | None
    fingerprint: dict[str, Any] | None
    started_at: datetime
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        """Ended one way or another (done, failed, aborted)."""
        return self.status != "running"


@dataclass(frozen=True, slots=True)
class GuardRecord:
    """A guard's judgement as stored (the analysis GuardResult has the same fields)."""

    name: str
    passed: bool
    value: float | None
    threshold: float | None
    detail: str = ""
    point_id: int | None = None


@dataclass(frozen=True, slots=True)
class VerdictInfo:
    experiment_id: int
    registration_id: int
    bar_id: str
    verdict: str
    estimate: float | None
    lower: float | None
    upper: float | None
    blocks: int
    judged_at: datetime
    label: str | None = None  # exactly what lower..upper is (None: judged before it was stored)
    note: str | None = None
    evidence: dict[str, Any] | None = None  # blocks used, censored and dropped blocks and why


def arm_config(plan: Plan, arm: str) -> dict[str, Any]:
    """Everything that defines how an arm serves: model, GPU, pools, engine knobs, router.

    Free-text descriptions are left out: two arms that serve identically are one configuration.
    An external arm is its endpoint (URL and served model; header values are never here, only
    the names of the variables holding them) and its labels.
    """
    spec = plan.arm(arm)
    if spec.external:
        return {
            "model": plan.model.model_dump(mode="json"),
            "arm": spec.model_dump(mode="json", exclude={"description"}),
        }
    return {
        "model": plan.model.model_dump(mode="json"),
        "arm": spec.model_dump(mode="json", exclude={"description", "router"}),
        "router": plan.router_for(arm).model_dump(mode="json"),
    }


def config_columns(plan: Plan, arm: str) -> dict[str, Any]:
    """The indexed columns of a deployment configuration (plus its hash, label and JSON)."""
    spec = plan.arm(arm)
    engine = spec.engine
    router = plan.router_for(arm)
    config = arm_config(plan, arm)
    digest = hashlib.sha256(
        json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    if spec.external:
        return _external_columns(plan, arm, digest, config)
    pools = spec.pools()
    if spec.layout == "colocated":
        shape = f"{spec.replicas}x TP{spec.tp}"
        tp = spec.tp
    else:
        p, d = pools["prefill"], pools["decode"]
        shape = f"{p.replicas}P(TP{p.tp})+{d.replicas}D(TP{d.tp})"
        tp = d.tp  # decode TP: what bounds the per-user speed
    spec_dec = engine.speculative
    label = f"{spec.gpu} {shape} kv={engine.kv_cache_dtype} seqs={engine.max_num_seqs} {router.policy}"
    if engine.quantization != "none":
        label += f" w={engine.quantization}"
    if spec_dec is not None:
        label += f" spec={spec_dec.method}{spec_dec.num_speculative_tokens}"
    label += f" {engine.version}"
    return {
        "config_sha256": digest,
        "label": label,
        "model": plan.model.name,
        "gpu": spec.gpu,
        "layout": spec.layout,
        "gpus": spec.gpus,
        "tp": tp,
        "replicas": spec.replicas,
        "prefill_replicas": pools["prefill"].replicas if "prefill" in pools else None,
        "prefill_tp": pools["prefill"].tp if "prefill" in pools else None,
        "decode_replicas": pools["decode"].replicas if "decode" in pools else None,
        "decode_tp": pools["decode"].tp if "decode" in pools else None,
        "kv_connector": spec.kv_connector,
        "kv_cache_dtype": engine.kv_cache_dtype,
        "quantization": engine.quantization,
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "prefix_caching": engine.prefix_caching,
        "router_policy": router.policy,
        "speculative_method": spec_dec.method if spec_dec else None,
        "num_speculative_tokens": spec_dec.num_speculative_tokens if spec_dec else None,
        "engine_version": engine.version,
        "config": config,
    }


# What an external arm's history row holds where its labels say nothing: the engine knobs and
# router of a stack the orchestrator did not start are unknown, never guessed.
UNKNOWN = "unknown"
EXTERNAL_LAYOUT = "external"


def _external_columns(plan: Plan, arm: str, digest: str, config: dict[str, Any]) -> dict[str, Any]:
    """Columns of an external arm, from its labels (``orch capacity --gpu/--layout/--engine-version``
    filter on them; tags are in the JSON and the label)."""
    spec = plan.arm(arm)
    assert spec.endpoint is not None
    lab = spec.labels
    gpu = lab.gpu if lab and lab.gpu else UNKNOWN
    layout = lab.layout if lab and lab.layout else EXTERNAL_LAYOUT
    version = lab.engine_version if lab and lab.engine_version else UNKNOWN
    shape = f"{lab.replicas}x" if lab and lab.replicas else "?x"
    tags = ",".join(f"{k}={v}" for k, v in (lab.tags if lab else {}).items())
    label = f"{gpu} {layout} {shape} external {spec.endpoint.model} @ {spec.endpoint.url}"
    label = (label + (f" [{tags}]" if tags else "") + f" {version}")[:300]
    return {
        "config_sha256": digest,
        "label": label,
        "model": plan.model.name,
        "gpu": gpu,
        "layout": layout,
        "gpus": spec.gpus,
        "tp": 1,  # unknown; the column is required, and 1 divides nothing
        "replicas": lab.replicas if lab else None,
        "prefill_replicas": None,
        "prefill_tp": None,
        "decode_replicas": None,
        "decode_tp": None,
        "kv_connector": None,
        "kv_cache_dtype": UNKNOWN,
        "quantization": UNKNOWN,
        "max_num_seqs": 0,
        "max_num_batched_tokens": 0,
        "prefix_caching": False,
        "router_policy": EXTERNAL_LAYOUT,
        "speculative_method": None,
        "num_speculative_tokens": None,
        "engine_version": version,
        "config": config,
    }
