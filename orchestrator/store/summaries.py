"""Capacity summaries: per configuration and class, the statistics of the capacities of valid
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
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from orchestrator.store.models import Capacity, CapacitySummary, Run

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


def _upsert(session: Session, rows: list[dict[str, object]]) -> None:
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(CapacitySummary)
    keys = ("runs", "median", "p25", "p75", "min", "max", "last_measured")
    stmt = insert.on_conflict_do_update(
        index_elements=["config_id", "class_name"], set_={k: insert.excluded[k] for k in keys}
    )
    session.execute(stmt, rows)


def refresh(session: Session, config_id: int, class_names: Iterable[str]) -> None:
    """Recompute the summaries of one configuration at the given classes (in the caller's
    transaction); a group left with no valid run loses its row."""
    classes = sorted(set(class_names))
    if not classes:
        return
    if session.get_bind().dialect.name == "postgresql":
        session.execute(sa.select(sa.func.pg_advisory_xact_lock(_LOCK_NAMESPACE + config_id)))
    rows = session.execute(
        sa.select(Capacity.class_name, Capacity.capacity, Run.finished_at)
        .join(Run, Run.id == Capacity.run_id)
        .where(Run.config_id == config_id, Capacity.class_name.in_(classes),
               Run.valid.is_(True), Run.status == "done", *point_estimate())
    )
    groups: dict[str, tuple[list[float], list[datetime | None]]] = defaultdict(lambda: ([], []))
    for cls, cap, finished in rows:
        groups[cls][0].append(cap)
        groups[cls][1].append(finished)
    empty = [c for c in classes if c not in groups]
    if empty:
        session.execute(sa.delete(CapacitySummary).where(
            CapacitySummary.config_id == config_id, CapacitySummary.class_name.in_(empty)))
    _upsert(session, [
        {"config_id": config_id, "class_name": cls, **_stats(vals, stamps)}
        for cls, (vals, stamps) in groups.items()
    ])


def point_estimate() -> tuple[sa.ColumnElement[bool], ...]:
    """A capacity history may count: neither censored nor unconverged (DESIGN section 7: those
    are bounds, never a point in a history median)."""
    return (Capacity.censored.is_(None), Capacity.converged.is_(True))


def mark_capacities(session: Session, run: Run) -> None:
    """Copy the run's configuration, validity and end time onto its capacities (the columns
    time-ranged history reads instead of joining runs); ``counted``: a valid finished run's
    point estimate."""
    run_counts = bool(run.valid) and run.status == "done"
    session.execute(
        sa.update(Capacity).where(Capacity.run_id == run.id).values(
            config_id=run.config_id, measured_at=run.finished_at,
            counted=sa.and_(sa.true() if run_counts else sa.false(), *point_estimate()),
        ),
        execution_options={"synchronize_session": False},
    )


def mark_all_capacities(session: Session) -> None:
    """mark_capacities for every run at once (after edits made outside the Store)."""
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
