"""History queries over every experiment ever stored, as pandas DataFrames.

Only valid, finished runs count (a run that failed a guard is never evidence, DESIGN section 9).
Without a time range, capacity statistics come from the capacity summaries (one row per
configuration and class, kept by the repository). With one, they are aggregated live from the
capacities' own copies of their run's validity and end time (migration 0003): on
PostgreSQL in the database (percentile_cont); SQLite has no percentile aggregate, so there the
filtered rows are aggregated by pandas with the same (linear-interpolation) definition.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.sql import util as sa_util

from orchestrator.store import history_frame
from orchestrator.store.models import (
    Capacity,
    CapacitySummary,
    DeploymentConfig,
    Experiment,
    HistoryGroup,
    LoadPoint,
    Run,
    WorkloadSignatureRow,
)
from orchestrator.store.summaries import GROUP_KEYS, point_estimate
from orchestrator.store.types import utcnow

CONFIG_COLUMNS = (
    "label", "model", "gpu", "layout", "gpus", "tp", "kv_cache_dtype", "quantization",
    "max_num_seqs", "router_policy", "speculative_method", "engine_version",
)
STAT_COLUMNS = ("runs", "median", "p25", "p75", "min", "max", "spread", "last_measured")
# The comparable-history keys beside configuration and class (store.keys; DESIGN section 7).
KEY_COLUMNS = GROUP_KEYS
WORKLOAD_COLUMNS = ("workload", "input_mean", "output_tokens")
BY_CONFIG_COLUMNS = ("config_id", *CONFIG_COLUMNS, "class", *KEY_COLUMNS, *WORKLOAD_COLUMNS, *STAT_COLUMNS)
# Filters on the keys (and the workload's readable values), and on the observed fingerprint
# (only the capacities carry those: a filter on them aggregates live).
KEY_FILTERS = ("workload", "input_tokens", "output_tokens", "simulated", "backend", "ttft_ms", "tpot_ms")
OBSERVED_FILTERS = ("observed_gpu", "observed_engine")


def _config_conditions(
    *,
    model: str | None = None,
    gpu: str | None = None,
    layout: str | None = None,
    service_class: str | None = None,
    since_days: float | None = None,
    tp: int | None = None,
    kv_cache_dtype: str | None = None,
    quantization: str | None = None,
    max_num_seqs: int | None = None,
    router_policy: str | None = None,
    speculative_method: str | None = None,
    engine_version: str | None = None,
    config_id: int | None = None,
    class_column: Any = Capacity.class_name,
) -> list[sa.ColumnElement[bool]]:
    """WHERE clauses on the configuration and class; None means no filter on that column."""
    dc = DeploymentConfig
    exact = {
        dc.model: model, dc.gpu: gpu, dc.layout: layout, dc.tp: tp,
        dc.kv_cache_dtype: kv_cache_dtype, dc.quantization: quantization,
        dc.max_num_seqs: max_num_seqs, dc.router_policy: router_policy,
        dc.speculative_method: speculative_method, dc.engine_version: engine_version,
        dc.id: config_id, class_column: service_class,
    }
    return [col == value for col, value in exact.items() if value is not None]


def _frame(result: sa.CursorResult[Any], columns: list[str] | None = None) -> pd.DataFrame:
    """A query's rows as a DataFrame, built from tuples (a dict per row costs ~10x more at
    thousands of rows); empty with ``columns`` when given."""
    names = list(result.keys())
    rows = result.all()
    if not rows:
        return pd.DataFrame(columns=columns) if columns is not None else pd.DataFrame()
    return pd.DataFrame(dict(zip(names, zip(*rows, strict=True), strict=True)), columns=names)


def _key_conditions(
    src: Any,
    *,
    workload: str | None = None,
    input_tokens: tuple[float | None, float | None] | None = None,
    output_tokens: tuple[float | None, float | None] | None = None,
    simulated: bool | None = None,
    backend: str | None = None,
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
    observed_gpu: str | None = None,
    observed_engine: str | None = None,
) -> list[sa.ColumnElement[bool]]:
    """WHERE clauses on the comparable-history keys of ``src`` (Capacity or CapacitySummary),
    the workload's values (WorkloadSignatureRow, joined) and the observed fingerprint
    (Capacity only). ``workload``: a signature or a prefix of it; ranges (lo, hi) inclusive,
    None an open end; ``observed_gpu``: a substring of the observed GPU products."""
    ws = WorkloadSignatureRow
    out: list[sa.ColumnElement[bool]] = []
    if workload is not None:
        out.append(src.workload_sha256.startswith(workload.lower(), autoescape=True))
    for col, bounds in ((ws.input_mean, input_tokens), (ws.output_tokens, output_tokens)):
        lo, hi = bounds or (None, None)
        if lo is not None:
            out.append(col >= lo)
        if hi is not None:
            out.append(col <= hi)
    if simulated is not None:
        out.append(src.simulated.is_(bool(simulated)))
    for col, value in ((src.backend, backend), (src.ttft_ms, ttft_ms), (src.tpot_ms, tpot_ms)):
        if value is not None:
            out.append(col == value)
    if observed_gpu is not None:
        out.append(Capacity.observed_gpu.contains(observed_gpu, autoescape=True))
    if observed_engine is not None:
        out.append(Capacity.observed_engine == observed_engine)
    return out


def _split(filters: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(configuration filters, key and observed filters)."""
    keyed = {k: filters.pop(k) for k in (*KEY_FILTERS, *OBSERVED_FILTERS) if k in filters}
    return filters, keyed


