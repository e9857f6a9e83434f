"""Capacity over history from every valid run, converged or censored (issue 32, item 1).

A group's median is the Turnbull NPMLE median of all its valid runs' intervals, with its
order-statistic interval and the counts of what the runs were (analysis.censored), instead of
the median of its point estimates alone: runs censored above the search's range no longer drop
out and pull the median down, and a group of censored runs only still shows. The quartiles, min,
max and spread stay those of the point estimates (NaN without any), as capacity_by_config's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from orchestrator.analysis.censored import (
    ABOVE,
    CensoredMedian,
    Kind,
    describe_median,
    describe_runs,
    median_of,
    order_statistic_k,
)
from orchestrator.store.history import BY_CONFIG_COLUMNS, KEY_COLUMNS

if TYPE_CHECKING:
    from orchestrator.store import Store

# Beside store.history.BY_CONFIG_COLUMNS (``runs``: every valid run; ``median``: the
# estimator's): what the runs were and the median's censoring and interval.
CENSORED_COLUMNS = (
    "n_points", "n_censored_above", "n_censored_below", "n_unconverged", "censored_above_from",
    "censored_below_to", "median_censored", "median_low", "median_high", "median_level",
)
HISTORY_COLUMNS = (*BY_CONFIG_COLUMNS, *CENSORED_COLUMNS)
_GROUP = ["config_id", "class", *KEY_COLUMNS]
_FIRST = [c for c in BY_CONFIG_COLUMNS if c not in (*_GROUP, "runs", "median", "p25", "p75", "min", "max", "spread",
                                                    "last_measured")]


def _kinds(raw: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every run's interval and kind, vectorised as analysis.censored.run_interval reads one:
    (lower, upper, kind code: 0 point, 1 censored above, 2 below, 3 unconverged)."""
    value = np.maximum(raw["capacity"].to_numpy(dtype=float), 0.0)
    upper = pd.to_numeric(raw["upper"], errors="coerce").to_numpy(dtype=float)
    hi = np.where(np.isfinite(upper), np.maximum(upper, value), np.inf)
    censored = raw["censored"].to_numpy(dtype=object)
    none = pd.isna(censored)
    converged = raw["converged"].to_numpy(dtype=bool)
    point = none & converged & (value > 0)
    above = np.isin(censored, ABOVE)
    below = ~point & ((censored == "below_min") | (none & converged))
    kind = np.select([point, above, below], [0, 1, 2], default=3)
    lower = np.where(kind == 2, 0.0, value)
    return lower, np.where(point, value, hi), kind


def _at(sorted_values: np.ndarray, start: np.ndarray, n: np.ndarray, q: float) -> np.ndarray:
    """Per group, the linear-interpolation quantile q of its run of ``sorted_values`` (from
    ``start``, ``n`` long; NaN where n is 0): summaries.quantile's formula, vectorised."""
    out = np.full(len(n), np.nan)
    has = n > 0
    pos = (n[has] - 1) * q
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, n[has] - 1)
    a, b = sorted_values[start[has] + lo], sorted_values[start[has] + hi]
    out[has] = a + (b - a) * (pos - lo)
    return out


