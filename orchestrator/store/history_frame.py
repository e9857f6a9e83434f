"""capacity_by_config's frame from per-group statistics without per-row pandas work (PostgreSQL).

Thousands of groups (an unfiltered history: 6,912 in benchmarks/store_bench.py) made the frame
itself most of a query's time: a DataFrame from tuples (type inference per column), a concat of
the configurations' and workloads' columns, a three-key pandas sort, each over ~26 columns. Here
the statistics' columns become typed numpy arrays once, the order is one ``numpy.lexsort`` over
those arrays, and the configurations' and workloads' columns (a few hundred rows and a handful)
are placed in that order by one reindex each; the frame is built once, in its final order, from
arrays that need no inference. The frame equals what history._finish makes of the same groups
(tests/integration/test_history_speed.py compares them column by column, dtypes included).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

from orchestrator.store.models import Capacity, DeploymentConfig, HistoryGroup, WorkloadSignatureRow

# the per-group statistics, in this order (history._stat_rows)
STAT_ROW = ("config_id", "class", "workload_sha256", "ttft_ms", "tpot_ms", "backend", "simulated", "runs",
            "median", "p25", "p75", "min", "max", "last_measured")


class _Text:
    """A text column of few distinct values (classes, workloads, backends) as codes into its
    sorted distinct values: the codes sort in code-point order (as pandas sorts text) and the
    column is rebuilt in any order by one take, with no per-row string work."""

    def __init__(self, values: Sequence[Any]):
        self.distinct = sorted(set(values))
        index = {v: i for i, v in enumerate(self.distinct)}
        self.codes = np.fromiter(map(index.__getitem__, values), dtype=np.intp, count=len(values))

    def column(self, order: np.ndarray) -> Any:
        return pd.array(self.distinct, dtype="str").take(self.codes[order])


NO_TIME = np.iinfo(np.int64).min  # an unknown time in a columnar fetch (string_agg skips NULLs)


def _times(values: Sequence[Any], order: np.ndarray) -> Any:
    """Epoch microseconds (None or NO_TIME: unknown) to UTC timestamps in ``order``, as
    history._records converts them (an unknown time: NaN, so NaT, through floats as there)."""
    arr = np.asarray([np.nan if v is None else v for v in values] if None in values else values)
    if arr.dtype == np.int64 and (arr == NO_TIME).any():
        arr = np.where(arr == NO_TIME, np.nan, arr.astype(np.float64))
    return pd.to_datetime(arr[order], unit="us", utc=True)


# One column of a columnar fetch: numbers as their binary send format concatenated (one bytes
# object, read by numpy.frombuffer), text joined by a separator no key contains (checked).
_SEP = "\x1f"
_BINARY = {"int8": ">i8", "float8": ">f8", "bool": "?", "time": ">i8"}
_EPOCH_2000_US = 946_684_800_000_000  # 2000-01-01 in Unix microseconds


STAT_KINDS = {"config_id": "int8", "class": "text", "workload_sha256": "text", "ttft_ms": "float8",
              "tpot_ms": "float8", "backend": "text", "simulated": "bool", "runs": "int8", "median": "float8",
              "p25": "float8", "p75": "float8", "min": "float8", "max": "float8", "last_measured": "int8"}
_DTYPES = {"int8": np.int64, "float8": np.float64, "bool": bool, "time": np.int64}


def fetch_columns(conn: sa.Connection, source: Any, columns: Sequence[tuple[Any, str]]) -> list[Any] | None:
    """The ``columns`` ((expression, kind): int8, float8, bool or text) of the rows of
    ``source`` (a subquery) as one value each, in one row instead of a row per result row:
    thousands of rows cost PostgreSQL and the driver a Python object per value (~7 ms at 6,912
    groups of 14 columns; this way ~4): numbers as numpy arrays, text as lists. None when a
    number is NULL or a text holds the separator (the caller fetches rows then)."""
    nothing: Any = sa.literal_column("''::bytea")
    aggs = []
    for col, kind in columns:
        if kind == "text":
            aggs.append(sa.func.string_agg(col, sa.literal(_SEP, sa.Text)))
            continue
        if kind == "time":  # microseconds since 2000-01-01 (PostgreSQL's own), unknown: NO_TIME
            aggs.append(sa.func.string_agg(sa.func.coalesce(sa.func.timestamptz_send(col), sa.literal_column(
                "'\\x8000000000000000'::bytea")), nothing))
            continue
        if kind == "int8":
            col = sa.cast(col, sa.BigInteger)
        aggs.append(sa.func.string_agg(getattr(sa.func, kind + "send")(col), nothing))
    aggs.append(sa.func.count())
    row = _raw(conn, sa.select(*aggs).select_from(source))[0]
    n = row[-1]
    out: list[Any] = []
    for (_, kind), value in zip(columns, row[:-1], strict=True):
        if kind == "text":
            parts = value.split(_SEP) if n else []
            if len(parts) != n:
                return None
            out.append(parts)
            continue
        arr = np.frombuffer(value or b"", dtype=_BINARY[kind])
        if len(arr) != n:  # string_agg skipped a NULL
            return None
        arr = arr.astype(_DTYPES[kind])
        out.append(np.where(arr == NO_TIME, NO_TIME, arr + _EPOCH_2000_US) if kind == "time" else arr)
    return out


def _ids(ids: np.ndarray) -> Any:
    """SQL: ``ids`` as a bigint[] from one text parameter (the driver adapts a list of
    thousands of ints ~10x slower than it joins them)."""
    return sa.cast(sa.func.string_to_array(sa.literal(",".join(map(str, ids.tolist())), sa.Text), ","),
                   ARRAY(sa.BigInteger))


def _percentile(values: np.ndarray, starts: np.ndarray, counts: np.ndarray, q: float) -> np.ndarray:
    """percentile_cont(q) of each group (``values`` sorted within groups), with PostgreSQL's
    arithmetic: rows floor/ceil(q * (n - 1)), lo + (q * (n - 1) - first) * (hi - lo) between
    two rows (summaries.quantile's, so a live figure equals a summary's bit for bit)."""
    pos = q * (counts - 1).astype(np.float64)
    first, second = np.floor(pos), np.ceil(pos)
    lo, hi = values[starts + first.astype(np.intp)], values[starts + second.astype(np.intp)]
    with np.errstate(invalid="ignore"):
        return np.where(first == second, lo, lo + (pos - first) * (hi - lo))


def live_columns(conn: sa.Connection, where: Sequence[Any]) -> list[Any] | None:
    """The live aggregate's STAT_ROW columns computed here from the matching capacities (group
    number, capacity, time: three numbers each, fetched as columns): one numpy sort by group and
    capacity instead of PostgreSQL's sort by group and a tuplesort per group and percentile
    (17,000 capacities in 3,438 groups: ~7 of 12 ms there). None: the caller aggregates in SQL."""
    src = sa.select(Capacity.group_id, Capacity.capacity, Capacity.measured_at).where(*where).subquery("live")
    got = fetch_columns(conn, src, [(src.c.group_id, "int8"), (src.c.capacity, "float8"), (src.c.measured_at, "time")])
    if got is None:
        return None
    group, value, stamp = got
    if not len(group):
        return [[] for _ in STAT_ROW]
    order = np.lexsort((value, group))
    group, value, stamp = group[order], value[order], stamp[order]
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    counts = np.diff(np.r_[starts, len(group)])
    hg = HistoryGroup
    dims_src = sa.select(hg.id, hg.config_id, hg.class_name, hg.workload_sha256, hg.ttft_ms, hg.tpot_ms, hg.backend,
                         hg.simulated).where(hg.id == sa.any_(_ids(group[starts]))).subquery("groups")
    dims = fetch_columns(conn, dims_src, list(zip(dims_src.c, ("int8", "int8", "text", "text", "float8", "float8",
                                                               "text", "bool"), strict=True)))
    if dims is None or len(dims[0]) != len(starts):
        return None
    at = np.argsort(dims[0])[np.searchsorted(np.sort(dims[0]), group[starts])]  # each group's row of dims

    def text(i: int) -> list[Any]:
        return [dims[i][j] for j in at]

    # NO_TIME is the smallest int64: an unknown time never beats a known one (max() skips NULL)
    return [dims[1][at], text(2), text(3), dims[4][at], dims[5][at], text(6), dims[7][at], counts.astype(np.int64),
            _percentile(value, starts, counts, 0.5), _percentile(value, starts, counts, 0.25),
            _percentile(value, starts, counts, 0.75), value[starts], value[starts + counts - 1],
            np.maximum.reduceat(stamp, starts)]


def stat_columns(conn: sa.Connection, stats: Any, last: Any) -> list[Any] | None:
    """fetch_columns of per-group statistics (STAT_ROW; ``last``: the time as epoch
    microseconds, an unknown one as NO_TIME)."""
    return fetch_columns(conn, stats, [
        (sa.func.coalesce(last, sa.literal(int(NO_TIME), sa.BigInteger)) if name == "last_measured" else stats.c[name],
         STAT_KINDS[name]) for name in STAT_ROW])


def _raw(conn: sa.Connection, stmt: Any) -> Sequence[Any]:
    """The driver's plain tuples (pandas probes a SQLAlchemy Row for attributes, ~600 lookups a
    frame)."""
    return conn.execute(stmt, execution_options=BINARY).cursor.fetchall()


def assemble(conn: sa.Connection, cols: Sequence[Any], columns: Sequence[str], config_columns: Sequence[str],
             workload_columns: Sequence[str], extra: dict[str, np.ndarray] | None = None) -> pd.DataFrame:
    """The frame of per-group statistics ``cols`` (the STAT_ROW columns, rows in any order;
    unknown keys already '' / 0 / False) in capacity_by_config's order: class, median
    descending, configuration, then the keys (workload, limits, backend, simulated) so equal
    medians keep one order whatever the scan. ``extra``: more columns (or ones replacing those
    computed here), in the rows' order of ``cols``."""
    config_id = np.asarray(cols[0], dtype=np.int64)
    median = np.asarray(cols[8], dtype=np.float64)
    ttft, tpot = np.asarray(cols[3], dtype=np.float64), np.asarray(cols[4], dtype=np.float64)
    simulated = np.asarray(cols[6], dtype=bool)
    cls, workload, backend = _Text(cols[1]), _Text(cols[2]), _Text(cols[5])
    # lexsort: the last key is the primary one
    order = np.lexsort((simulated, backend.codes, tpot, ttft, workload.codes, config_id, -median, cls.codes))
    config_sorted = config_id[order]
    sha_sorted = workload.column(order)
    dc, ws = DeploymentConfig, WorkloadSignatureRow
    configs = pd.DataFrame.from_records(
        # one array parameter (an IN list of hundreds is parsed again by the driver at every call)
        _raw(conn, sa.select(dc.id, *(getattr(dc, c) for c in config_columns))
             .where(dc.id == sa.any_(_ids(np.unique(config_id))))),
        columns=["config_id", *config_columns]).set_index("config_id").reindex(config_sorted)
    shas = [str(x) for x in workload.distinct if x]
    workloads = pd.DataFrame.from_records(
        _raw(conn, sa.select(ws.sha256, ws.summary.label("workload"), ws.input_mean, ws.output_tokens)
             .where(ws.sha256.in_(shas))) if shas else [],
        columns=["workload_sha256", *workload_columns]).set_index("workload_sha256").reindex(sha_sorted)
    p25, p75 = np.asarray(cols[9], dtype=np.float64)[order], np.asarray(cols[10], dtype=np.float64)[order]
    med = median[order]
    with np.errstate(divide="ignore", invalid="ignore"):
        spread = np.where(med != 0, (p75 - p25) / np.where(med != 0, med, 1.0), np.nan)
    data: dict[str, Any] = {
        "config_id": config_sorted,
        **{c: configs[c].array for c in config_columns},
        "class": cls.column(order),
        "ttft_ms": ttft[order], "tpot_ms": tpot[order], "workload_sha256": sha_sorted,
        "backend": backend.column(order), "simulated": simulated[order],
        **{c: workloads[c].array for c in workload_columns},
        "runs": np.asarray(cols[7], dtype=np.int64)[order], "median": med, "p25": p25, "p75": p75,
        "min": np.asarray(cols[11], dtype=np.float64)[order], "max": np.asarray(cols[12], dtype=np.float64)[order],
        "spread": spread, "last_measured": _times(cols[13], order),
        **{k: _placed(np.asarray(v)[order]) for k, v in (extra or {}).items()},
    }
    return pd.DataFrame({c: data[c] for c in columns}, copy=False)


