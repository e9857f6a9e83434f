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

from orchestrator.analysis.censored import CensoredMedian, describe_median, describe_runs
from orchestrator.analysis.censored_groups import group_figures
from orchestrator.store.history import BY_CONFIG_COLUMNS, KEY_COLUMNS
from orchestrator.store.history_censored import (
    CENSORED_COLUMNS,
    HISTORY_COLUMNS,
    answers_from_summaries,
)

if TYPE_CHECKING:
    from orchestrator.store import Store

_GROUP = ["config_id", "class", *KEY_COLUMNS]
_FIRST = [c for c in BY_CONFIG_COLUMNS if c not in (*_GROUP, "runs", "median", "p25", "p75", "min", "max", "spread",
                                                    "last_measured")]


def _figures(groups: pd.DataFrame, raw: pd.DataFrame) -> pd.DataFrame:
    """Every group's figures from its runs (store.capacity_runs' ``groups`` and ``runs``), by
    analysis.censored_groups (the summaries' code too), in ``groups``' order."""
    ids = groups["group_id"].to_numpy(dtype=np.int64)
    by_id = np.argsort(ids, kind="stable")
    gid = by_id[np.searchsorted(ids[by_id], raw["group_id"].to_numpy(dtype=np.int64))]  # each run's group row
    got = group_figures(gid, len(groups), raw["capacity"].to_numpy(dtype=float), raw["censored"].to_numpy(dtype=object),
                        raw["converged"].to_numpy(dtype=bool),
                        pd.to_numeric(raw["upper"], errors="coerce").to_numpy(dtype=float))
    mid, p25, p75 = got["points_median"], got["p25"], got["p75"]
    return groups[[*_GROUP, *_FIRST]].reset_index(drop=True).assign(
        **{c: got[c] for c in ("runs", "median", "p25", "p75", "min", "max")},
        spread=np.where(~np.isnan(mid) & (mid != 0), (p75 - p25) / np.where(mid != 0, mid, 1.0), np.nan),
        last_measured=raw["last_measured"].groupby(gid).max().reindex(range(len(groups))).to_numpy(),
        **{c: got[c] for c in CENSORED_COLUMNS if c != "median_censored"},
        median_censored=pd.Series(got["median_censored"], dtype=object),  # None stays None
    )


def capacity_history(store: Store, **filters: Any) -> pd.DataFrame:
    """capacity_by_config's groups and filters, from every valid, finished run: ``runs`` counts
    them all and ``median`` is the NPMLE median (``median_censored`` "above": the median is at
    least it; "below": at most it), with its order-statistic interval (``median_low``,
    ``median_high``; inf: unbounded) of coverage ``median_level``, and the counts of points, runs
    censored above (``censored_above_from``: the lowest such bound) and below
    (``censored_below_to``: the highest) and unconverged ones. Sorted as capacity_by_config:
    class, median descending, configuration, keys. Over all time without an observed-fingerprint
    filter the capacity summaries answer (one row per group, their figures computed by the same
    code when a run changed them: store.summaries), else capacity_history_live."""
    if answers_from_summaries(filters):
        kept = store.summarised_history(**filters)
        if kept is not None:
            return kept
    return capacity_history_live(store, **filters)


def capacity_history_live(store: Store, **filters: Any) -> pd.DataFrame:
    """capacity_history from every capacity of the groups chosen (store.capacity_runs), whatever
    the filters."""
    groups, runs = store.capacity_runs(**filters)
    if runs.empty:
        return pd.DataFrame(columns=list(HISTORY_COLUMNS))
    return _sorted(_figures(groups, runs))


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
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
