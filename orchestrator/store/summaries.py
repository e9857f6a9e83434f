"""Capacity summaries: per configuration, class and comparable group (store.keys), the statistics of the capacities of valid
finished runs, refreshed by the repository whenever one of their inputs changes.

All-time history questions then read one row per configuration and class (milliseconds at any
history size) instead of sorting every run's capacity. Quartiles use linear interpolation, as
PostgreSQL's percentile_cont and pandas' quantile do, so a summary equals the live aggregate.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from orchestrator.store import groups, keys
from orchestrator.store.models import Capacity, CapacitySummary, Experiment, PlanRegistration, Run

# Serialises refreshes of one configuration across processes (two controllers finishing runs
# of the same configuration at once must not leave the older statistics behind).
_LOCK_NAMESPACE = 0x6F72 << 40


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolation quantile of already sorted values (percentile_cont)."""
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _stats(values: list[float], stamps: list[datetime | None]) -> dict[str, object]:
    values = sorted(values)
    known = [t for t in stamps if t is not None]
    return {
        "runs": len(values), "median": quantile(values, 0.5), "p25": quantile(values, 0.25),
        "p75": quantile(values, 0.75), "min": values[0], "max": values[-1],
        "last_measured": max(known) if known else None,
    }


# The comparable-group key of a summary (beyond config_id and class_name; store.keys; in the
# order history's tables show them: store.history.KEY_COLUMNS); an unknown key is stored as ''
# or 0 there (primary-key columns cannot be NULL).
GROUP_KEYS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "workload_sha256", "backend", "simulated")
_UNKNOWN: dict[str, object] = {"workload_sha256": "", "ttft_ms": 0.0, "tpot_ms": 0.0, "backend": "",
                               "simulated": False}


def refresh(session: Session, config_id: int, class_names: Iterable[str]) -> None:
    """Recompute the summaries of one configuration at the given classes (in the caller's
    transaction), one row per comparable group; a group left with no valid run loses its row."""
    classes = sorted(set(class_names))
    if not classes:
        return
    if session.get_bind().dialect.name == "postgresql":
        session.execute(sa.select(sa.func.pg_advisory_xact_lock(_LOCK_NAMESPACE + config_id)))
    keys = [getattr(Capacity, k) for k in GROUP_KEYS]
    rows = session.execute(
        sa.select(Capacity.class_name, *keys, Capacity.capacity, Run.finished_at)
        .join(Run, Run.id == Capacity.run_id)
        .where(Run.config_id == config_id, Capacity.class_name.in_(classes),
               Run.valid.is_(True), Run.status == "done", *point_estimate())
    )
    groups: dict[tuple[Any, ...], tuple[list[float], list[datetime | None]]] = defaultdict(lambda: ([], []))
    for row in rows:
        key = (row[0], *(_UNKNOWN[k] if v is None else v for k, v in zip(GROUP_KEYS, row[1:-2], strict=True)))
        groups[key][0].append(row[-2])
        groups[key][1].append(row[-1])
    session.execute(sa.delete(CapacitySummary).where(
        CapacitySummary.config_id == config_id, CapacitySummary.class_name.in_(classes)))
    out = [
        {"config_id": config_id, "class_name": key[0], **dict(zip(GROUP_KEYS, key[1:], strict=True)),
         **_stats(vals, stamps)}
        for key, (vals, stamps) in groups.items()
    ]
    if out:
        session.execute(sa.insert(CapacitySummary), out)


def point_estimate() -> tuple[sa.ColumnElement[bool], ...]:
    """A capacity history may count: neither censored nor unconverged (DESIGN section 7: those
    are bounds, never a point in a history median)."""
    return (Capacity.censored.is_(None), Capacity.converged.is_(True))


