"""Every valid run's capacity with its censoring, for capacity over history from all of them
(issue 32, item 1; report.capacity_history estimates from these rows).

``capacity_by_config`` (and the summaries it reads) counts point estimates only: a group whose
runs were censored above the search's range shows its lower runs alone, and a group of only
censored runs does not show at all. ``capacity_runs`` fetches every capacity of a valid,
finished run of the groups the filters choose, censored or not, one row each: the point
estimates from the index the live aggregate reads, the others (few) joined to their runs.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd
import sqlalchemy as sa

from orchestrator.store import history, history_frame
from orchestrator.store.models import NOT_POINT_SQL, Capacity, CapacitySummary, HistoryGroup, Run
from orchestrator.store.types import utcnow

GROUP_COLUMNS = ("group_id", "config_id", "class", *history.KEY_COLUMNS)
RUN_COLUMNS = ("group_id", "capacity", "censored", "converged", "upper", "last_measured")
GROUPS_COLUMNS = (*GROUP_COLUMNS, *history.CONFIG_COLUMNS, *history.WORKLOAD_COLUMNS)
# A capacity that is no point estimate: censored, unconverged, or zero (no rate passed); the
# text of the partial index ix_capacities_not_point_group (0013), so the planner matches it.
NOT_POINT = sa.text("(" + " OR ".join(f"capacities.{term}" for term in NOT_POINT_SQL.split(" OR ")) + ")")


def _where(filters: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """(the point estimates' WHERE: the counted capacities, read from their covering index as
    the live aggregate reads them; the other capacities' WHERE: valid, finished runs (joined)
    whose capacity is no point), both over the groups (history_groups), time range and observed
    filters of ``filters`` (capacity_by_config's)."""
    filters = dict(filters)
    since = filters.pop("since_days", None)
    config_filters, keyed = history._split(filters)
    observed = {k: keyed.pop(k) for k in history.OBSERVED_FILTERS if k in keyed}
    hg = HistoryGroup
    chosen = [*history._config_conditions(class_column=hg.class_name, **config_filters),
              *history._key_conditions(hg, **keyed)]
    common: list[Any] = [Capacity.group_id.is_not(None), *history._key_conditions(Capacity, **observed)]
    if since is not None:
        common.append(Capacity.measured_at >= utcnow() - timedelta(days=since))
    if chosen:
        common.append(Capacity.group_id.in_(
            sa.select(hg.id).select_from(history._needed_from(hg, hg.config_id, hg.workload_sha256, chosen))
            .where(*chosen)))
    return ([Capacity.counted, *common, Capacity.capacity > 0],
            [*common, NOT_POINT, Run.valid.is_(True), Run.status == "done"])


def _rows(conn: sa.Connection, points: list[Any], others: list[Any]) -> pd.DataFrame:
    """Every matching capacity, one row each (RUN_COLUMNS), by plain rows (SQLite, or a value the
    columnar fetch cannot carry)."""
    time = history._plain_time(Capacity.measured_at)
    a = conn.execute(sa.select(Capacity.group_id, Capacity.capacity, time).where(*points)).all()
    b = conn.execute(sa.select(Capacity.group_id, Capacity.capacity, Capacity.censored, Capacity.converged,
                               Capacity.upper, time).join(Run, Run.id == Capacity.run_id).where(*others)).all()
    frame = pd.DataFrame({
        "group_id": [r[0] for r in a] + [r[0] for r in b], "capacity": [r[1] for r in a] + [r[1] for r in b],
        "censored": pd.Series([None] * len(a) + [r[2] for r in b], dtype=object),
        "converged": [True] * len(a) + [bool(r[3]) for r in b],
        "upper": pd.Series([None] * len(a) + [r[4] for r in b], dtype=object),
        "last_measured": [r[2] for r in a] + [r[5] for r in b],
    }, columns=list(RUN_COLUMNS))
    frame["last_measured"] = pd.to_datetime(frame["last_measured"], utc=True)
    return frame


def _columns(conn: sa.Connection, points: list[Any], others: list[Any]) -> pd.DataFrame | None:
    """_rows by PostgreSQL's columnar fetch (history_frame.fetch_columns: a value per column, not
    a Python object per value: 140,000 capacities are otherwise seconds); None where it cannot."""
    a_src = sa.select(Capacity.group_id, Capacity.capacity, Capacity.measured_at).where(*points).subquery("points")
    a = history_frame.fetch_columns(conn, a_src, [(a_src.c.group_id, "int8"), (a_src.c.capacity, "float8"),
                                                  (a_src.c.measured_at, "time")])
    b_src = (sa.select(Capacity.group_id, Capacity.capacity, sa.func.coalesce(Capacity.censored, "").label("censored"),
                       Capacity.converged, sa.func.coalesce(Capacity.upper, sa.literal(float("inf"))).label("upper"),
                       Capacity.measured_at)
             .join(Run, Run.id == Capacity.run_id).where(*others).subquery("others"))
    b = history_frame.fetch_columns(conn, b_src, list(zip(b_src.c, ("int8", "float8", "text", "bool", "float8", "time"),
                                                          strict=True)))
    if a is None or b is None:
        return None
    stamps = np.concatenate([a[2], b[5]])
    frame = pd.DataFrame({
        "group_id": np.concatenate([a[0], b[0]]), "capacity": np.concatenate([a[1], b[1]]),
        "censored": pd.Series([None] * len(a[0]) + [c or None for c in b[2]], dtype=object),
        "converged": np.concatenate([np.ones(len(a[0]), dtype=bool), b[3]]),
        "upper": np.concatenate([np.full(len(a[0]), np.nan), np.where(np.isfinite(b[4]), b[4], np.nan)]),
        "last_measured": pd.to_datetime(np.where(stamps == history_frame.NO_TIME, np.nan, stamps.astype(float)),
                                        unit="us", utc=True),
    }, columns=list(RUN_COLUMNS))
    return frame


def _groups(conn: sa.Connection, ids: np.ndarray) -> pd.DataFrame:
    """The comparable groups ``ids`` (HistoryGroup: unknown keys '' / 0 / False), with their
    configurations' and workloads' columns, by group number."""
    hg = HistoryGroup
    cols = (hg.id.label("group_id"), hg.config_id, hg.class_name.label("class"), *(getattr(hg, k) for k in history.KEY_COLUMNS))
    rows: list[Any] = []
    if conn.dialect.name == "postgresql":  # one array parameter, the driver's plain tuples
        rows = list(history_frame._raw(conn, sa.select(*cols).where(hg.id == sa.any_(history_frame._ids(ids)))))
    else:
        for start in range(0, len(ids), 5000):
            rows += conn.execute(sa.select(*cols).where(hg.id.in_(ids[start:start + 5000].tolist()))).all()
    frame = pd.DataFrame.from_records(rows, columns=list(GROUP_COLUMNS))
    frame = history._attach(conn, frame.sort_values("group_id").reset_index(drop=True))
    frame["simulated"] = frame["simulated"].astype(bool)
    return frame[list(GROUPS_COLUMNS)]


def capacity_runs(engine: sa.Engine, **filters: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every capacity of a valid, finished run matching capacity_by_config's ``filters``,
    censored, unconverged or a point, as (groups, runs): ``groups`` one row per comparable group
    that has any (GROUPS_COLUMNS: its number, configuration, class, keys, and the
    configuration's and workload's columns, by group number), ``runs`` one row per capacity
    (RUN_COLUMNS: its group's number, the capacity, ``censored`` (None, below_min, above_max,
    at_ceiling), ``converged``, ``upper`` (NaN/None: unbounded) and its run's end)."""
    points, others = _where(dict(filters))
    with engine.connect() as conn:
        runs = _columns(conn, points, others) if engine.dialect.name == "postgresql" else None
        if runs is None:
            runs = _rows(conn, points, others)
        if runs.empty:
            return pd.DataFrame(columns=list(GROUPS_COLUMNS)), runs
        groups = _groups(conn, np.unique(runs["group_id"].to_numpy(dtype=np.int64)))
    return groups, runs


# Beside history.BY_CONFIG_COLUMNS in capacity over history from every valid run (``runs``: every
# valid run; ``median``: the estimator's): what the runs were and the median's censoring and
# interval (report.capacity_history).
CENSORED_COLUMNS = (
    "n_points", "n_censored_above", "n_censored_below", "n_unconverged", "censored_above_from",
    "censored_below_to", "median_censored", "median_low", "median_high", "median_level",
)
HISTORY_COLUMNS = (*history.BY_CONFIG_COLUMNS, *CENSORED_COLUMNS)
_COUNTS = ("n_points", "n_censored_above", "n_censored_below", "n_unconverged")
_NUMBERS = ("points_median", "p25", "p75", "min", "max", "censored_above_from", "censored_below_to", "npmle_median",
            "median_low", "median_high", "median_level")


def answers_from_summaries(filters: dict[str, Any]) -> bool:
    """Whether the summaries hold what ``filters`` ask (all time, no observed-fingerprint
    filter: what capacity_by_config answers from them too)."""
    return filters.get("since_days") is None and all(filters.get(k) is None for k in history.OBSERVED_FILTERS)


def from_summaries(engine: sa.Engine, **filters: Any) -> pd.DataFrame | None:
    """report.capacity_history's frame (HISTORY_COLUMNS, its order) from the summaries of the
    groups capacity_runs' ``filters`` choose (all time, no observed filter:
    answers_from_summaries), one row each: every run's figures (0014: ``runs`` every valid run,
    ``median`` the NPMLE's, ``last_measured`` the last of them all) beside the point
    estimates' quartiles, minimum, maximum and spread. None when the summaries cannot answer
    for one of those groups: its figures are not computed yet (``n_points`` NULL:
    summaries.refill), or its point estimates include a zero capacity (capacity_by_config counts
    it, the estimator reads it as censored below: the summary's quartiles are not the
    estimator's); the live path answers then."""
    cs = CapacitySummary
    config_filters, keyed = history._split({k: v for k, v in filters.items() if k != "since_days"})
    where = [*history._config_conditions(class_column=cs.class_name, **config_filters),
             *history._key_conditions(cs, **keyed)]
    src = (sa.select(cs.config_id, cs.class_name.label("class"), *(getattr(cs, k) for k in history.KEY_COLUMNS),
                     cs.runs, cs.median.label("points_median"), cs.p25, cs.p75, cs.min, cs.max,
                     *(getattr(cs, k) for k in (*_COUNTS, *_NUMBERS[5:], "median_censored")),
                     history._plain_time(cs.last_run_measured).label("last_run_measured"))
           .select_from(history._needed_from(cs, cs.config_id, cs.workload_sha256, where)).where(*where)
           .subquery("kept"))
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            got = _columns_of_summaries(conn, src)
            if isinstance(got, pd.DataFrame):
                return got
            if got is False:  # a group the summaries cannot answer for
                return None
        frame = pd.DataFrame.from_records(conn.execute(sa.select(src)).all(), columns=list(src.c.keys()))
        if frame.empty:
            return pd.DataFrame(columns=list(HISTORY_COLUMNS))
        counts = {c: pd.to_numeric(frame[c]) for c in _COUNTS}
        if counts["n_points"].isna().any() or (counts["n_points"] != frame["runs"]).any():
            return None
        frame = history._attach(conn, frame)
    number = {c: pd.to_numeric(frame[c]).to_numpy(dtype=float) for c in _NUMBERS}
    censored = frame["median_censored"].astype(object)
    out = frame.assign(
        simulated=frame["simulated"].astype(bool), runs=sum(c.to_numpy(dtype=np.int64) for c in counts.values()),
        median=number["npmle_median"], **{c: number[c] for c in ("p25", "p75", "min", "max")},
        spread=_spread(number["points_median"], number["p25"], number["p75"]),
        last_measured=pd.to_datetime(frame["last_run_measured"], utc=True),
        **{c: counts[c].to_numpy(dtype=np.int64) for c in _COUNTS},
        **{c: number[c] for c in ("censored_above_from", "censored_below_to", "median_low", "median_high",
                                  "median_level")},
        median_censored=censored.where(censored.notna(), None),
    )
    out = out.sort_values(["class", "median", "config_id", "workload_sha256", "ttft_ms", "tpot_ms", "backend",
                           "simulated"], ascending=[True, False, True, True, True, True, True, True], kind="stable")
    return out[list(HISTORY_COLUMNS)].reset_index(drop=True)


def _spread(mid: np.ndarray, p25: np.ndarray, p75: np.ndarray) -> np.ndarray:
    """(p75 - p25) / the points' median (NaN without points or at a zero median)."""
    with np.errstate(invalid="ignore"):
        return np.where(~np.isnan(mid) & (mid != 0), (p75 - p25) / np.where(mid != 0, mid, 1.0), np.nan)


def _columns_of_summaries(conn: sa.Connection, src: Any) -> pd.DataFrame | bool | None:
    """from_summaries on PostgreSQL by the columnar fetch and history_frame.assemble (thousands
    of groups: no Python object per value, no pandas sort): the frame; False when the
    summaries cannot answer; None when the columnar fetch cannot carry a value (a separator in
    a text: the caller fetches rows)."""
    nan: Any = sa.literal_column("'NaN'::float8")
    kinds = {"config_id": "int8", "class": "text", "workload_sha256": "text", "ttft_ms": "float8", "tpot_ms": "float8",
             "backend": "text", "simulated": "bool", "runs": "int8", **dict.fromkeys(_COUNTS, "int8"),
             **dict.fromkeys(_NUMBERS, "float8"), "median_censored": "text", "last_run_measured": "time"}
    names = list(kinds)
    exprs = []
    for name in names:  # NULLs as values the fetch carries: NaN, -1 (not computed), ''
        col = src.c[name]
        exprs.append(sa.func.coalesce(col, nan) if kinds[name] == "float8" else
                     sa.func.coalesce(col, -1) if name in _COUNTS else
                     sa.func.coalesce(col, "") if name == "median_censored" else col)
    got = history_frame.fetch_columns(conn, src, list(zip(exprs, kinds.values(), strict=True)))
    if got is None:
        return None
    c = dict(zip(names, got, strict=True))
    if not len(c["config_id"]):
        return pd.DataFrame(columns=list(HISTORY_COLUMNS))
    if (c["n_points"] < 0).any() or (c["n_points"] != c["runs"]).any():
        return False
    runs = c["n_points"] + c["n_censored_above"] + c["n_censored_below"] + c["n_unconverged"]
    cols = [c["config_id"], c["class"], c["workload_sha256"], c["ttft_ms"], c["tpot_ms"], c["backend"], c["simulated"],
            runs, c["npmle_median"], c["p25"], c["p75"], c["min"], c["max"], c["last_run_measured"]]
    extra = {k: c[k] for k in (*_COUNTS, "censored_above_from", "censored_below_to", "median_low", "median_high",
                               "median_level")}
    extra["spread"] = _spread(c["points_median"], c["p25"], c["p75"])
    extra["median_censored"] = np.array([v or None for v in c["median_censored"]], dtype=object)
    return history_frame.assemble(conn, cols, HISTORY_COLUMNS, history.CONFIG_COLUMNS, history.WORKLOAD_COLUMNS,
                                  extra)


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