def _conditions(since_days: float | None = None, every_run: bool = False, **filters: Any) -> list[sa.ColumnElement[bool]]:
    """WHERE clauses of the live aggregate: valid finished runs' point estimates (no censored
    or unconverged capacity; ``every_run``: those too), the filters, the time range."""
    filters, keyed = _split(filters)
    out = [Run.valid.is_(True), Run.status == "done", *(() if every_run else point_estimate()),
           *_config_conditions(**filters), *_key_conditions(Capacity, **keyed)]
    if since_days is not None:
        out.append(Run.finished_at >= utcnow() - timedelta(days=since_days))
    return out


def _counted_conditions(since_days: float | None = None, **filters: Any) -> list[sa.ColumnExpressionArgument[bool]]:
    """WHERE clauses of the live aggregate, on the capacities' own copies of their run's
    validity and end time (one range of ix_capacities_counted_measured_at, no join to runs)."""
    filters, keyed = _split(filters)
    out: list[sa.ColumnExpressionArgument[bool]] = [Capacity.counted, *_config_conditions(**filters),
                                                    *_key_conditions(Capacity, **keyed)]
    if since_days is not None:
        out.append(Capacity.measured_at >= utcnow() - timedelta(days=since_days))
    return out


def _counted_from() -> Any:
    return sa.join(Capacity, DeploymentConfig, DeploymentConfig.id == Capacity.config_id).outerjoin(
        WorkloadSignatureRow, WorkloadSignatureRow.sha256 == Capacity.workload_sha256)


def _workload_columns() -> tuple[Any, ...]:
    ws = WorkloadSignatureRow
    return (ws.summary.label("workload"), ws.input_mean, ws.output_tokens)


def _base_from() -> Any:
    return sa.join(Capacity, Run, Capacity.run_id == Run.id).join(
        DeploymentConfig, DeploymentConfig.id == Run.config_id
    )


def capacity_by_config(engine: sa.Engine, **filters: Any) -> pd.DataFrame:
    """Per comparable group (configuration, class and its limits, workload signature, backend,
    simulated or measured: never pooled across them): runs, median capacity, quartiles, min,
    max, relative spread ((p75 - p25) / median) and the date last measured, with the workload's
    readable summary. Filters: model, gpu, layout, service_class, since_days, tp,
    kv_cache_dtype, quantization, max_num_seqs, router_policy, speculative_method,
    engine_version, config_id; workload (signature prefix), input_tokens and output_tokens
    ((lo, hi) ranges of the workload's mean prompt and reply), simulated (True/False; None:
    both), backend, ttft_ms, tpot_ms; observed_gpu, observed_engine (the run's fingerprint)."""
    return _capacity_by_config(engine, filters)


