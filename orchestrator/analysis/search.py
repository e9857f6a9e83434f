"""Capacity search: the next open-loop rate to measure, or done (a pure decision).

Capacity of a class (DESIGN section 7) = the highest goodput among load points whose
attainment >= the class threshold (0.90). Goodput = rate x attainment x tokens per kept
request, so the capacity is the peak of rate x attainment over the passing rates: at the
attainment's 0.90 crossing when attainment bends gently, *before* it when attainment falls
faster than the rate rises (a curve that bends before its cliff). The search works in log rate:

1. **bracket the crossing**: without a prior, the first point is the geometric middle of the
   rate range and each further point bisects (in log rate) toward the untried bound; with a
   prior (the simulator's predicted capacity rate), the first two points sit just either side
   of it and steps grow geometrically until a pass and a fail bracket the knee. Inside a
   bracket the next rate is an ITP step on a straight line through logit(attainment) vs log
   rate, kept at least one precision from the ends.
2. **bound the goodput and refine where the bound is loose**: attainment does not rise with the
   rate, so between measured rates p < q the goodput is at most q x goodput(p) / p, and below
   the lowest measured rate p it is at most goodput(p) / attainment(p) (the attainment there
   cannot exceed 1). The upper bound on the capacity is the largest of these over the rates that
   can pass; the search measures in the loosest region (the log middle of the rates that could
   still beat the best) until the bound is within ``precision`` of the best measured goodput.
   This is what removes the shape bias: a search that stops at the crossing is low by up to the
   attainment's drop below the peak, the same way in every block.
3. **done** when the bound closed, when the highest rate passes (censored ``above_max``, or
   ``at_ceiling`` when the load generator's ceiling is what capped the range), when the lowest
   rate fails (``below_min``), or after ``max_points`` (``converged`` False).

Noise: pass/fail is read from the isotonic (non-increasing in rate, weighted by measurements)
fit of the measured attainments, so a pass above a fail is pooled with it rather than measured
again on the strength of its outcome (a re-measure triggered by the outcome keeps a selected,
biased draw). A rate measured more than once (by the caller, e.g. for another class) keeps the
mean of its measurements. A point counts toward the capacity only when its own mean attainment
and the fitted one both pass. Points measured for another class at the same arm may be fed in
with ``observe`` (their attainment for *this* class), which saves points.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from orchestrator.analysis.blocks import CapacityValue
from orchestrator.outcomes import Censoring

if TYPE_CHECKING:
    from orchestrator.plan import SearchSettings

# Attainment is clipped to [EPS, 1 - EPS] before the logit: 1.0 (all kept) carries no slope.
_EPS = 0.005
# Points whose attainment lies in this band inform the slope of the fitted line.
_INFORMATIVE = (0.02, 0.995)
# ITP's slack: at most this many steps beyond plain bisection of the first bracket.
_ITP_N0 = 0


@dataclass(frozen=True, slots=True)
class SearchPoint:
    """One offered rate and what was measured there (means over its measurements); ``passed``
    is the isotonic fit's verdict (see the module doc)."""

    rate: float
    attainment: float
    goodput: float
    measurements: int
    passed: bool