def _placed(values: np.ndarray) -> Any:
    """A column of assemble's ``extra``: objects stay objects (None stays None; a frame built
    from a dict would infer text from them)."""
    return pd.Series(values, dtype=object) if values.dtype == object else values


# An execution option: the statement's rows come from psycopg in binary (numbers and
# timestamps without parsing text: ~half the fetch time of thousands of rows).
BINARY = {"orch_binary": True}


@sa.event.listens_for(PGDialect_psycopg, "do_execute")
def _binary(cursor: Any, statement: str, parameters: Any, context: Any) -> bool | None:
    if context.execution_options.get("orch_binary"):
        cursor.execute(statement, parameters, binary=True, prepare=False)
        return True
    return None


def tpot_p50(percentiles: Any) -> Any:
    """SQL: a point's TPOT median as history.load_points reads it from the document (a number;
    true as 1 and "Infinity" as +inf, as JSONDoc and Python's isinstance(x, int | float) read
    them; anything else NULL)."""
    doc = sa.type_coerce(percentiles, JSONB)
    p50 = doc.op("->")(sa.literal("tpot_s", sa.Text)).op("->")(sa.literal("p50", sa.Text))
    kind = sa.func.jsonb_typeof(p50)
    return sa.case(
        (kind == "number", sa.cast(p50, sa.Double)),
        (kind == "boolean", sa.case((sa.cast(p50, sa.Boolean), sa.literal(1.0, sa.Double)))),
        (p50 == sa.literal_column("'\"Infinity\"'::jsonb", JSONB),
         sa.literal(float("inf"), sa.Double)),
    )