def _capacity_by_config(engine: sa.Engine, filters: dict[str, Any], min_runs: int = 1,
                        order: str = "median", limit: int | None = None) -> pd.DataFrame:
    """capacity_by_config without per-row work: the per-group statistics (the summaries, or the
    live aggregate) fetched narrow as the driver's tuples into one DataFrame, the configurations'
    and workloads' columns fetched once each and placed by reindex, sorted by pandas. With
    ``limit`` (best_config) the join, the filter on runs, the sort and the LIMIT are one SQL
    statement instead. ``order``: "median" (class, median descending, configuration:
    capacity_by_config's order) or "per_gpu"/"median_only" (best_config's: that figure
    descending, then configuration); ``min_runs``: groups with fewer runs left out. SQLite's
    time-ranged aggregate (pandas) takes the old path: small histories."""
    live = any(filters.get(k) is not None for k in OBSERVED_FILTERS)
    postgres = engine.dialect.name == "postgresql"
    with engine.begin() as conn:
        if filters.get("since_days") is None and not live:
            stats = _summaries_stmt({k: v for k, v in filters.items() if k != "since_days"})
        elif postgres:
            # keep the sort of a long time range in memory (the default 4 MB spills to disk)
            conn.execute(sa.text("SET LOCAL work_mem = '64MB'"))
            stats = _group_stats_stmt(filters)
        else:
            raw = _aggregate_in_pandas(conn, _counted_conditions(**filters))
            return _finish(_decorate(conn, _unknown_keys(raw)) if not raw.empty else raw, min_runs, order, limit)
        if limit is None:  # every group: fetched narrow, decorated and sorted here
            if postgres and min_runs == 1 and order == "median":
                keyed = _keyed(stats)
                # a time range: numpy aggregates the range's capacities (an observed filter over all
                # time reads the by-group index in order: PostgreSQL aggregates that without a sort)
                ranged = filters.get("since_days") is not None
                cols = history_frame.live_columns(conn, _live_where(filters)) if ranged else None
                if cols is None:
                    cols = history_frame.stat_columns(conn, keyed, _last_measured(keyed, postgres))
                if cols is None:  # a key holds the columnar fetch's separator: row by row
                    cols = list(zip(*_stat_rows(conn, stats, postgres)[0], strict=True)) or [[]] * 14
                if not len(cols[0]):
                    return pd.DataFrame(columns=list(BY_CONFIG_COLUMNS))
                return history_frame.assemble(conn, cols, BY_CONFIG_COLUMNS, CONFIG_COLUMNS, WORKLOAD_COLUMNS)
            rows, names = _stat_rows(conn, stats, postgres)
            if not rows:
                return pd.DataFrame(columns=list(BY_CONFIG_COLUMNS))
            frame = _attach(conn, _records(rows, names, postgres))
            return _finish(frame, min_runs, order, None)
        rows, names = _joined_rows(conn, stats, postgres, min_runs, order, limit)
    if not rows:
        return pd.DataFrame(columns=list(BY_CONFIG_COLUMNS))
    return _finish(_records(rows, names, postgres), min_runs, order, None, sorted_=True)


def _records(rows: Sequence[Any], names: list[str], postgres: bool) -> pd.DataFrame:
    """Plain tuples into one DataFrame (one from_records call, no per-row work)."""
    frame = pd.DataFrame.from_records(rows, columns=names)
    if postgres:  # epoch microseconds (exact) to timestamps, vectorised
        frame["last_measured"] = pd.to_datetime(frame["last_measured"], unit="us", utc=True)
    return frame


def _last_measured(stats: Any, postgres: bool) -> Any:
    last = _plain_time(stats.c.last_measured)
    if postgres:  # exact epoch microseconds: one vectorised conversion instead of a datetime per row
        last = sa.cast(sa.extract("epoch", last) * 1_000_000, sa.BigInteger)
    return last.label("last_measured")


def _fetch(conn: sa.Connection, stmt: Any, postgres: bool) -> tuple[Sequence[Any], list[str]]:
    if postgres:  # plain tuples from the driver, in binary (no column here needs result processing)
        result = conn.execute(stmt, execution_options=history_frame.BINARY)
        return result.cursor.fetchall(), list(result.keys())
    result = conn.execute(stmt)
    return result.all(), list(result.keys())


