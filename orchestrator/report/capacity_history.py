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
    CensoredMedian,
    censored_median,
    describe_median,
    describe_runs,
    run_interval,
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


def _group_row(g: pd.DataFrame) -> dict[str, Any]:
    """One comparable group's figures from its runs' rows (store.capacity_intervals')."""
    runs = [run_interval(c, s, bool(v), u)
            for c, s, v, u in zip(g["capacity"], g["censored"], g["converged"], g["upper"], strict=True)]
    m = censored_median(runs)
    points = np.sort(np.array([r.lower for r in runs if r.kind == "point"], dtype=float))
    if len(points):  # the point estimates' quartiles, linear as percentile_cont
        p25, mid, p75 = (float(np.quantile(points, q)) for q in (0.25, 0.5, 0.75))
    else:
        p25 = mid = p75 = np.nan
    first = g.iloc[0]
    return {
        **{c: first[c] for c in (*_GROUP, *_FIRST)}, "runs": m.runs, "median": m.median,
        "p25": p25, "p75": p75, "min": float(points[0]) if len(points) else np.nan,
        "max": float(points[-1]) if len(points) else np.nan, "spread": (p75 - p25) / mid if mid else np.nan,
        "last_measured": g["last_measured"].max(),
        "n_points": m.n_points, "n_censored_above": m.n_censored_above, "n_censored_below": m.n_censored_below,
        "n_unconverged": m.n_unconverged, "censored_above_from": m.above_from, "censored_below_to": m.below_to,
        "median_censored": m.censored, "median_low": m.low, "median_high": m.high, "median_level": m.level,
    }


def capacity_history(store: Store, **filters: Any) -> pd.DataFrame:
    """capacity_by_config's groups and filters, from every valid, finished run: ``runs`` counts
    them all and ``median`` is the NPMLE median (``median_censored`` "above": the median is at
    least it; "below": at most it), with its order-statistic interval (``median_low``,
    ``median_high``; inf: unbounded) of coverage ``median_level``, and the counts of points, runs
    censored above (``censored_above_from``: the lowest such bound) and below
    (``censored_below_to``: the highest) and unconverged ones. Sorted as capacity_by_config:
    class, median descending, configuration, keys."""
    raw = store.capacity_intervals(**filters)
    if raw.empty:
        return pd.DataFrame(columns=list(HISTORY_COLUMNS))
    rows = [_group_row(g) for _, g in raw.groupby(_GROUP, sort=False, dropna=False)]
    frame = pd.DataFrame(rows)
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


def median_cell(row: Mapping[str, Any]) -> str:
    """The median and its interval: ``224 (149-inf)``."""
    hi = float(row["median_high"])
    return f"{median_text(row)} ({float(row['median_low']):,.0f}-{f'{hi:,.0f}' if np.isfinite(hi) else 'inf'})"


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