POINT_KINDS = ("int8", "text", "text", "text", "int8", "text", "int8", "int8", "int8", "float8", "float8", "float8")


def points_frame(cols: Sequence[Any], columns: list[str]) -> pd.DataFrame:
    """load_points' columns (PostgreSQL, POINT_KINDS; every value known) as the frame pandas
    would infer from their rows, built from typed arrays: int64 ids and GPUs, text, floats."""
    n = len(cols[0])
    order = np.arange(n)
    data: dict[str, Any] = {}
    for name, values, kind in zip(columns, cols, POINT_KINDS, strict=True):
        data[name] = _Text(values).column(order) if kind == "text" else np.asarray(values, dtype=_DTYPES[kind])
    return pd.DataFrame(data, copy=False)


PER_GPU_KEYS = ("gpu", "model", "class", "workload_sha256", "simulated")


def per_gpu(by_config: pd.DataFrame, columns: list[str]) -> pd.DataFrame | None:
    """history.capacity_per_gpu's frame from capacity_by_config's with numpy: per (GPU, model,
    class, workload, simulated), in that sorted order, the configurations, runs, the median of
    the per-GPU capacities ((a + b) / 2 of the middle two, as pandas' median), the latest
    measurement and the best configuration (the first highest per-GPU figure in
    capacity_by_config's order). None where pandas must decide (unknown times, non-finite
    figures): the caller's pandas path then answers."""
    n = len(by_config)
    per = by_config["median"].to_numpy(dtype=np.float64) / by_config["gpus"].to_numpy(dtype=np.float64)
    last = by_config["last_measured"]
    if not n or not np.isfinite(per).all() or last.isna().any():
        return None
    texts = [_Text(by_config[k].tolist()) for k in PER_GPU_KEYS[:4]]
    simulated = by_config["simulated"].to_numpy(dtype=bool)
    codes = [t.codes for t in texts] + [simulated.astype(np.intp)]
    by_key = np.lexsort(codes[::-1])  # rows grouped, groups in key order
    keyed = np.stack([c[by_key] for c in codes])
    starts = np.flatnonzero(np.r_[True, (keyed[:, 1:] != keyed[:, :-1]).any(axis=0)])
    group_of = np.empty(n, dtype=np.intp)
    group_of[by_key] = np.cumsum(np.r_[True, (keyed[:, 1:] != keyed[:, :-1]).any(axis=0)]) - 1
    counts = np.diff(np.r_[starts, n])
    first = by_key[starts]  # a row of each group, for its keys
    # median per group: the group's per-GPU figures sorted
    values = per[np.lexsort((per, group_of))]
    mid = starts + (counts - 1) // 2
    upper = np.minimum(mid + 1, n - 1)
    median = np.where(counts % 2 == 1, values[mid], (values[mid] + values[upper]) / 2)
    # the best: highest figure, then the earliest row of capacity_by_config's order
    best = np.lexsort((np.arange(n), -per, group_of))[starts]
    runs = np.add.reduceat(by_config["runs"].to_numpy(dtype=np.int64)[by_key], starts)
    last_values = last.to_numpy()
    data: dict[str, Any] = {
        **{k: t.column(first) for k, t in zip(PER_GPU_KEYS[:4], texts, strict=True)},
        "workload": by_config["workload"].array.take(best), "simulated": simulated[first],
        "configs": counts.astype(np.int64), "runs": runs, "best_per_gpu": per[best],
        "best_config_id": by_config["config_id"].to_numpy(dtype=np.int64)[best],
        "best_label": by_config["label"].array.take(best), "median_per_gpu": median,
        "last_measured": pd.array(np.maximum.reduceat(last_values[by_key], starts), dtype=last.dtype),
    }
    return pd.DataFrame({c: data[c] for c in columns}, copy=False)


def per_gpu_pandas(by_config: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """capacity_per_gpu computed by pandas (per_gpu's reference, and its fallback)."""
    by_config = by_config.assign(per_gpu=by_config["median"] / by_config["gpus"])
    keys = ["gpu", "model", "class", "workload_sha256", "simulated"]
    # the best of each group: the first highest per-GPU figure in capacity_by_config's order
    best = by_config.sort_values("per_gpu", ascending=False, kind="stable").drop_duplicates(keys)
    best = best[[*keys, "workload", "per_gpu", "config_id", "label"]].rename(
        columns={"per_gpu": "best_per_gpu", "config_id": "best_config_id", "label": "best_label"})
    stats = by_config.groupby(keys, sort=True).agg(
        configs=("config_id", "size"), runs=("runs", "sum"), median_per_gpu=("per_gpu", "median"),
        last_measured=("last_measured", "max"),
    ).reset_index()
    out = stats.merge(best, on=keys, how="left")
    out["simulated"] = out["simulated"].astype(bool)
    out["best_config_id"] = out["best_config_id"].astype(int)
    out["runs"] = out["runs"].astype(int)
    return out[columns].reset_index(drop=True)