def _keyed(stats: Any) -> Any:
    """``stats`` with its unknown keys as the summaries store them ('' / 0 / False)."""
    unknown = {"workload_sha256": "", "backend": "", "ttft_ms": 0.0, "tpot_ms": 0.0, "simulated": False}
    keys = [sa.func.coalesce(stats.c[k], unknown[k]).label(k) for k in KEY_COLUMNS]
    return sa.select(*(c for c in stats.c if c.key not in KEY_COLUMNS), *keys).subquery("keyed")


def _stat_rows(conn: sa.Connection, stats: Any, postgres: bool) -> tuple[Sequence[Any], list[str]]:
    """The per-group statistics alone (unknown keys as the summaries store them), unsorted, in
    history_frame.STAT_ROW order."""
    unknown = {"workload_sha256": "", "backend": "", "ttft_ms": 0.0, "tpot_ms": 0.0, "simulated": False}
    keys = {k: sa.func.coalesce(stats.c[k], unknown[k]).label(k) for k in KEY_COLUMNS}
    return _fetch(conn, sa.select(
        stats.c.config_id, stats.c["class"], *(keys[k] for k in history_frame.STAT_ROW[2:7]),
        stats.c.runs, stats.c.median, stats.c.p25, stats.c.p75, stats.c.min, stats.c.max, _last_measured(stats, postgres),
    ), postgres)


def _attach(conn: sa.Connection, frame: pd.DataFrame) -> pd.DataFrame:
    """The configurations' columns and the workloads' readable values beside each group: one
    query each (the distinct configurations and workloads), placed by position (no merge)."""
    dc, ws = DeploymentConfig, WorkloadSignatureRow
    ids = sorted({int(i) for i in frame["config_id"].unique()})
    configs = pd.DataFrame.from_records(
        conn.execute(sa.select(dc.id, *(getattr(dc, c) for c in CONFIG_COLUMNS)).where(dc.id.in_(ids))).all(),
        columns=["config_id", *CONFIG_COLUMNS]).set_index("config_id")
    shas = sorted({str(x) for x in frame["workload_sha256"].unique() if x})
    workloads = pd.DataFrame.from_records(
        conn.execute(sa.select(ws.sha256, *_workload_columns()).where(ws.sha256.in_(shas))).all() if shas else [],
        columns=["workload_sha256", *WORKLOAD_COLUMNS]).set_index("workload_sha256")
    return pd.concat([frame, configs.reindex(frame["config_id"].to_numpy()).reset_index(drop=True),
                      workloads.reindex(frame["workload_sha256"].to_numpy()).reset_index(drop=True)], axis=1)


def _unknown_keys(frame: pd.DataFrame) -> pd.DataFrame:
    for k, unknown in (("workload_sha256", ""), ("backend", ""), ("ttft_ms", 0.0), ("tpot_ms", 0.0),
                       ("simulated", False)):
        frame[k] = frame[k].where(frame[k].notna(), unknown)  # as the summaries store an unknown key
    return frame


def _finish(frame: pd.DataFrame, min_runs: int, order: str, limit: int | None, sorted_: bool = False) -> pd.DataFrame:
    if frame.empty:
        return pd.DataFrame(columns=list(BY_CONFIG_COLUMNS))
    frame["simulated"] = frame["simulated"].astype(bool)
    frame["last_measured"] = pd.to_datetime(frame["last_measured"], utc=True)
    frame["spread"] = (frame["p75"] - frame["p25"]) / frame["median"].where(frame["median"] != 0)
    if not sorted_:
        if min_runs > 1:
            frame = frame[frame["runs"] >= min_runs]
        # equal medians: the keys decide, so the order never depends on a scan (history_frame's too)
        frame = frame.sort_values(["class", "median", "config_id", "workload_sha256", "ttft_ms", "tpot_ms", "backend",
                                   "simulated"], ascending=[True, False, True, True, True, True, True, True],
                                  kind="stable")
        if order != "median":
            key = frame["median"] / frame["gpus"] if order == "per_gpu" else frame["median"]
            frame = frame.assign(_key=key).sort_values(["_key", "config_id"], ascending=[False, True], kind="stable")
        if limit is not None:
            frame = frame.head(limit)
    return frame[list(BY_CONFIG_COLUMNS)].reset_index(drop=True)


