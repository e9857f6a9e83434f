"""Capacity over history from every valid run, converged or censored (issue 32, item 1). Pure.

A run's capacity is an interval of where the true capacity lies (``run_interval``): a point is
[v, v]; censored above the search's range (above_max, at_ceiling) is [v, inf); below its lowest
rate is [0, upper]; unconverged is the bracket [v, upper]. A group's capacity distribution is
the Turnbull NPMLE of those intervals (self-consistency/EM over the innermost intervals; with
right censoring only it is the Kaplan-Meier estimate, with points only the empirical
distribution).

Its median: the NPMLE fixes the CDF only between innermost intervals, so
  * where the CDF is exactly 1/2 over a flat stretch (between two innermost intervals), the
    median is that stretch's midpoint (with points only: the mean of the two middle values, as
    percentile_cont and the summaries' median);
  * where 1/2 is crossed inside an innermost interval, the median lies somewhere in it: a point
    when it is one; ">= q" (censored above) when it is [q, inf); "<= p" (censored below) when
    it is [0, p] holding censored-below mass; else (an unconverged bracket) its midpoint.
Its interval: the distribution-free order-statistic interval [L_(k), R_(n-k+1)] of the lower
ends L and upper ends R, k the largest with 2 P(Bin(n, 1/2) <= k - 1) <= 1 - LEVEL. Since
L_(k) <= X_(k) and R_(n-k+1) >= X_(n-k+1) for the unseen true capacities X, it covers the
median with at least the binomial level even under censoring. Fewer than 6 runs cannot reach
95%: then k = 1 and ``level`` states the coverage it has (1 - 2^(1-n)).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

LEVEL = 0.95  # the median interval's coverage (at least), when the runs allow it
_TOL = 1e-9  # the mass at which a cumulative sum counts as exactly 1/2
_MAX_ITER = 20_000
_EM_TOL = 1e-12
ABOVE = ("above_max", "at_ceiling")

Side = Literal["above", "below"]
Kind = Literal["point", "above", "below", "unconverged"]


@dataclass(frozen=True, slots=True)
class RunInterval:
    """Where one run's true capacity lies: [lower, upper] (closed; upper may be inf), and what
    kind of evidence it is: "point", "above" (censored above), "below" (censored below) or
    "unconverged" (a bracket the search did not close)."""

    lower: float
    upper: float
    kind: Kind


def run_interval(capacity: float, censored: str | None, converged: bool, upper: float | None) -> RunInterval:
    """A stored capacity (store.models.Capacity's columns) as its interval, as a verdict reads it
    (analysis.blocks.CapacityValue): a converged, uncensored capacity above zero is a point;
    anything else is [capacity, upper or inf], below the search's range [0, upper or inf]."""
    value = max(float(capacity), 0.0)
    hi = math.inf if upper is None or not math.isfinite(float(upper)) else max(float(upper), value)
    if censored is None and converged and value > 0:
        return RunInterval(value, value, "point")
    if censored in ABOVE:
        return RunInterval(value, hi, "above")
    if censored == "below_min" or (censored is None and converged):  # zero: no rate passed
        return RunInterval(0.0, hi, "below")
    return RunInterval(value, hi, "unconverged")


def innermost_intervals(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """The Turnbull (innermost) intervals of closed intervals [lower_i, upper_i]: each [l, r]
    with l a lower end and r an upper end and no end strictly between (a lower end and an upper
    end at one value overlap there). Shape (m, 2), ascending."""
    ends = sorted([(float(v), 0) for v in lower] + [(float(v), 1) for v in upper])  # lower ends first at a tie
    out: list[tuple[float, float]] = []
    for (v, kind), (w, next_kind) in zip(ends, ends[1:], strict=False):
        if kind == 0 and next_kind == 1 and (not out or out[-1] != (v, w)):
            out.append((v, w))
    return np.array(out, dtype=float).reshape(-1, 2)


def turnbull(lower: Sequence[float] | np.ndarray, upper: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The NPMLE of a distribution from interval observations: (innermost intervals (m, 2), the
    mass on each (m,)), by self-consistency (EM) from equal masses."""
    lo, hi = np.asarray(lower, dtype=float), np.asarray(upper, dtype=float)
    if lo.size == 0:
        return np.zeros((0, 2)), np.zeros(0)
    if np.any(hi < lo):
        raise ValueError("an interval's upper end is below its lower end")
    inner = innermost_intervals(lo, hi)
    # Observation i's interval holds a contiguous run of innermost intervals (both their ends
    # ascend): [first[i], last[i]]. So the EM's two products with the n x m incidence matrix are
    # prefix sums, O(n + m) an iteration instead of O(n m): a group of 8,000 runs took 34 s dense.
    first = np.searchsorted(inner[:, 0], lo, side="left")
    last = np.searchsorted(inner[:, 1], hi, side="right")  # one past the last
    m, n = len(inner), len(lo)
    mass = np.full(m, 1.0 / m)
    for _ in range(_MAX_ITER):
        cum = np.concatenate(([0.0], np.cumsum(mass)))
        seen = cum[last] - cum[first]  # each observation's probability under the current masses
        weight = np.zeros(m + 1)
        np.add.at(weight, first, 1.0 / seen)
        np.add.at(weight, last, -1.0 / seen)
        new = mass * np.cumsum(weight[:m]) / n
        if np.max(np.abs(new - mass)) < _EM_TOL:
            mass = new
            break
        mass = new
    return inner, mass / mass.sum()


@dataclass(frozen=True, slots=True)
class CensoredMedian:
    """A group's capacity from all its valid runs: the NPMLE median (``censored``: None, or
    "above" for ">= median", "below" for "<= median"), its order-statistic interval (``low``,
    ``high``; ``high`` may be inf) at coverage ``level``, and what the runs were."""

    median: float
    censored: Side | None
    low: float
    high: float
    level: float
    n_points: int
    n_censored_above: int
    n_censored_below: int
    n_unconverged: int
    above_from: float | None  # the lowest lower end among runs censored above ("censored >= x")
    below_to: float | None  # the highest upper end among runs censored below ("censored <= x")

    @property
    def runs(self) -> int:
        return self.n_points + self.n_censored_above + self.n_censored_below + self.n_unconverged


def npmle_median(inner: np.ndarray, mass: np.ndarray, below: bool = False) -> tuple[float, Side | None]:
    """The median of an NPMLE (see the module's docstring for the rules); ``below``: the group has
    runs censored below (an interval [0, p] crossing 1/2 then reads "<= p")."""
    cum = np.cumsum(mass)
    j = int(np.argmax(cum >= 0.5 - _TOL))
    q, p = float(inner[j, 0]), float(inner[j, 1])
    if abs(cum[j] - 0.5) <= _TOL and j + 1 < len(inner):  # flat at 1/2 up to the next interval
        return (p + float(inner[j + 1, 0])) / 2, None
    if q == p:
        return q, None
    if math.isinf(p):
        return q, "above"
    if q == 0.0 and below:
        return p, "below"
    return (q + p) / 2, None


def right_censored_median(points: Sequence[float], above: Sequence[float]) -> tuple[float, Side | None]:
    """npmle_median of points and runs censored above only, without the EM: there the NPMLE is
    the product-limit (Kaplan-Meier) estimate, a run censored at c at risk before c only (its
    interval [c, inf) is closed: it says X >= c), the mass left after the last point on
    [largest c, inf) when a run is censored above that point."""
    times = sorted(set(points))
    if not times:
        return max(above), "above"
    lows = sorted(above)
    n_points = len(points)
    counts: dict[float, int] = {}
    for v in points:
        counts[v] = counts.get(v, 0) + 1
    # the intervals' left ends in order (points, then the tail's) and their masses
    ends: list[float] = []
    masses: list[float] = []
    survival, seen, gone = 1.0, 0, 0  # seen: points below t; gone: censored at or below t
    for t in times:
        while gone < len(lows) and lows[gone] <= t:
            gone += 1
        at_risk = (n_points - seen) + (len(lows) - gone)
        d = counts[t]
        mass = survival * d / at_risk
        ends.append(t)
        masses.append(mass)
        survival -= mass
        seen += d
    if lows and lows[-1] > times[-1]:
        ends.append(lows[-1])
        masses.append(survival)
    cum = 0.0
    for j, (q, m) in enumerate(zip(ends, masses, strict=True)):
        cum += m
        if cum >= 0.5 - _TOL:
            tail = j == len(times)
            if tail:
                return q, "above"
            if abs(cum - 0.5) <= _TOL and j + 1 < len(ends):
                return (q + ends[j + 1]) / 2, None
            return q, None
    return ends[-1], None  # unreachable: the masses sum to 1


@functools.lru_cache(maxsize=4096)
def order_statistic_k(n: int, level: float = LEVEL) -> tuple[int, float]:
    """(k, coverage): the largest k with 2 P(Bin(n, 1/2) <= k - 1) <= 1 - level (at least 1), and
    the coverage 1 - 2 P(Bin(n, 1/2) <= k - 1) of [X_(k), X_(n-k+1)]. Exact: the binomial sums
    are integers, divided by the integer 2^n (a float 2.0**n overflows past 1023 runs), and
    accumulated term by term (linear in k, for a group of thousands of runs)."""
    whole = 2**n
    k, term, total = 1, 1, 1  # term C(n, k - 1); total sum_{i<=k-1} C(n, i) = 2^n P(Bin <= k - 1)
    while k + 1 <= (n + 1) // 2:
        term = term * (n - k + 1) // k  # C(n, k)
        if 2 * (total + term) / whole > 1 - level:  # k + 1 would cover less than the level
            break
        total, k = total + term, k + 1
    return k, 1 - 2 * total / whole


def censored_median(intervals: Sequence[RunInterval], level: float = LEVEL) -> CensoredMedian:
    """The NPMLE median of ``intervals`` with its order-statistic interval and the counts."""
    return median_of([r.lower for r in intervals], [r.upper for r in intervals], [r.kind for r in intervals], level)


def median_of(lo: list[float], hi: list[float], kinds: list[Kind], level: float = LEVEL) -> CensoredMedian:
    """censored_median of the intervals [lo_i, hi_i] of kinds ``kinds`` (lists: a history's
    thousands of groups are each a few runs, where numpy's per-call cost would dominate)."""
    n = len(kinds)
    if not n:
        raise ValueError("no runs: a median needs at least one")
    points = [v for v, c in zip(lo, kinds, strict=True) if c == "point"]
    above = [v for v, c in zip(lo, kinds, strict=True) if c == "above"]
    below = [v for v, c in zip(hi, kinds, strict=True) if c == "below"]
    if len(points) + len(above) == n:  # right censoring only: no EM needed
        median, side = right_censored_median(points, above)
    else:
        inner, mass = turnbull(lo, hi)
        median, side = npmle_median(inner, mass, below=bool(below))
    k, coverage = order_statistic_k(n, level)
    return CensoredMedian(
        median=median, censored=side, low=float(sorted(lo)[k - 1]), high=float(sorted(hi)[n - k]),
        level=coverage, n_points=len(points), n_censored_above=len(above),
        n_censored_below=len(below), n_unconverged=n - len(points) - len(above) - len(below),
        above_from=min(above) if above else None, below_to=max(below) if below else None,
    )


def describe_runs(m: CensoredMedian) -> str:
    """``5 = 3 points + 2 censored >= 256`` (just ``3`` when every run is a point)."""
    if m.runs == m.n_points:
        return str(m.runs)
    parts = [f"{m.n_points} point{'s' if m.n_points != 1 else ''}"] if m.n_points else []
    if m.n_censored_above:
        parts.append(f"{m.n_censored_above} censored >= {m.above_from:,.0f}")
    if m.n_censored_below:
        parts.append(f"{m.n_censored_below} censored <= {m.below_to:,.0f}")
    if m.n_unconverged:
        parts.append(f"{m.n_unconverged} unconverged")
    return f"{m.runs} = " + " + ".join(parts)


def describe_median(median: float, side: str | None) -> str:
    """The median as a reader should take it: ``224``, ``>= 267`` or ``<= 40``."""
    mark = {"above": ">= ", "below": "<= "}.get(side or "", "")
    return f"{mark}{median:,.0f}"