def _figures(groups: pd.DataFrame, raw: pd.DataFrame) -> pd.DataFrame:
    """Every group's figures from its runs (store.capacity_runs' ``groups`` and ``runs``): vectorised
    where all of a group's runs are points (the NPMLE is then the empirical distribution), the
    NPMLE group by group where any is not. In ``groups``' order."""
    ids = groups["group_id"].to_numpy(dtype=np.int64)
    by_id = np.argsort(ids, kind="stable")
    gid = by_id[np.searchsorted(ids[by_id], raw["group_id"].to_numpy(dtype=np.int64))]  # each run's group row
    groups_n = len(groups)
    lower, upper, kind = _kinds(raw)
    counts = np.stack([np.bincount(gid[kind == k], minlength=groups_n) for k in range(4)])
    runs, n = counts.sum(axis=0), counts[0]
    # the points of each group, sorted: quartiles, min, max and (all points) the median's interval
    pts = kind == 0
    order = np.lexsort((lower[pts], gid[pts]))
    values = np.append(lower[pts][order], np.nan)  # the pad: a group with no point indexes it
    start = np.concatenate([[0], np.cumsum(n)[:-1]])
    p25, mid, p75 = (_at(values, start, n, q) for q in (0.25, 0.5, 0.75))
    ks = {int(m): order_statistic_k(int(m)) for m in np.unique(n[n > 0])}
    k = np.array([ks[int(m)][0] if m > 0 else 1 for m in n])
    has = n > 0

    def nth(index: np.ndarray) -> np.ndarray:  # each group's point at ``index``, NaN without points
        return np.where(has, values[np.clip(index, 0, len(values) - 1)], np.nan)

    out = groups[[*_GROUP, *_FIRST]].reset_index(drop=True).assign(
        runs=runs, median=mid, p25=p25, p75=p75, min=nth(start), max=nth(start + n - 1),
        spread=np.where(has & (mid != 0), (p75 - p25) / np.where(mid != 0, mid, 1.0), np.nan),
        last_measured=raw["last_measured"].groupby(gid).max().reindex(range(groups_n)).to_numpy(),
        n_points=n, n_censored_above=counts[1], n_censored_below=counts[2], n_unconverged=counts[3],
        censored_above_from=pd.Series(lower[kind == 1]).groupby(gid[kind == 1]).min().reindex(range(groups_n)).to_numpy(),
        censored_below_to=pd.Series(upper[kind == 2]).groupby(gid[kind == 2]).max().reindex(range(groups_n)).to_numpy(),
        median_censored=None, median_low=nth(start + k - 1), median_high=nth(start + n - k),
        median_level=[ks[int(m)][1] if m > 0 else np.nan for m in n],
    )
    names: tuple[Kind, ...] = ("point", "above", "below", "unconverged")
    mixed = np.flatnonzero(runs != n)  # a censored or unconverged run: the NPMLE of the group
    if len(mixed):
        by_group = np.argsort(gid, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(runs)])
        lows, highs, kinds = lower.tolist(), upper.tolist(), kind.tolist()
        figures = []
        for g in mixed:
            rows = by_group[bounds[g]:bounds[g + 1]].tolist()
            m = median_of([lows[i] for i in rows], [highs[i] for i in rows], [names[kinds[i]] for i in rows])
            figures.append((m.median, m.low, m.high, m.level, m.censored))
        for column, figure in zip(("median", "median_low", "median_high", "median_level", "median_censored"),
                                  zip(*figures, strict=True), strict=True):
            column_values = out[column].to_numpy(dtype=object if column == "median_censored" else float, copy=True)
            column_values[mixed] = figure
            out[column] = pd.Series(column_values, dtype=column_values.dtype)  # object: None stays None
    return out


def capacity_history(store: Store, **filters: Any) -> pd.DataFrame:
    """capacity_by_config's groups and filters, from every valid, finished run: ``runs`` counts
    them all and ``median`` is the NPMLE median (``median_censored`` "above": the median is at
    least it; "below": at most it), with its order-statistic interval (``median_low``,
    ``median_high``; inf: unbounded) of coverage ``median_level``, and the counts of points, runs
    censored above (``censored_above_from``: the lowest such bound) and below
    (``censored_below_to``: the highest) and unconverged ones. Sorted as capacity_by_config:
    class, median descending, configuration, keys."""
    groups, runs = store.capacity_runs(**filters)
    if runs.empty:
        return pd.DataFrame(columns=list(HISTORY_COLUMNS))
    frame = _figures(groups, runs)
    frame["simulated"] = frame["simulated"].astype(bool)
    frame["last_measured"] = pd.to_datetime(frame["last_measured"], utc=True)
    frame = frame.sort_values(["class", "median", "config_id", "workload_sha256", "ttft_ms", "tpot_ms", "backend",
                               "simulated"], ascending=[True, False, True, True, True, True, True, True], kind="stable")
    return frame[list(HISTORY_COLUMNS)].reset_index(drop=True)


def runs_text(row: Mapping[str, Any]) -> str:
    """A group's runs as a table cell: ``5 = 3 points + 2 censored >= 256`` (``3``: all points;
    a row without the counts, as capacity_by_config's: its runs)."""
    if "n_points" not in row:
        return str(row["runs"])
    return describe_runs(_as_median(row))


def median_text(row: Mapping[str, Any]) -> str:
    """A group's median as a table cell: ``224``, ``>= 1,365`` (censored above) or ``<= 40``."""
    censored = row.get("median_censored")
    return describe_median(float(row["median"]), censored if isinstance(censored, str) else None)


def interval_cell(row: Mapping[str, Any]) -> str:
    """The median's interval alone: ``149-inf`` (``-`` for a row without it)."""
    if "median_high" not in row:
        return "-"
    hi = float(row["median_high"])
    return f"{float(row['median_low']):,.0f}-{f'{hi:,.0f}' if np.isfinite(hi) else 'inf'}"


def quartiles_cell(row: Mapping[str, Any]) -> str:
    """The point estimates' quartiles, ``-`` without a point."""
    p25, p75 = float(row["p25"]), float(row["p75"])
    return "-" if np.isnan(p25) else f"{p25:,.0f}-{p75:,.0f}"


def _as_median(row: Mapping[str, Any]) -> CensoredMedian:
    def opt(k: str) -> float | None:
        v = row.get(k)
        return None if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)

    return CensoredMedian(
        median=float(row["median"]), censored=None, low=float(row["median_low"]), high=float(row["median_high"]),
        level=float(row["median_level"]), n_points=int(row["n_points"]), n_censored_above=int(row["n_censored_above"]),
        n_censored_below=int(row["n_censored_below"]), n_unconverged=int(row["n_unconverged"]),
        above_from=opt("censored_above_from"), below_to=opt("censored_below_to"),
    )