def mark_capacities(session: Session, run: Run, reg: keys.RegistrationKeys | None = None) -> None:
    """Copy the run's configuration, validity and end time onto its capacities (the columns
    time-ranged history reads instead of joining runs); ``counted``: a valid finished run's
    point estimate. With ``reg``, also the comparable-history keys (store.keys)."""
    run_counts = bool(run.valid) and run.status == "done"
    values: dict[str, Any] = dict(
        config_id=run.config_id, measured_at=run.finished_at,
        counted=sa.and_(sa.true() if run_counts else sa.false(), *point_estimate()),
    )
    if reg is not None:
        gpu, engine = keys.observed(run.fingerprint, run.gpu_type, run.engine_version)
        keys.ensure_workload(session, reg.workload)
        values.update(
            workload_sha256=reg.workload.sha256 if reg.workload else None,
            ttft_ms=keys.limit_case(Capacity.class_name, reg.limits, 0),
            tpot_ms=keys.limit_case(Capacity.class_name, reg.limits, 1),
            backend=reg.backend or None, simulated=keys.is_simulated(reg.backend, engine),
            observed_gpu=gpu, observed_engine=engine,
        )
    session.execute(
        sa.update(Capacity).where(Capacity.run_id == run.id).values(**values),
        execution_options={"synchronize_session": False},
    )
    groups.assign(session, Capacity.run_id == run.id)  # the group number follows the keys (0010)


def mark_all_capacities(session: Session) -> None:
    """mark_capacities for every run at once (after edits made outside the Store), keys too:
    derived again from every registration by today's plan language."""
    def of_run(col: Any) -> Any:
        return sa.select(col).where(Run.id == Capacity.run_id).scalar_subquery()

    counted = sa.and_(Run.valid.is_(True), Run.status == "done")
    session.execute(
        sa.update(Capacity).values(
            config_id=of_run(Run.config_id), measured_at=of_run(Run.finished_at),
            counted=sa.and_(sa.func.coalesce(of_run(counted), sa.false()), *point_estimate()),
        ),
        execution_options={"synchronize_session": False},
    )
    mark_all_keys(session)


def mark_all_keys(session: Session) -> None:
    """The comparable-history keys of every capacity, from registrations and fingerprints."""
    regs = session.execute(sa.select(PlanRegistration.id, PlanRegistration.canonical_json)).all()
    by_reg = {rid: keys.registration_keys(text) for rid, text in regs}
    # observed values per run, written in groups of runs that share them
    observed: dict[tuple[int, str | None, str | None], list[int]] = defaultdict(list)
    for run_id, reg_id, fp, gpu_type, engine in session.execute(
        sa.select(Run.id, Experiment.registration_id, Run.fingerprint, Run.gpu_type, Run.engine_version)
        .join(Experiment, Experiment.id == Run.experiment_id)
    ):
        observed[(reg_id, *keys.observed(fp, gpu_type, engine))].append(run_id)
    for reg in by_reg.values():
        keys.ensure_workload(session, reg.workload)
    for (reg_id, gpu, engine), run_ids in observed.items():
        reg = by_reg[reg_id]
        for start in range(0, len(run_ids), 5000):
            session.execute(
                sa.update(Capacity).where(Capacity.run_id.in_(run_ids[start:start + 5000])).values(
                    workload_sha256=reg.workload.sha256 if reg.workload else None,
                    ttft_ms=keys.limit_case(Capacity.class_name, reg.limits, 0),
                    tpot_ms=keys.limit_case(Capacity.class_name, reg.limits, 1),
                    backend=reg.backend or None, simulated=keys.is_simulated(reg.backend, engine),
                    observed_gpu=gpu, observed_engine=engine,
                ),
                execution_options={"synchronize_session": False},
            )
    groups.assign(session, sa.true())


def groups_of_runs(session: Session, where: sa.ColumnElement[bool]) -> dict[int, set[str]]:
    """config_id -> classes with a capacity, for the runs matching ``where``."""
    out: dict[int, set[str]] = defaultdict(set)
    for config_id, cls in session.execute(
        sa.select(Run.config_id, Capacity.class_name).join(Capacity, Capacity.run_id == Run.id).where(where).distinct()
    ):
        out[config_id].add(cls)
    return out


def rebuild(engine: sa.Engine) -> int:
    """Recompute every capacity's copied run columns and every summary from the runs (after edits made outside the Store); returns the
    number of (configuration, class) summaries there are now."""
    with Session(engine) as s, s.begin():
        mark_all_capacities(s)
        s.execute(sa.delete(CapacitySummary))
        for config_id, classes in groups_of_runs(s, sa.true()).items():
            refresh(s, config_id, classes)
        return s.scalar(sa.select(sa.func.count()).select_from(CapacitySummary)) or 0