def _summaries_stmt(filters: dict[str, Any]) -> Any:
    """The summaries' rows matching ``filters`` (a subquery of the per-group statistics) that have
    a point estimate (a group of censored runs only has a row since 0014, for capacity_history)."""
    cs = CapacitySummary
    filters, keyed = _split(filters)
    where = [*_config_conditions(class_column=cs.class_name, **filters), *_key_conditions(cs, **keyed)]
    where.append(cs.runs > 0)
    return (
        sa.select(
            cs.config_id, cs.class_name.label("class"), *(getattr(cs, k) for k in KEY_COLUMNS),
            cs.runs, cs.median, cs.p25, cs.p75, cs.min, cs.max, cs.last_measured.label("last_measured"),
        )
        .where(*where)
    ).select_from(_needed_from(cs, cs.config_id, cs.workload_sha256, where)).subquery("stats")


def _group_stats_stmt(filters: dict[str, Any]) -> Any:
    """PostgreSQL: the live aggregate (percentile_cont) per comparable group, as a subquery: the
    counted capacities of the time range and observed filters, in the groups the other filters
    choose (history_groups), grouped by their group number (0010), the group's columns joined
    onto each result row. Without a time range the chosen groups are an ordered array, so the
    by-group index is read in group order and nothing is sorted (24,000 capacities: 20 -> 8 ms)."""
    hg, cap = HistoryGroup, Capacity.capacity
    agg = (
        sa.select(
            Capacity.group_id, sa.func.count().label("runs"),
            sa.func.percentile_cont(0.5).within_group(cap).label("median"),
            sa.func.percentile_cont(0.25).within_group(cap).label("p25"),
            sa.func.percentile_cont(0.75).within_group(cap).label("p75"),
            sa.func.min(cap).label("min"), sa.func.max(cap).label("max"),
            sa.func.max(Capacity.measured_at).label("last_measured"),
        )
        .where(*_live_where(filters))
        .group_by(Capacity.group_id)
    ).subquery("agg")
    return (
        sa.select(hg.config_id, hg.class_name.label("class"), *(getattr(hg, k) for k in KEY_COLUMNS),
                  *(agg.c[k] for k in ("runs", "median", "p25", "p75", "min", "max", "last_measured")))
        .select_from(agg.join(hg, hg.id == agg.c.group_id))
    ).subquery("stats")


def _live_where(filters: dict[str, Any]) -> list[Any]:
    """The capacities a live aggregate reads: counted, in the time range, matching the observed
    filters, in the groups the other filters choose."""
    filters = dict(filters)
    since = filters.pop("since_days", None)
    filters, keyed = _split(filters)
    observed = {k: keyed.pop(k) for k in OBSERVED_FILTERS if k in keyed}
    hg = HistoryGroup
    chosen = [*_config_conditions(class_column=hg.class_name, **filters), *_key_conditions(hg, **keyed)]
    where: list[Any] = [Capacity.counted, Capacity.group_id.is_not(None), *_key_conditions(Capacity, **observed)]
    if since is not None:
        where.append(Capacity.measured_at >= utcnow() - timedelta(days=since))
    if chosen:
        ids = sa.select(hg.id).select_from(_needed_from(hg, hg.config_id, hg.workload_sha256, chosen)).where(*chosen)
        if since is None:  # all time (an observed filter): each chosen group's capacities, in group order
            where.append(Capacity.group_id == sa.any_(sa.func.array(ids.order_by(hg.id).scalar_subquery())))
        else:  # one range of the time index, the groups a hashed semi-join
            where.append(Capacity.group_id.in_(ids))
    return where


def _needed_from(src: Any, config_id: Any, workload_sha256: Any, where: list[Any]) -> Any:
    """``src`` joined to the configurations and the workloads only when ``where`` reads them
    (each join keeps every row: a foreign key, a left join on a unique key)."""
    tables = {t for w in where for t in sa_util.find_tables(sa.and_(w), check_columns=True)}
    out = src.__table__
    if DeploymentConfig.__table__ in tables:
        out = out.join(DeploymentConfig, DeploymentConfig.id == config_id)
    if WorkloadSignatureRow.__table__ in tables:
        out = out.outerjoin(WorkloadSignatureRow, WorkloadSignatureRow.sha256 == workload_sha256)
    return out


