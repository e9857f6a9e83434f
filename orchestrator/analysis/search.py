"""Capacity search: the next open-loop rate to measure, or done (a pure decision).

Capacity of a class (DESIGN section 7) = the highest goodput among load points whose
attainment >= the class threshold (0.90). The search works on the offered rate in log space:

1. **bracket**: without a prior, the first point is the geometric middle of the rate range and
   each further point bisects (in log rate) toward the untried bound; with a prior (the
   simulator's predicted capacity rate), the first two points sit just either side of it and
   steps grow geometrically until a pass and a fail bracket the knee.
2. **narrow**: between the highest pass and the lowest fail, the next rate is where a straight
   line through logit(attainment) vs log(rate) crosses the threshold (fitted on the measured
   points with informative attainment, else through the two bracket ends), kept away from the
   ends; a point that lands within the precision of an end is moved to exactly one precision
   from it, so the expected outcome closes the bracket. A step that failed to halve the
   bracket is followed by a tempered (near-bisection) step.
3. **done** when the bracket is within ``precision`` (relative), when the highest rate passes
   (censored above) or the lowest fails (censored below), or after ``max_points``.

Noise near the knee: a point that contradicts its neighbours (a pass above a fail) is measured
once more and its measurements averaged; each point is re-measured at most once. Re-measures
count as points. Points measured for another class at the same arm may be fed in with
``observe`` (their attainment for *this* class), which saves points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Censoring = Literal["none", "below", "above"]

# Attainment is clipped to [EPS, 1 - EPS] before the logit: 1.0 (all kept) carries no slope.
_EPS = 0.005
# Points whose attainment lies in this band inform the slope of the fitted line.
_INFORMATIVE = (0.02, 0.995)
# ITP's slack: at most this many steps beyond plain bisection of the first bracket.
_ITP_N0 = 0


@dataclass(frozen=True, slots=True)
class SearchPoint:
    """One offered rate and what was measured there (averaged over its measurements)."""

    rate: float
    attainment: float
    goodput: float
    measurements: int
    passed: bool


@dataclass(frozen=True, slots=True)
class CapacityResult:
    """Outcome of a capacity search.

    ``capacity`` is the highest goodput (output tokens/s) among passing points (0.0 if none
    passed); ``at_rate`` and ``attainment`` are that point's. ``bracket`` is (highest pass below
    the lowest fail, lowest fail); either end may be None. ``converged`` is True when the search
    stopped for a reason other than running out of points."""

    capacity: float
    at_rate: float | None
    attainment: float | None
    points_used: int
    bracket: tuple[float | None, float | None]
    converged: bool
    censored: Censoring
    points: tuple[SearchPoint, ...] = ()
    remeasured: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """Plain dict (JSON-ready)."""
        return {
            "capacity": self.capacity,
            "at_rate": self.at_rate,
            "attainment": self.attainment,
            "points_used": self.points_used,
            "bracket": list(self.bracket),
            "converged": self.converged,
            "censored": self.censored,
            "points": [
                {"rate": p.rate, "attainment": p.attainment, "goodput": p.goodput,
                 "measurements": p.measurements, "passed": p.passed}
                for p in self.points
            ],
            "remeasured": list(self.remeasured),
        }


@dataclass
class _Acc:
    rate: float
    att_sum: float = 0.0
    good_sum: float = 0.0
    n: int = 0
    last_seen: int = 0

    @property
    def attainment(self) -> float:
        return self.att_sum / self.n

    @property
    def goodput(self) -> float:
        return self.good_sum / self.n


def _logit(a: float) -> float:
    a = min(max(a, _EPS), 1.0 - _EPS)
    return math.log(a / (1.0 - a))


@dataclass
class CapacitySearch:
    """Bracket-then-narrow search for one class at one arm (see the module doc).

    Drive it with ``while (rate := s.next_rate()) is not None: s.observe(rate, att, goodput)``
    and read ``s.result()``. ``prior`` is a predicted capacity *rate* (requests/s at which the
    class's attainment falls to the threshold), e.g. the virtual-time simulator's."""

    rate_min: float
    rate_max: float
    precision: float = 0.02
    attainment: float = 0.90
    max_points: int = 12
    prior: float | None = None
    refine_goodput: bool = True
    _points: dict[float, _Acc] = field(default_factory=dict, init=False, repr=False)
    _used: int = field(default=0, init=False, repr=False)
    _remeasured: list[float] = field(default_factory=list, init=False, repr=False)
    _itp_start: tuple[float, float] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.rate_min < self.rate_max:
            raise ValueError(f"need 0 < rate_min < rate_max (got {self.rate_min}, {self.rate_max})")
        if not 0 < self.precision < 1:
            raise ValueError(f"precision must be in (0, 1) (got {self.precision})")
        if not 0 < self.attainment <= 1:
            raise ValueError(f"attainment must be in (0, 1] (got {self.attainment})")
        if self.max_points < 1:
            raise ValueError("max_points must be >= 1")
        if self.prior is not None:
            if not (self.prior > 0 and math.isfinite(self.prior)):
                raise ValueError(f"prior must be a positive rate (got {self.prior})")
            self.prior = min(max(self.prior, self.rate_min), self.rate_max)
        self._p = math.log1p(self.precision)  # precision in log-rate units
        if self.prior is None:  # the whole range is the first bracket (ends presumed)
            self._itp_start = (math.log(self.rate_min), math.log(self.rate_max))

    # --- input --------------------------------------------------------------------------

    def observe(self, rate: float, attainment: float, goodput: float) -> None:
        """Record a measured point (any rate: the search's own or one measured for another
        class). Measuring a rate again averages the measurements."""
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"rate must be a positive number (got {rate})")
        if not 0 <= attainment <= 1:
            raise ValueError(f"attainment must be in [0, 1] (got {attainment})")
        key = self._key(rate)
        acc = self._points.setdefault(key, _Acc(rate=key))
        if acc.n >= 1:
            self._remeasured.append(key)
        acc.att_sum += attainment
        acc.good_sum += goodput
        acc.n += 1
        self._used += 1
        acc.last_seen = self._used
        if self._itp_start is None and self.prior is not None:
            lo, hi = self._bracket()
            if lo is not None and hi is not None:  # the prior's expansion found the knee
                self._itp_start = (math.log(lo.rate), math.log(hi.rate))

    def _key(self, rate: float) -> float:
        # Rates within a millionth are the same point (a re-measure of a float round trip).
        for k in self._points:
            if abs(k - rate) <= 1e-6 * rate:
                return k
        return float(rate)

    # --- state ---------------------------------------------------------------------------

    def _passes(self, acc: _Acc) -> bool:
        return acc.attainment >= self.attainment

    def _bracket(self) -> tuple[_Acc | None, _Acc | None]:
        fails = [a for a in self._points.values() if not self._passes(a)]
        hi = min(fails, key=lambda a: a.rate) if fails else None
        passes = [a for a in self._points.values() if self._passes(a) and (hi is None or a.rate < hi.rate)]
        lo = max(passes, key=lambda a: a.rate) if passes else None
        return lo, hi

    def _bracket_width(self) -> float | None:
        lo, hi = self._bracket()
        if lo is None or hi is None:
            return None
        return math.log(hi.rate / lo.rate)

    def _contradiction(self) -> float | None:
        """A once-measured point involved in a pass-above-fail, the most recently seen first."""
        fails = [a for a in self._points.values() if not self._passes(a)]
        if not fails:
            return None
        lowest_fail = min(a.rate for a in fails)
        bad_passes = [a for a in self._points.values() if self._passes(a) and a.rate > lowest_fail]
        involved: list[_Acc] = []
        for p in bad_passes:
            involved.append(p)
            involved.extend(f for f in fails if f.rate < p.rate)
        once = [a for a in involved if a.n == 1]
        if not once:
            return None
        return max(once, key=lambda a: a.last_seen).rate

    # --- decision ------------------------------------------------------------------------

    def next_rate(self) -> float | None:
        """The next rate to measure, or None when the search is done."""
        if self._used >= self.max_points:
            return None
        again = self._contradiction()
        if again is not None:
            return again
        return self._next_search_rate()

    def _done_reason(self) -> str | None:
        lo, hi = self._bracket()
        if lo is not None and hi is not None and math.log(hi.rate / lo.rate) <= self._p + 1e-12:
            return "bracketed"
        if lo is not None and hi is None and lo.rate >= self.rate_max * (1 - 1e-9):
            return "above"
        if hi is not None and lo is None and hi.rate <= self.rate_min * (1 + 1e-9):
            return "below"
        return None

    def _next_search_rate(self) -> float | None:
        if self._done_reason() is not None:
            return self._refine() if self.refine_goodput else None
        lo, hi = self._bracket()
        if self.prior is not None and (lo is None) != (hi is None):
            return self._expand(lo or hi, up=lo is not None)  # type: ignore[arg-type]
        if lo is None and hi is None and self.prior is not None:
            return self._clamp(self.prior * math.exp(-0.45 * self._p))
        # Bracketed, by measurements or by the presumed ends of the range (the lowest rate
        # passes, the highest fails, until measured otherwise).
        a = math.log(lo.rate) if lo else math.log(self.rate_min)
        b = math.log(hi.rate) if hi else math.log(self.rate_max)
        if b - a <= self._p + 1e-12:
            # Narrow enough, but an end is only presumed: measure it.
            return self.rate_min if lo is None else self.rate_max
        return self._clamp(math.exp(self._itp(lo, hi, a, b)))

    def _goodput_gap(self) -> tuple[float, float, float] | None:
        """The widest doubt about the peak goodput among passing points, as (ratio, low rate,
        high rate): attainment does not rise with rate, so between consecutive passes p < q
        goodput is at most q * goodput(p) / p. None when no pass is known."""
        passes = sorted((a for a in self._points.values() if self._passes(a)), key=lambda a: a.rate)
        if not passes:
            return None
        best = max(a.goodput for a in passes)
        if best <= 0:
            return None
        worst: tuple[float, float, float] | None = None
        for p, q in zip(passes, passes[1:], strict=False):
            bound = q.rate * p.goodput / p.rate
            if worst is None or bound / best > worst[0]:
                worst = (bound / best, p.rate, q.rate)
        return worst

    def _refine(self) -> float | None:
        """After the bracket closed: when goodput may peak between two passing points (an
        attainment that falls faster than the rate rises), measure between them until the
        peak is pinned within the precision. Attainment alone cannot see this."""
        gap = self._goodput_gap()
        if gap is None or gap[0] <= 1 + self.precision + 1e-12:
            return None
        _, p, q = gap
        a, b = math.log(p), math.log(q)
        x = (a + b) / 2 if b - a > 2 * self._p else b - self._p * 0.999
        if any(abs(math.log(k) - x) < 1e-9 for k in self._points):
            return None
        return self._clamp(math.exp(x))

    def _clamp(self, rate: float) -> float:
        return min(max(rate, self.rate_min), self.rate_max)

    def _fit_root(self, near: float) -> float | None:
        """log-rate where the fitted logit-attainment line crosses the threshold, from the (up
        to three) informative points nearest ``near`` (log rate); None without a falling line."""
        pts = [a for a in self._points.values() if _INFORMATIVE[0] <= a.attainment <= _INFORMATIVE[1]]
        if len(pts) < 2:
            return None
        pts.sort(key=lambda a: abs(math.log(a.rate) - near))
        pts = pts[:3]
        x = np.array([math.log(a.rate) for a in pts])
        y = np.array([_logit(a.attainment) for a in pts])
        if np.ptp(x) <= 0:
            return None
        slope, icpt = np.polyfit(x, y, 1)
        if not slope < 0:
            return None
        return float((_logit(self.attainment) - icpt) / slope)

    def _expand(self, edge: _Acc, up: bool) -> float:
        """With a prior and one side measured: step away from ``edge``, growing 4x a step."""
        x0 = math.log(edge.rate)
        bound = math.log(self.rate_max if up else self.rate_min)
        sign = 1.0 if up else -1.0
        same_side = sum(1 for a in self._points.values() if self._passes(a) == up)
        step = 0.9 * self._p * 4.0 ** max(same_side - 1, 0)
        root = self._fit_root(x0)
        if root is not None and sign * (root - x0) > 0:
            # Extrapolate on the fitted line, aiming just past the estimate so the likely
            # outcome brackets the knee; never further than the plain step.
            step = min(step, max(sign * (root - x0) + 0.5 * self._p, 0.9 * self._p))
        x = x0 + sign * step
        if sign * (bound - x) < self._p:  # within a precision of the bound: try the bound itself
            x = bound
        return self._clamp(math.exp(x))

    def _itp(self, lo: _Acc | None, hi: _Acc | None, a: float, b: float) -> float:
        """Next log-rate in the bracket [a, b] by the ITP method (Oliveira & Takahashi, 2020):
        an interpolation, truncated toward the midpoint and projected into a radius around
        it, so the number of steps never exceeds plain bisection's (+ ``_ITP_N0``) while a
        well-behaved curve converges much faster."""
        a0, b0 = self._itp_start if self._itp_start is not None else (a, b)
        eps = self._p / 2
        n_half = max(math.ceil(math.log2(max((b0 - a0) / (2 * eps), 1.0))), 0)
        n_max = n_half + _ITP_N0
        j = sum(1 for k in self._points if a0 < math.log(k) < b0)
        mid = (a + b) / 2
        gap = b - a
        if lo is None or hi is None:
            return mid  # an end is only presumed: nothing to interpolate on
        root = self._fit_root(mid)
        if root is not None and a < root < b:
            xf = root
        else:
            la, lb, lt = _logit(lo.attainment), _logit(hi.attainment), _logit(self.attainment)
            xf = a + gap * ((la - lt) / (la - lb) if la != lb else 0.5)
        delta = 0.2 / max(b0 - a0, 1e-12) * gap**2
        sigma = 1.0 if mid >= xf else -1.0
        xt = xf + sigma * delta if delta <= abs(mid - xf) else mid
        r = max(eps * 2.0 ** (n_max - j) - gap / 2, 0.0)
        x = xt if abs(xt - mid) <= r else mid - sigma * r
        # Keep off the ends: a point within a precision of an end is moved to exactly one
        # precision from it, so the outcome the estimate expects closes the bracket.
        if x - a < self._p and b - x >= self._p:
            x = a + self._p * 0.999
        elif b - x < self._p and x - a >= self._p:
            x = b - self._p * 0.999
        if abs(x - mid) > r:  # ITP's radius bounds the worst case; it wins over the nudge
            x = mid + (r if x > mid else -r)
        return x

    # --- output --------------------------------------------------------------------------

    @property
    def points_used(self) -> int:
        """Measurements taken so far (re-measures included)."""
        return self._used

    def points(self) -> tuple[SearchPoint, ...]:
        """Every measured rate, ascending, with its averaged attainment and goodput."""
        return tuple(
            SearchPoint(a.rate, a.attainment, a.goodput, a.n, self._passes(a))
            for a in sorted(self._points.values(), key=lambda a: a.rate)
        )

    def result(self) -> CapacityResult:
        """The capacity found so far (final once ``next_rate()`` returned None)."""
        passing = [a for a in self._points.values() if self._passes(a)]
        best = max(passing, key=lambda a: a.goodput) if passing else None
        lo, hi = self._bracket()
        reason = self._done_reason()
        censored: Censoring = "above" if reason == "above" else "below" if reason == "below" else "none"
        return CapacityResult(
            capacity=best.goodput if best else 0.0,
            at_rate=best.rate if best else None,
            attainment=best.attainment if best else None,
            points_used=self._used,
            bracket=(lo.rate if lo else None, hi.rate if hi else None),
            converged=reason is not None and self._contradiction() is None,
            censored=censored,
            points=self.points(),
            remeasured=tuple(self._remeasured),
        )
