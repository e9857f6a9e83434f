"""Capacity over history of many comparable groups at once, from every valid run (issue 32). Pure.

One function for the live history (report.capacity_history, thousands of groups) and the
capacity summaries that keep its figures (store.summaries, a configuration's groups whenever a
run changes them), so a summary's figures are the live ones bit for bit: vectorised where all
of a group's runs are points (the NPMLE is then their empirical distribution), the NPMLE of
analysis.censored group by group where any run is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from orchestrator.analysis.censored import ABOVE, Kind, median_of, order_statistic_k

# What group_figures returns per group: ``runs`` (every run), ``median`` (the NPMLE's),
# ``median_censored`` (None, "above", "below"), its order-statistic interval ``median_low`` and
# ``median_high`` (inf: unbounded) at coverage ``median_level``; the counts of what the runs
# were; the lowest bound of the runs censored above and the highest of those censored below;
# and the point estimates' own statistics: ``points_median``, ``p25``, ``p75``, ``min``, ``max``
# (NaN without a point).
FIGURES = ("runs", "median", "median_censored", "median_low", "median_high", "median_level", "n_points",
           "n_censored_above", "n_censored_below", "n_unconverged", "censored_above_from", "censored_below_to",
           "points_median", "p25", "p75", "min", "max")
_KIND_NAMES: tuple[Kind, ...] = ("point", "above", "below", "unconverged")


def run_kinds(capacity: np.ndarray, censored: np.ndarray, converged: np.ndarray,
              upper: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every run's interval and kind, vectorised as analysis.censored.run_interval reads one:
    (lower, upper, kind code: 0 point, 1 censored above, 2 below, 3 unconverged). ``censored``:
    objects (None or NaN: not censored); ``upper``: floats (NaN or inf: unbounded)."""
    value = np.maximum(np.asarray(capacity, dtype=float), 0.0)
    top = np.asarray(upper, dtype=float)
    hi = np.where(np.isfinite(top), np.maximum(top, value), np.inf)
    censored = np.asarray(censored, dtype=object)
    none = (censored == np.array(None)) | (censored != censored)  # None, or NaN (not equal to itself)
    converged = np.asarray(converged, dtype=bool)
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


def _extreme(fn: Any, groups: int, index: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per group, fn (numpy.fmin or fmax) of ``values`` at ``index``; NaN for a group with none."""
    out = np.full(groups, np.nan)
    fn.at(out, index, values)
    return out


def group_figures(group: np.ndarray, groups: int, capacity: np.ndarray, censored: np.ndarray | Sequence[Any],
                  converged: np.ndarray, upper: np.ndarray) -> dict[str, np.ndarray]:
    """FIGURES (arrays of ``groups`` values) of groups 0..groups-1 from their runs: each run's
    group number ``group`` and its stored capacity (run_kinds' columns)."""
    gid = np.asarray(group, dtype=np.intp)
    lower, upper_end, kind = run_kinds(capacity, np.asarray(censored, dtype=object), converged, upper)
    counts = np.stack([np.bincount(gid[kind == k], minlength=groups) for k in range(4)])
    runs, n = counts.sum(axis=0), counts[0]
    # the points of each group, sorted: quartiles, min, max and (all points) the median's interval
    pts = kind == 0
    order = np.lexsort((lower[pts], gid[pts]))
    values = np.append(lower[pts][order], np.nan)  # the pad: a group with no point indexes it
    start = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.intp)
    p25, mid, p75 = (_at(values, start, n, q) for q in (0.25, 0.5, 0.75))
    ks = {int(m): order_statistic_k(int(m)) for m in np.unique(n[n > 0])}
    k = np.array([ks[int(m)][0] if m > 0 else 1 for m in n], dtype=np.intp)
    has = n > 0

    def nth(index: np.ndarray) -> np.ndarray:  # each group's point at ``index``, NaN without points
        return np.where(has, values[np.clip(index, 0, len(values) - 1)], np.nan)

    out: dict[str, np.ndarray] = {
        "runs": runs, "median": mid.copy(), "median_censored": np.full(groups, None, dtype=object),
        "median_low": nth(start + k - 1), "median_high": nth(start + n - k),
        "median_level": np.array([ks[int(m)][1] if m > 0 else np.nan for m in n], dtype=float),
        "n_points": n, "n_censored_above": counts[1], "n_censored_below": counts[2], "n_unconverged": counts[3],
        "censored_above_from": _extreme(np.fmin, groups, gid[kind == 1], lower[kind == 1]),
        "censored_below_to": _extreme(np.fmax, groups, gid[kind == 2], upper_end[kind == 2]),
        "points_median": mid, "p25": p25, "p75": p75, "min": nth(start), "max": nth(start + n - 1),
    }
    mixed = np.flatnonzero(runs != n)  # a censored or unconverged run: the NPMLE of the group
    if len(mixed):
        by_group = np.argsort(gid, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(runs)])
        lows, highs, kinds = lower.tolist(), upper_end.tolist(), kind.tolist()
        for g in mixed.tolist():
            rows = by_group[bounds[g]:bounds[g + 1]].tolist()
            m = median_of([lows[i] for i in rows], [highs[i] for i in rows], [_KIND_NAMES[kinds[i]] for i in rows])
            out["median"][g], out["median_low"][g], out["median_high"][g] = m.median, m.low, m.high
            out["median_level"][g], out["median_censored"][g] = m.level, m.censored
    return out