def _joined_rows(conn: sa.Connection, stats: Any, postgres: bool, min_runs: int, order: str,
                 limit: int | None) -> tuple[Sequence[Any], list[str]]:
    """The per-group statistics with their configuration's columns and workload's values, in
    BY_CONFIG_COLUMNS order (spread computed later), sorted as ``order`` says."""
    dc, ws = DeploymentConfig, WorkloadSignatureRow
    unknown = {"workload_sha256": "", "backend": "", "ttft_ms": 0.0, "tpot_ms": 0.0, "simulated": False}
    cols: list[Any] = [stats.c.config_id, *(getattr(dc, c) for c in CONFIG_COLUMNS), stats.c["class"]]
    cols += [sa.func.coalesce(stats.c[k], unknown[k]).label(k) for k in KEY_COLUMNS]
    cols += list(_workload_columns())
    last = _plain_time(stats.c.last_measured)
    if postgres:  # exact epoch microseconds: one vectorised conversion instead of a datetime per row
        last = sa.cast(sa.extract("epoch", last) * 1_000_000, sa.BigInteger)
    cols += [stats.c.runs, stats.c.median, stats.c.p25, stats.c.p75, stats.c.min, stats.c.max,
             sa.literal(None).label("spread"), last.label("last_measured")]
    # code-point order of the class (as pandas sorts), whatever the database's collation
    cls = stats.c["class"].collate("C") if postgres else stats.c["class"]
    ties = [stats.c[k] for k in KEY_COLUMNS]
    if order == "median":
        by = [cls, stats.c.median.desc(), stats.c.config_id, *ties]
    else:
        key = stats.c.median / dc.gpus if order == "per_gpu" else stats.c.median
        by = [key.desc(), stats.c.config_id, cls, *ties]
    stmt = (
        sa.select(*cols)
        .select_from(stats.join(dc, dc.id == stats.c.config_id).outerjoin(ws, ws.sha256 == stats.c.workload_sha256))
        .order_by(*by)
    )
    if min_runs > 1:
        stmt = stmt.where(stats.c.runs >= min_runs)
    if limit is not None:
        stmt = stmt.limit(limit)
    return _fetch(conn, stmt, postgres)


def _plain_time(column: Any) -> Any:
    """A timestamp column without the per-row UTCDateTime conversion (done once, vectorised, by
    pandas: aware values on PostgreSQL, naive UTC text on SQLite)."""
    return sa.type_coerce(column, sa.DateTime(timezone=True))


def _decorate(conn: sa.Connection, frame: pd.DataFrame) -> pd.DataFrame:
    """Join the configurations' columns and the workloads' readable values onto per-group
    statistics (fetched once per configuration and workload, not once per group)."""
    dc, ws = DeploymentConfig, WorkloadSignatureRow
    ids = [int(i) for i in frame["config_id"].unique()]
    configs = _frame(conn.execute(
        sa.select(dc.id.label("config_id"), *(getattr(dc, c) for c in CONFIG_COLUMNS)).where(dc.id.in_(ids))
    ), ["config_id", *CONFIG_COLUMNS])
    shas = [str(x) for x in frame["workload_sha256"].unique() if x]
    workloads = _frame(conn.execute(
        sa.select(ws.sha256.label("workload_sha256"), *_workload_columns()).where(ws.sha256.in_(shas))
    ), ["workload_sha256", *WORKLOAD_COLUMNS])
    return frame.merge(configs, on="config_id", how="left").merge(workloads, on="workload_sha256", how="left")


def _aggregate_in_pandas(conn: sa.Connection, where: list[sa.ColumnExpressionArgument[bool]]) -> pd.DataFrame:
    """SQLite (no percentile aggregate): the filtered capacities aggregated by pandas with the
    same linear-interpolation quartiles."""
    stmt = (
        sa.select(
            Capacity.config_id, Capacity.class_name.label("class"), *(getattr(Capacity, k) for k in KEY_COLUMNS),
            Capacity.capacity, _plain_time(Capacity.measured_at).label("finished_at"),
        )
        .select_from(_counted_from()).where(*where)
    )
    raw = _frame(conn.execute(stmt))
    if raw.empty:
        return raw
    keys = ["config_id", "class", *KEY_COLUMNS]
    grouped = raw.groupby(keys, sort=False, dropna=False)
    stats = grouped["capacity"].agg(
        runs="count", median="median", p25=lambda s: s.quantile(0.25),
        p75=lambda s: s.quantile(0.75), min="min", max="max",
    )
    stats["last_measured"] = grouped["finished_at"].max()
    return stats.reset_index()