@dataclass(frozen=True, slots=True)
class CapacityResult:
    """Outcome of a capacity search.

    ``capacity`` is the highest goodput (output tokens/s) among passing points (0.0 if none
    passed); ``at_rate`` and ``attainment`` are that point's. ``upper`` bounds the true capacity
    from the measured points (inf when censored above or at the ceiling; ``capacity`` is the
    lower bound). ``bracket`` is (highest pass below the lowest fail, lowest fail); either end
    may be None. ``censored`` is None, ``below_min``, ``above_max`` or ``at_ceiling``;
    ``converged`` is False when the search ran out of points before its bound closed. Only an
    uncensored, converged capacity is a point estimate (``value()`` says which)."""

    capacity: float
    at_rate: float | None
    attainment: float | None
    points_used: int
    bracket: tuple[float | None, float | None]
    converged: bool
    censored: Censoring | None
    points: tuple[SearchPoint, ...] = ()
    remeasured: tuple[float, ...] = ()
    upper: float = math.inf
    ceiling: float | None = None

    def value(self) -> CapacityValue:
        """The capacity as the verdict takes it: a point, or an interval with its censoring."""
        upper = max(self.upper, self.capacity)
        if self.censored is None and self.converged and self.capacity > 0:
            return CapacityValue(self.capacity)
        return CapacityValue(self.capacity, lower=self.capacity, upper=upper, censored=self.censored,
                             converged=self.converged)

    def to_dict(self) -> dict[str, object]:
        """Plain dict (JSON-ready: inf becomes None)."""
        return {
            "capacity": self.capacity,
            "upper": self.upper if math.isfinite(self.upper) else None,
            "at_rate": self.at_rate,
            "attainment": self.attainment,
            "points_used": self.points_used,
            "bracket": list(self.bracket),
            "converged": self.converged,
            "censored": self.censored,
            "ceiling": self.ceiling,
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

    @property
    def attainment(self) -> float:
        return self.att_sum / self.n

    @property
    def goodput(self) -> float:
        return self.good_sum / self.n


def _logit(a: float) -> float:
    a = min(max(a, _EPS), 1.0 - _EPS)
    return math.log(a / (1.0 - a))


def isotonic_decreasing(values: list[float], weights: list[float]) -> list[float]:
    """Weighted least-squares fit that does not rise along the list (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    out: list[float] = []
    for m, _, c in blocks:
        out.extend([m] * int(c))
    return out


@dataclass
class CapacitySearch:
    """Bracket-then-refine search for one class at one arm (see the module doc).

    Drive it with ``while (rate := s.next_rate()) is not None: s.observe(rate, att, goodput)``
    and read ``s.result()``. ``prior`` is a predicted capacity *rate* (requests/s at which the
    class's attainment falls to the threshold), e.g. the virtual-time simulator's. ``ceiling``
    is the load generator's calibrated ceiling (requests/s): the search never asks for more, and
    a capacity that passes there is censored ``at_ceiling``."""

    rate_min: float
    rate_max: float
    precision: float = 0.02
    attainment: float = 0.90
    max_points: int = 12
    prior: float | None = None
    refine_goodput: bool = True
    ceiling: float | None = None
    _points: dict[float, _Acc] = field(default_factory=dict, init=False, repr=False)
    _used: int = field(default=0, init=False, repr=False)
    _remeasured: list[float] = field(default_factory=list, init=False, repr=False)
    _itp_start: tuple[float, float] | None = field(default=None, init=False, repr=False)
    _iso_cache: dict[float, float] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.rate_min < self.rate_max:
            raise ValueError(f"need 0 < rate_min < rate_max (got {self.rate_min}, {self.rate_max})")
        if not 0 < self.precision < 1:
            raise ValueError(f"precision must be in (0, 1) (got {self.precision})")
        if not 0 < self.attainment <= 1:
            raise ValueError(f"attainment must be in (0, 1] (got {self.attainment})")
        if self.max_points < 1:
            raise ValueError("max_points must be >= 1")
        if self.ceiling is not None and not (self.ceiling > self.rate_min and math.isfinite(self.ceiling)):
            raise ValueError(f"the generator's ceiling ({self.ceiling} req/s) must exceed rate_min "
                             f"({self.rate_min}): no load point of this search could be measured")
        # The highest rate the search may ask for: the range's top or the generator's ceiling.
        self._top = min(self.rate_max, self.ceiling) if self.ceiling is not None else self.rate_max
        if self.prior is not None:
            if not (self.prior > 0 and math.isfinite(self.prior)):
                raise ValueError(f"prior must be a positive rate (got {self.prior})")
            self.prior = min(max(self.prior, self.rate_min), self._top)
        self._p = math.log1p(self.precision)  # precision in log-rate units
        if self.prior is None:  # the whole range is the first bracket (ends presumed)
            self._itp_start = (math.log(self.rate_min), math.log(self._top))

    # --- input --------------------------------------------------------------------------

    def observe(self, rate: float, attainment: float, goodput: float) -> None:
        """Record a measured point (any rate: the search's own or one measured for another
        class). Measuring a rate again averages the measurements. A rate above the generator's
        ceiling is not a valid measurement and raises."""
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"rate must be a positive number (got {rate})")
        if not 0 <= attainment <= 1:
            raise ValueError(f"attainment must be in [0, 1] (got {attainment})")
        if not (goodput >= 0 and math.isfinite(goodput)):
            raise ValueError(f"goodput must be a number >= 0 (got {goodput})")
        if self.ceiling is not None and rate > self.ceiling * (1 + 1e-9):
            raise ValueError(f"rate {rate:g} is above the generator's ceiling {self.ceiling:g}")
        key = self._key(rate)
        acc = self._points.setdefault(key, _Acc(rate=key))
        if acc.n >= 1:
            self._remeasured.append(key)
        acc.att_sum += attainment
        acc.good_sum += goodput
        acc.n += 1
        self._used += 1
        self._iso_cache = None
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

    def _sorted(self) -> list[_Acc]:
        return sorted(self._points.values(), key=lambda a: a.rate)

    def _iso(self) -> dict[float, float]:
        """Attainment per rate, fitted non-increasing in rate (weights: measurements)."""
        if self._iso_cache is None:
            pts = self._sorted()
            fit = isotonic_decreasing([a.attainment for a in pts], [float(a.n) for a in pts])
            self._iso_cache = {a.rate: f for a, f in zip(pts, fit, strict=True)}
        return self._iso_cache

    def _passes(self, acc: _Acc) -> bool:
        return self._iso()[acc.rate] >= self.attainment - 1e-12

    def _counts(self, acc: _Acc) -> bool:
        """Counts toward the capacity: its own mean attainment and the fitted one pass."""
        return self._passes(acc) and acc.attainment >= self.attainment - 1e-12

    def _bracket(self) -> tuple[_Acc | None, _Acc | None]:
        fails = [a for a in self._points.values() if not self._passes(a)]
        hi = min(fails, key=lambda a: a.rate) if fails else None
        passes = [a for a in self._points.values() if self._passes(a) and (hi is None or a.rate < hi.rate)]
        lo = max(passes, key=lambda a: a.rate) if passes else None
        return lo, hi

    def _best(self) -> _Acc | None:
        counting = [a for a in self._points.values() if self._counts(a)]
        return max(counting, key=lambda a: a.goodput) if counting else None

    # --- decision ------------------------------------------------------------------------

    def next_rate(self) -> float | None:
        """The next rate to measure, or None when the search is done."""
        if self._used >= self.max_points:
            return None
        return self._next_search_rate()

    def _done_reason(self) -> str | None:
        """Why the attainment crossing needs no more points (None: it does)."""
        lo, hi = self._bracket()
        if lo is not None and hi is not None and math.log(hi.rate / lo.rate) <= self._p + 1e-12:
            return "bracketed"
        if lo is not None and hi is None and lo.rate >= self._top * (1 - 1e-9):
            return "above"
        if hi is not None and lo is None and hi.rate <= self.rate_min * (1 + 1e-9):
            return "below"
        return None

    def _next_search_rate(self) -> float | None:
        if self._done_reason() is not None:
            return self._refine() if self.refine_goodput else None
        lo, hi = self._bracket()
        if self.prior is not None and (lo is None) != (hi is None):
            edge = lo if lo is not None else hi
            assert edge is not None  # exactly one of lo, hi is set (just checked)
            return self._expand(edge, up=lo is not None)
        if lo is None and hi is None and self.prior is not None:
            return self._clamp(self.prior * math.exp(-0.45 * self._p))
        # Bracketed, by measurements or by the presumed ends of the range (the lowest rate
        # passes, the highest fails, until measured otherwise).
        a = math.log(lo.rate) if lo else math.log(self.rate_min)
        b = math.log(hi.rate) if hi else math.log(self._top)
        if b - a <= self._p + 1e-12:
            # Narrow enough, but an end is only presumed: measure it.
            return self.rate_min if lo is None else self._top
        return self._clamp(math.exp(self._itp(lo, hi, a, b)))

    # --- the goodput bound ---------------------------------------------------------------

    def _regions(self) -> list[tuple[float, float, float]]:
        """Where the capacity could still beat the best measured goodput, as (bound on the
        goodput there, low rate, high rate), loosest first. The open region above the highest
        measured rate (before a fail or the top is measured) is the bracket's business and is
        not listed; ``upper_bound`` adds it."""
        pts = self._sorted()
        if not pts:
            return []
        best = self._best()
        g_best = best.goodput if best else 0.0
        out: list[tuple[float, float, float]] = []
        p0 = pts[0]
        if p0.rate > self.rate_min * (1 + 1e-9):
            # Below the lowest rate: goodput(r) <= r x tokens-per-request <= goodput(p0) / att(p0).
            if p0.attainment > 0 and p0.goodput > 0:
                per_rate = p0.goodput / (p0.rate * p0.attainment)
                bound = p0.rate * per_rate
                low = max(self.rate_min, g_best / per_rate) if g_best > 0 else self.rate_min
                out.append((bound, low, p0.rate))
            else:
                out.append((math.inf, self.rate_min, p0.rate))
        for p, q in zip(pts, pts[1:], strict=False):
            if not self._passes(p) or p.goodput <= 0:
                continue  # every rate above a fail fails (attainment does not rise)
            bound = q.rate * p.goodput / p.rate
            low = max(p.rate, g_best * p.rate / p.goodput) if g_best > 0 else p.rate
            out.append((bound, low, q.rate))
        out = [r for r in out if r[1] < r[2] * (1 - 1e-9)]  # empty: nothing there can beat the best
        out.sort(key=lambda r: -r[0])
        return out

    def upper_bound(self) -> float:
        """Bound on the true capacity from the measured points (monotone attainment, the same
        tokens per request at every rate): inf while a rate above the highest measured one
        could still pass, or when nothing passed and the lowest rate kept no request."""
        pts = self._sorted()
        if not pts or self._passes(pts[-1]):
            return math.inf
        best = self._best()
        bounds = [best.goodput if best else 0.0, *(r[0] for r in self._regions())]
        p0 = pts[0]
        if not self._passes(p0):  # nothing passed: the capacity lies below the lowest rate
            bounds.append(p0.goodput / p0.attainment if p0.attainment > 0 and p0.goodput > 0 else math.inf)
        return max(bounds)

    def _refine(self) -> float | None:
        """After the crossing is bracketed: measure in the loosest region while the bound on
        the goodput exceeds the best measured goodput by more than the precision."""
        best = self._best()
        if best is None or best.goodput <= 0:
            return None
        limit = best.goodput * (1 + self.precision) * (1 + 1e-9)
        for bound, low, high in self._regions():
            if bound <= limit:
                return None  # sorted: every other region is tighter
            a, b = math.log(low), math.log(high)
            if b - a <= self._p * 0.5:
                continue  # narrower than the resolution: noise decides, not another point
            x = (a + b) / 2
            if any(abs(math.log(k) - x) < 0.25 * self._p for k in self._points):
                continue
            return self._clamp(math.exp(x))
        return None

    # --- bracket mechanics ---------------------------------------------------------------

    def _clamp(self, rate: float) -> float:
        return min(max(rate, self.rate_min), self._top)

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
        bound = math.log(self._top if up else self.rate_min)
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
            iso = self._iso()
            la, lb, lt = _logit(iso[lo.rate]), _logit(iso[hi.rate]), _logit(self.attainment)
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
        return tuple(SearchPoint(a.rate, a.attainment, a.goodput, a.n, self._passes(a)) for a in self._sorted())

    def result(self) -> CapacityResult:
        """The capacity found so far (final once ``next_rate()`` returned None)."""
        best = self._best()
        lo, hi = self._bracket()
        reason = self._done_reason()
        censored: Censoring | None = None
        if reason == "above":
            capped = self.ceiling is not None and self.ceiling < self.rate_max
            censored = "at_ceiling" if capped else "above_max"
        elif reason == "below":
            censored = "below_min"
        upper = math.inf if censored in ("above_max", "at_ceiling") else self.upper_bound()
        g = best.goodput if best else 0.0
        if censored == "below_min":
            converged = True
        elif reason is None or g <= 0:
            converged = False
        else:  # the search would stop here by itself: the bound closed (to the resolution)
            converged = not self.refine_goodput or self._refine() is None
        return CapacityResult(
            capacity=g,
            at_rate=best.rate if best else None,
            attainment=best.attainment if best else None,
            points_used=self._used,
            bracket=(lo.rate if lo else None, hi.rate if hi else None),
            converged=converged,
            censored=censored,
            points=self.points(),
            remeasured=tuple(self._remeasured),
            upper=upper,
            ceiling=self.ceiling,
        )


def search_capacity(settings: SearchSettings, measure: Callable[[float], tuple[float, float]],
                    seen: Iterable[tuple[float, float, float]] = (), *, precision: float | None = None,
                    prior: float | None = None, ceiling: float | None = None) -> CapacityResult:
    """The one capacity-search loop, for the executor's real points and the dry run's virtual
    ones alike: a ``CapacitySearch`` on the plan's settings, fed every (rate, attainment,
    goodput) measured so far (``seen``), then asking ``measure(rate) -> (attainment, goodput)``
    until it has its answer."""
    s = settings
    search = CapacitySearch(s.rate.min, s.rate.max, s.precision if precision is None else precision,
                            s.attainment, s.max_points, prior=prior, ceiling=ceiling)
    for seen_rate, attainment, goodput in seen:
        search.observe(seen_rate, attainment, goodput)
    while (rate := search.next_rate()) is not None:
        search.observe(rate, *measure(rate))
    return search.result()
