"""Capacity summaries: per configuration, class and comparable group (store.keys), the statistics of the capacities of valid
finished runs, refreshed by the repository whenever one of their inputs changes.

All-time history questions then read one row per configuration and class (milliseconds at any
history size) instead of sorting every run's capacity. Quartiles use linear interpolation, as
PostgreSQL's percentile_cont and pandas' quantile do, so a summary equals the live aggregate.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.orm import Session

from orchestrator.analysis.censored_groups import group_figures
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


def _stats(values: list[float], stamps: Sequence[datetime | None]) -> dict[str, object]:
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
    transaction), one row per comparable group with a valid finished run, its point estimates'
    statistics and every run's figures (rows()); a group left with no valid run loses its row."""
    classes = sorted(set(class_names))
    if not classes:
        return
    if session.get_bind().dialect.name == "postgresql":
        session.execute(sa.select(sa.func.pg_advisory_xact_lock(_LOCK_NAMESPACE + config_id)))
    keys = [getattr(Capacity, k) for k in GROUP_KEYS]
    found = session.execute(
        sa.select(Capacity.class_name, *keys, Capacity.capacity, Capacity.censored, Capacity.converged,
                  Capacity.upper, Run.finished_at)
        .join(Run, Run.id == Capacity.run_id)
        .where(Run.config_id == config_id, Capacity.class_name.in_(classes), Run.valid.is_(True), Run.status == "done")
    ).all()
    session.execute(sa.delete(CapacitySummary).where(
        CapacitySummary.config_id == config_id, CapacitySummary.class_name.in_(classes)))
    out = rows(config_id, found)
    if out:
        session.execute(sa.insert(CapacitySummary), out)


def _number(v: Any) -> float | None:
    return None if v is None or np.isnan(v) else float(v)


def rows(config_id: int, capacities: Sequence[Any]) -> list[dict[str, Any]]:
    """The summaries of one configuration from its valid finished runs' capacities (rows of
    class, GROUP_KEYS, capacity, censored, converged, upper, the run's end): per comparable
    group, the point estimates' statistics (``runs``: uncensored and converged, zero included,
    as capacity_by_config counts them; 0 and NULLs for a group of censored runs only) and, from
    n_points on, every run's figures by analysis.censored_groups (report.capacity_history's)."""
    index: dict[tuple[Any, ...], int] = {}
    gid: list[int] = []
    for row in capacities:
        key = (row[0], *(_UNKNOWN[k] if v is None else v for k, v in zip(GROUP_KEYS, row[1:6], strict=True)))
        gid.append(index.setdefault(key, len(index)))
    if not index:
        return []
    figures = group_figures(
        np.array(gid, dtype=np.intp), len(index), np.array([r[6] for r in capacities], dtype=float),
        np.array([r[7] for r in capacities], dtype=object), np.array([bool(r[8]) for r in capacities]),
        np.array([np.nan if r[9] is None else r[9] for r in capacities], dtype=float))
    points: list[list[float]] = [[] for _ in index]
    point_times: list[list[datetime]] = [[] for _ in index]
    run_times: list[list[datetime]] = [[] for _ in index]
    for g, row in zip(gid, capacities, strict=True):
        if row[10] is not None:
            run_times[g].append(row[10])
        if row[7] is None and row[8]:  # point_estimate(): what capacity_by_config counts
            points[g].append(row[6])
            if row[10] is not None:
                point_times[g].append(row[10])
    out = []
    for key, g in index.items():
        stats: dict[str, object] = (_stats(points[g], point_times[g]) if points[g] else
                                    dict.fromkeys(("median", "p25", "p75", "min", "max", "last_measured"), None) | {"runs": 0})
        out.append({
            "config_id": config_id, "class_name": key[0], **dict(zip(GROUP_KEYS, key[1:], strict=True)), **stats,
            **{c: int(figures[c][g]) for c in ("n_points", "n_censored_above", "n_censored_below", "n_unconverged")},
            **{c: _number(figures[c][g]) for c in ("censored_above_from", "censored_below_to", "median_low",
                                                    "median_high", "median_level")},
            "npmle_median": float(figures["median"][g]), "median_censored": figures["median_censored"][g],
            "last_run_measured": max(run_times[g]) if run_times[g] else None,
        })
    return out


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


def refill(engine: sa.Engine) -> int:
    """Compute the summaries whose figures are not computed (``n_points`` NULL: the rows migration
    0014 left, which it cannot compute: the estimator is orchestrator code), by refreshing their
    configurations at their classes; returns the number of configurations refreshed (0: none
    was left). store.database.upgrade runs it after migrating to the head."""
    cs = CapacitySummary
    with Session(engine) as s, s.begin():
        stale: dict[int, set[str]] = defaultdict(set)
        for config_id, cls in s.execute(sa.select(cs.config_id, cs.class_name).where(cs.n_points.is_(None)).distinct()):
            stale[config_id].add(cls)
        for config_id, classes in stale.items():
            refresh(s, config_id, classes)
        return len(stale)