def capacity_per_gpu(engine: sa.Engine, **filters: Any) -> pd.DataFrame:
    """Per GPU type, model and class: capacity per GPU (median capacity / GPUs of the
    configuration) of the best configuration, which one it is, and how much evidence there is."""
    by_config = capacity_by_config(engine, **filters)
    columns = ["gpu", "model", "class", "workload_sha256", "workload", "simulated", "configs", "runs",
               "best_per_gpu", "best_config_id", "best_label", "median_per_gpu", "last_measured"]
    if by_config.empty:
        return pd.DataFrame(columns=columns)
    fast = history_frame.per_gpu(by_config, columns)
    if fast is not None:
        return fast
    return history_frame.per_gpu_pandas(by_config, columns)


def best_config(
    engine: sa.Engine, service_class: str, top: int = 1, per_gpu: bool = False,
    min_runs: int = 1, **filters: Any,
) -> pd.DataFrame:
    """The configurations with the highest median capacity at a class (or per GPU), best first."""
    frame = _capacity_by_config(engine, {"service_class": service_class, **filters}, min_runs=min_runs,
                                order="per_gpu" if per_gpu else "median_only", limit=top)
    return frame.assign(per_gpu=frame["median"] / frame["gpus"])


def config_trend(
    engine: sa.Engine, config_id: int, service_class: str | None = None, since_days: float | None = None,
    every_run: bool = False, **keys: Any,
) -> pd.DataFrame:
    """A configuration's capacity run by run over time (valid runs only: point estimates, or with
    ``every_run`` censored and unconverged capacities too, with their ``censored``, ``converged``
    and ``upper`` columns), oldest first; ``keys``: the key filters of capacity_by_config
    (workload, simulated, backend, ttft_ms, ...)."""
    where = _conditions(config_id=config_id, service_class=service_class, since_days=since_days,
                        every_run=every_run, **keys)
    censoring = (Capacity.censored, Capacity.converged, Capacity.upper) if every_run else ()
    stmt = (
        sa.select(
            Run.finished_at.label("measured_at"), Run.id.label("run_id"),
            Experiment.name.label("experiment"), Capacity.class_name.label("class"),
            Capacity.capacity, Capacity.at_rate, Capacity.attainment, Run.engine_version, *censoring,
        )
        .select_from(_base_from().join(Experiment, Experiment.id == Run.experiment_id).outerjoin(
            WorkloadSignatureRow, WorkloadSignatureRow.sha256 == Capacity.workload_sha256))
        .where(*where)
        .order_by(Run.finished_at, Run.id, Capacity.class_name)
    )
    columns = ["measured_at", "run_id", "experiment", "class", "capacity", "at_rate", "attainment",
               "engine_version", *(c.key for c in censoring)]
    with engine.connect() as conn:
        return _frame(conn.execute(stmt), columns)


def config_details(engine: sa.Engine, config_ids: list[int]) -> dict[int, dict[str, Any]]:
    """The shape (layout, GPUs, replicas and TP of each pool) and the JSON of configurations."""
    dc = DeploymentConfig
    cols = (dc.id, dc.label, dc.model, dc.gpu, dc.layout, dc.gpus, dc.tp, dc.replicas, dc.prefill_replicas,
            dc.prefill_tp, dc.decode_replicas, dc.decode_tp, dc.engine_version, dc.config)
    if not config_ids:
        return {}
    with engine.connect() as conn:
        rows = conn.execute(sa.select(*cols).where(dc.id.in_(sorted(set(config_ids))))).all()
    return {int(r.id): dict(r._mapping) for r in rows}


def workload_signatures(engine: sa.Engine, prefix: str | None = None) -> list[dict[str, Any]]:
    """Stored workload signatures (all, or those whose sha256 starts with ``prefix``)."""
    ws = WorkloadSignatureRow
    stmt = sa.select(ws.sha256, ws.summary, ws.input_mean, ws.input_sd, ws.output_tokens, ws.shared_prefix,
                     ws.arrival, ws.doc).order_by(ws.sha256)
    if prefix is not None:
        stmt = stmt.where(ws.sha256.startswith(prefix.lower(), autoescape=True))
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(stmt)]


