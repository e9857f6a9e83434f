"""What makes two capacities comparable beyond their configuration (DESIGN section 7): the
workload signature, the class's limits, the backend kind and whether the engine was simulated,
all derived from the run's **registration** (the plan that governed it) and its observed
fingerprint, so the controller passes nothing new.

- workload: ``orchestrator.plan.signature`` of the registered plan read by today's plan
  language (its effective values; a registration today's language cannot read falls back to the
  workload section of its stored JSON, which is what migration 0007 back-filled from).
- limits: the TTFT and TPOT limits of the class as the plan defined it (a plan may redefine
  ``interactive``).
- backend: the plan's ``backend`` (sim, local, kubernetes, external).
- simulated: the backend is ``sim`` or the run's observed engine version is the simulator's
  (``sim-...``: e.g. simulated engines behind a Kubernetes backend, as the emulated cluster
  runs). Simulated and measured capacities are never pooled.
- observed: the GPU products and engine version the run's fingerprint saw (filters).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from orchestrator.errors import PlanError
from orchestrator.plan import SERVICE_CLASSES, plan_from_canonical
from orchestrator.plan.signature import WorkloadSignature, signature_of_doc, workload_signature
from orchestrator.store.models import WorkloadSignatureRow

SIM_ENGINE_PREFIX = "sim-"


@dataclass(frozen=True)
class RegistrationKeys:
    """The history keys one registration gives every capacity of its runs."""

    workload: WorkloadSignature | None
    backend: str
    limits: dict[str, tuple[float, float]] = field(default_factory=dict)  # class -> (ttft_ms, tpot_ms)


def _raw_keys(text: str) -> RegistrationKeys:
    """From the stored JSON itself (a registration today's plan language cannot read)."""
    try:
        plan = json.loads(text).get("plan", {})
    except (ValueError, AttributeError):
        return RegistrationKeys(None, "")
    workload = plan.get("workload")
    limits: dict[str, tuple[float, float]] = {}
    for c in plan.get("classes") or []:
        if isinstance(c, str) and c in SERVICE_CLASSES:
            c = SERVICE_CLASSES[c].model_dump()
        if isinstance(c, dict) and {"name", "ttft_ms", "tpot_ms"} <= set(c):
            limits[str(c["name"])] = (float(c["ttft_ms"]), float(c["tpot_ms"]))
    return RegistrationKeys(
        signature_of_doc(workload) if isinstance(workload, dict) else None,
        str(plan.get("backend", "sim")), limits,
    )


def registration_keys(canonical_json: str) -> RegistrationKeys:
    """The keys of a registration's capacities (see the module docstring)."""
    try:
        plan = plan_from_canonical(canonical_json)
    except (PlanError, ValueError, KeyError, TypeError):
        return _raw_keys(canonical_json)
    return RegistrationKeys(
        workload_signature(plan.workload), plan.backend,
        {c.name: (c.ttft_ms, c.tpot_ms) for c in plan.classes},
    )


def observed(fingerprint: Any, gpu_type: str | None, engine_version: str | None) -> tuple[str | None, str | None]:
    """(GPU products, engine version) a run's fingerprint saw: the products joined by ',' (or the
    GPU type when none were read) and the engine version."""
    products = fingerprint.get("gpu_products") if isinstance(fingerprint, dict) else None
    gpu = ",".join(str(p) for p in products) if isinstance(products, list | tuple) and products else gpu_type
    return (gpu[:200] if gpu else None), (engine_version[:40] if engine_version else None)


def is_simulated(backend: str | None, engine_version: str | None) -> bool:
    return backend == "sim" or bool(engine_version and engine_version.startswith(SIM_ENGINE_PREFIX))


def ensure_workload(session: Session, sig: WorkloadSignature | None) -> None:
    """Store the signature's row once (concurrent writers: the first one wins)."""
    if sig is None:
        return
    dialect = session.get_bind().dialect.name
    insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(WorkloadSignatureRow)
    values = sig.model_dump(exclude={"sha256"})
    session.execute(insert.values(sha256=sig.sha256, **values).on_conflict_do_nothing(index_elements=["sha256"]))


def limit_case(column: Any, limits: dict[str, tuple[float, float]], which: int) -> Any:
    """SQL: the class's TTFT (``which`` 0) or TPOT (1) limit by class name; NULL if unknown."""
    if not limits:
        return sa.null()
    return sa.case({name: lim[which] for name, lim in limits.items()}, value=column, else_=sa.null())
