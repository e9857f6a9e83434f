"""Every valid run's capacity with its censoring, for capacity over history from all of them
(issue 32, item 1; report.capacity_history estimates from these rows).

``capacity_by_config`` (and the summaries it reads) counts point estimates only: a group whose
runs were censored above the search's range shows its lower runs alone, and a group of only
censored runs does not show at all. ``capacity_intervals`` fetches every capacity of a valid,
finished run of the groups the filters choose, censored or not, one row each.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pandas as pd
import sqlalchemy as sa

from orchestrator.store import history
from orchestrator.store.models import Capacity, DeploymentConfig, Run, WorkloadSignatureRow
from orchestrator.store.types import utcnow

GROUP_COLUMNS = ("config_id", "class", *history.KEY_COLUMNS)
RUN_COLUMNS = ("capacity", "censored", "converged", "upper", "last_measured")
INTERVAL_COLUMNS = (*GROUP_COLUMNS, *history.CONFIG_COLUMNS, *history.WORKLOAD_COLUMNS, *RUN_COLUMNS)


def _intervals(conn: sa.Connection, filters: dict[str, Any]) -> pd.DataFrame:
    """Every capacity of a valid, finished run matching ``filters`` (capacity_by_config's), with
    its group's keys (unknown ones as the summaries store them) and its censoring."""
    filters = dict(filters)
    since = filters.pop("since_days", None)
    config_filters, keyed = history._split(filters)
    where: list[Any] = [Run.valid.is_(True), Run.status == "done",
                        *history._config_conditions(**config_filters), *history._key_conditions(Capacity, **keyed)]
    if since is not None:
        where.append(Capacity.measured_at >= utcnow() - timedelta(days=since))
    stmt = (
        sa.select(Run.config_id, Capacity.class_name.label("class"), *(getattr(Capacity, k) for k in history.KEY_COLUMNS),
                  Capacity.capacity, Capacity.censored, Capacity.converged, Capacity.upper,
                  history._plain_time(Capacity.measured_at).label("last_measured"))
        .select_from(sa.join(Capacity, Run, Run.id == Capacity.run_id)
                     .join(DeploymentConfig, DeploymentConfig.id == Run.config_id)
                     .outerjoin(WorkloadSignatureRow, WorkloadSignatureRow.sha256 == Capacity.workload_sha256))
        .where(*where)
    )
    return history._frame(conn.execute(stmt))


def capacity_intervals(engine: sa.Engine, **filters: Any) -> pd.DataFrame:
    """Every capacity of a valid, finished run matching capacity_by_config's ``filters``,
    censored, unconverged or a point, one row each (INTERVAL_COLUMNS): its comparable group's
    keys (an unknown one as the summaries store it: '' / 0 / False), its configuration's and
    workload's columns, the capacity, ``censored`` (None, below_min, above_max, at_ceiling),
    ``converged``, ``upper`` (None: unbounded) and its run's end (``last_measured``)."""
    with engine.connect() as conn:
        raw = _intervals(conn, filters)
        if raw.empty:
            return pd.DataFrame(columns=list(INTERVAL_COLUMNS))
        frame = history._attach(conn, history._unknown_keys(raw))
    frame["simulated"] = frame["simulated"].astype(bool)
    frame["converged"] = frame["converged"].astype(bool)
    frame["last_measured"] = pd.to_datetime(frame["last_measured"], utc=True)
    frame["censored"] = frame["censored"].astype(object).where(frame["censored"].notna(), None)
    frame["upper"] = frame["upper"].astype(object).where(frame["upper"].notna(), None)
    return frame[list(INTERVAL_COLUMNS)]


def censored_runs(engine: sa.Engine, run_ids: list[int]) -> set[int]:
    """Those of ``run_ids`` with a capacity that is no point estimate (censored, unconverged, or
    zero: no rate passed) at any class."""
    ids = sorted({int(r) for r in run_ids})
    out: set[int] = set()
    not_point = sa.or_(Capacity.censored.is_not(None), Capacity.converged.is_(False), Capacity.capacity <= 0)
    with engine.connect() as conn:
        for start in range(0, len(ids), 5000):
            out.update(conn.scalars(sa.select(Capacity.run_id).where(
                Capacity.run_id.in_(ids[start:start + 5000]), not_point).distinct()))
    return out