def load_points(engine: sa.Engine, **filters: Any) -> pd.DataFrame:
    """Every valid open-loop load point of a valid finished run, with its configuration, the
    run's comparable keys (workload, simulated) and its TPOT median: the input of a Pareto front
    (report.history.pareto_front). Filters: the configuration filters of capacity_by_config and
    workload, simulated, since_days. Points of runs with no capacity (no keys) are left out."""
    dc = DeploymentConfig
    since = filters.pop("since_days", None)
    workload, simulated = filters.pop("workload", None), filters.pop("simulated", None)
    filters.pop("service_class", None)  # a point serves every class at once
    postgres = engine.dialect.name == "postgresql"
    measured = [LoadPoint.valid.is_(True), LoadPoint.offered_rate.is_not(None), LoadPoint.throughput_tok_s.is_not(None)]
    # the keys of the runs that have such points only (not a group-by over every capacity)
    keys = (sa.select(Capacity.run_id, sa.func.max(Capacity.workload_sha256).label("workload_sha256"),
                      sa.func.max(sa.cast(Capacity.simulated, sa.Integer)).label("simulated"))
            .where(Capacity.run_id.in_(sa.select(LoadPoint.run_id).where(*measured)))
            .group_by(Capacity.run_id).subquery())
    where = [Run.valid.is_(True), Run.status == "done", *measured, keys.c.workload_sha256.is_not(None),
             *_config_conditions(**filters)]
    if workload is not None:
        where.append(keys.c.workload_sha256.startswith(workload.lower(), autoescape=True))
    if simulated is not None:
        where.append(keys.c.simulated == int(bool(simulated)))
    if since is not None:
        where.append(Run.finished_at >= utcnow() - timedelta(days=since))
    columns = ["config_id", "label", "model", "gpu", "gpus", "workload_sha256", "simulated", "run_id",
               "point_id", "offered_rate", "throughput_tok_s", "tpot_p50_s"]
    cols = (dc.id.label("config_id"), dc.label, dc.model, dc.gpu, dc.gpus, keys.c.workload_sha256, keys.c.simulated,
            LoadPoint.run_id, LoadPoint.id.label("point_id"), LoadPoint.offered_rate, LoadPoint.throughput_tok_s)
    from_ = (sa.join(LoadPoint, Run, Run.id == LoadPoint.run_id).join(dc, dc.id == Run.config_id)
             .join(keys, keys.c.run_id == Run.id))
    with engine.connect() as conn:
        if postgres:  # the TPOT median read and checked by the server: no document leaves it
            tpot = history_frame.tpot_p50(LoadPoint.percentiles).label("tpot_p50_s")
            found = sa.select(*cols, tpot).select_from(from_).where(*where, tpot > 0).subquery("points")
            got = history_frame.fetch_columns(
                conn, found, list(zip(found.c, history_frame.POINT_KINDS, strict=True)))
            if got is None:  # a NULL key or a separator in a label: row by row
                rows = _fetch(conn, sa.select(found), True)[0]
                frame = pd.DataFrame(list(rows), columns=columns)
            elif not len(got[0]):
                frame = pd.DataFrame([], columns=columns)
            else:
                frame = history_frame.points_frame(got, columns)
        else:
            rows = []
            for r in conn.execute(sa.select(*cols, LoadPoint.percentiles).select_from(from_).where(*where)):
                tpot_p50 = ((r.percentiles or {}).get("tpot_s") or {}).get("p50")
                if isinstance(tpot_p50, int | float) and tpot_p50 > 0:
                    rows.append((*r[:-1], float(tpot_p50)))
            frame = pd.DataFrame(rows, columns=columns)
        shas = [str(x) for x in frame["workload_sha256"].unique()]
        ws = WorkloadSignatureRow
        names = dict(conn.execute(sa.select(ws.sha256, ws.summary).where(ws.sha256.in_(shas))).all()) if shas else {}
    frame["simulated"] = frame["simulated"].astype(bool)
    frame["workload"] = frame["workload_sha256"].map(names)
    return frame
