"""Capacity search against synthetic attainment-vs-rate curves. Figures are printed
(``pytest -s``) and asserted against the targets of issues #6 and #17: within 2% of the true
capacity in <= 8 points without a prior, <= 5 with a good one (the estimate after that many
points, goodput refinement on, as the executor runs it). The curve family that bends
differently (M/M/1 tails, TPOT knees) is in ``test_verdict_calibration.py``."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from orchestrator.analysis.calibration import points_to_within
from orchestrator.analysis.search import CapacitySearch, isotonic_decreasing

RATE_MIN, RATE_MAX = 0.5, 64.0  # the range of the DESIGN's example plan: 128x
TOKENS = 256  # output tokens per request: goodput = rate * attainment * TOKENS
Curve = Callable[[float], float]


def logistic(knee: float, k: float) -> Curve:
    """Attainment falling smoothly in log rate, crossing 0.9 at ``knee``."""
    r50 = knee * math.exp(math.log(9) / k)
    return lambda r: 1.0 / (1.0 + np.exp(k * (np.log(r) - math.log(r50))))


def cliff(knee: float, m: float) -> Curve:
    """Open-loop overload: a plateau just under 1, then a cliff once the queue grows."""
    rm = knee * (0.9 / 0.965) ** (1 / m)

    def f(r):  # float or numpy array
        base = 0.995 - 0.03 * np.minimum(r / rm, 1.0)
        return np.where(r <= rm, base, base * (rm / r) ** m)

    return f


def true_capacity(f: Curve) -> float:
    r = np.exp(np.linspace(math.log(RATE_MIN), math.log(RATE_MAX), 100_001))
    a = f(r)  # type: ignore[arg-type]
    ok = a >= 0.9
    return float((r * a * TOKENS)[ok].max()) if ok.any() else 0.0


def knee_of(f: Curve) -> float:
    lo, hi = math.log(RATE_MIN), math.log(RATE_MAX)
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(math.exp(mid)) >= 0.9 else (lo, mid)
    return math.exp(lo)


def drive(search: CapacitySearch, f: Curve, rng: np.random.Generator | None = None) -> None:
    while (rate := search.next_rate()) is not None:
        a = float(f(rate))
        if rng is not None:  # binomial noise of a 120 s point
            n = max(30, int(rate * 120))
            a = rng.binomial(n, a) / n
        search.observe(rate, a, rate * a * TOKENS)


def curves(rng: np.random.Generator, n: int) -> list[tuple[str, Curve]]:
    out: list[tuple[str, Curve]] = []
    for i in range(n):
        knee = math.exp(rng.uniform(math.log(2), math.log(50)))
        if i % 2:
            out.append(("logistic", logistic(knee, rng.uniform(8, 40))))
        else:
            out.append(("cliff", cliff(knee, rng.uniform(15, 60))))
    return out


# --- the targets ----------------------------------------------------------------------------


def test_bracket_within_precision_in_at_most_8_points_without_prior() -> None:
    rng = np.random.default_rng(1)
    used = []
    for _, f in curves(rng, 200):
        s = CapacitySearch(RATE_MIN, RATE_MAX, refine_goodput=False)
        drive(s, f)
        res = s.result()
        lo, hi = res.bracket
        assert res.converged and lo is not None and hi is not None
        assert hi / lo <= 1.02 + 1e-9
        assert lo <= knee_of(f) * (1 + 1e-6) <= hi * (1 + 1e-6)
        used.append(res.points_used)
    print(f"\n[search] no prior, bracket only: points mean {np.mean(used):.2f}, max {max(used)}")
    assert max(used) <= 8


@pytest.mark.parametrize("noise", [False, True])
def test_capacity_within_2pct_without_prior(noise: bool) -> None:
    rng = np.random.default_rng(2)
    errs, used = [], []
    for _, f in curves(rng, 200):
        s = CapacitySearch(RATE_MIN, RATE_MAX)
        drive(s, f, rng if noise else None)
        errs.append(abs(s.result().capacity / true_capacity(f) - 1))
        used.append(s.points_used)
    errs_a, used_a = np.array(errs), np.array(used)
    within, le8 = float((errs_a <= 0.02).mean()), float((used_a <= 8).mean())
    print(
        f"\n[search] no prior, noise={noise}: within 2% {within:.3f}, max err {errs_a.max():.3f}, "
        f"points mean {used_a.mean():.2f} p90 {np.quantile(used_a, 0.9):.0f} max {used_a.max()}, <=8 {le8:.3f}"
    )
    assert within >= (0.9 if noise else 0.97)
    assert errs_a.max() <= 0.06
    assert used_a.max() <= 12  # max_points


def trace(search: CapacitySearch, f: Curve, rng: np.random.Generator | None = None) -> list[float]:
    """The capacity the search would report after each of its points."""
    out = []
    while (rate := search.next_rate()) is not None:
        a = float(f(rate))
        if rng is not None:
            n = max(30, int(rate * 120))
            a = rng.binomial(n, a) / n
        search.observe(rate, a, rate * a * TOKENS)
        out.append(search.result().capacity)
    return out


@pytest.mark.parametrize("noise", [False, True])
def test_good_prior_within_2pct_in_at_most_5_points(noise: bool) -> None:
    rng = np.random.default_rng(3)
    errs, used, to2 = [], [], []
    for _, f in curves(rng, 200):
        prior = knee_of(f) * math.exp(rng.normal(0, 0.03))  # a good prior: ~3% off
        s = CapacitySearch(RATE_MIN, RATE_MAX, prior=prior)
        tr = trace(s, f, rng if noise else None)
        truth = true_capacity(f)
        errs.append(abs(tr[-1] / truth - 1))
        used.append(s.points_used)
        to2.append(points_to_within(tr, truth))
    errs_a, used_a, to2_a = np.array(errs), np.array(used), np.array(to2)
    within, le5 = float((errs_a <= 0.02).mean()), float((to2_a <= 5).mean())
    print(
        f"\n[search] good prior, noise={noise}: within 2% {within:.3f}, max err {errs_a.max():.3f}, "
        f"points mean {used_a.mean():.2f} max {used_a.max()}, within 2% by point 5 {le5:.3f}"
    )
    assert le5 >= (0.85 if noise else 0.95)
    assert within >= (0.85 if noise else 0.97)
    assert used_a.max() <= 12


# --- mechanics ------------------------------------------------------------------------------


def test_first_point_is_geometric_middle_or_just_under_the_prior() -> None:
    assert CapacitySearch(1.0, 100.0).next_rate() == pytest.approx(10.0)
    s = CapacitySearch(1.0, 100.0, prior=20.0)
    assert 19.5 < (s.next_rate() or 0) < 20.0


def test_next_rate_is_idempotent() -> None:
    s = CapacitySearch(1.0, 100.0)
    s.observe(10.0, 1.0, 100.0)
    assert s.next_rate() == s.next_rate()


def test_censored_above_when_highest_rate_passes() -> None:
    s = CapacitySearch(RATE_MIN, RATE_MAX)
    drive(s, lambda r: 0.99)
    res = s.result()
    assert res.censored == "above_max" and res.at_rate == pytest.approx(RATE_MAX)
    assert res.capacity == pytest.approx(RATE_MAX * 0.99 * TOKENS)
    assert res.upper == math.inf and not res.value().is_point


def test_censored_below_when_lowest_rate_fails() -> None:
    s = CapacitySearch(RATE_MIN, RATE_MAX)
    drive(s, lambda r: 0.5)
    res = s.result()
    assert res.censored == "below_min" and res.capacity == 0.0 and res.at_rate is None
    assert min(p.rate for p in res.points) == pytest.approx(RATE_MIN)
    # Below the lowest rate the goodput is at most what that rate offered.
    assert res.upper == pytest.approx(RATE_MIN * TOKENS)
    assert res.value().bounds == (0.0, pytest.approx(RATE_MIN * TOKENS))


def test_the_generators_ceiling_caps_the_search_and_censors_at_it() -> None:
    s = CapacitySearch(RATE_MIN, RATE_MAX, ceiling=20.0)
    rates = []
    while (rate := s.next_rate()) is not None:
        rates.append(rate)
        s.observe(rate, 0.99, rate * 0.99 * TOKENS)
    res = s.result()
    assert max(rates) == pytest.approx(20.0)
    assert res.censored == "at_ceiling" and res.ceiling == 20.0 and res.upper == math.inf
    assert res.value().censored == "at_ceiling"
    with pytest.raises(ValueError, match="ceiling"):
        s.observe(30.0, 1.0, 1.0)  # a point above the ceiling is not a measurement
    with pytest.raises(ValueError, match="ceiling"):
        CapacitySearch(1.0, 10.0, ceiling=0.5)
    # A ceiling above the range changes nothing: censored at the range's top.
    t = CapacitySearch(RATE_MIN, RATE_MAX, ceiling=100.0)
    drive(t, lambda r: 0.99)
    assert t.result().censored == "above_max"


def test_running_out_of_points_is_unconverged_with_a_bound() -> None:
    s = CapacitySearch(RATE_MIN, RATE_MAX, max_points=4)
    drive(s, cliff(12.0, 30))
    res = s.result()
    assert not res.converged and res.censored is None
    lo, hi = res.value().bounds
    assert lo == res.capacity and hi >= res.capacity and not res.value().is_point


def test_a_converged_search_is_a_point_with_a_tight_bound() -> None:
    s = CapacitySearch(RATE_MIN, RATE_MAX)
    drive(s, logistic(7.0, 20))
    res = s.result()
    assert res.converged and res.censored is None and res.value().is_point
    assert res.capacity <= res.upper <= res.capacity * 1.02 + 1e-9


def test_a_pass_above_a_fail_is_pooled_not_remeasured() -> None:
    # Re-measuring the point whose outcome looked wrong keeps a selected draw; the isotonic fit
    # pools the two instead (attainment does not rise with the rate), at no extra point.
    s = CapacitySearch(1.0, 100.0)
    s.observe(10.0, 0.85, 10.0 * 0.85)  # fail at 10
    s.observe(20.0, 0.93, 20.0 * 0.93)  # a pass above a fail
    pts = {p.rate: p for p in s.points()}
    assert not pts[20.0].passed and not pts[10.0].passed  # pooled: 0.89 < 0.9 at both
    assert s.next_rate() not in (10.0, 20.0)
    assert s.result().remeasured == ()
    assert isotonic_decreasing([0.95, 0.85, 0.93, 0.5], [1, 1, 1, 1]) == pytest.approx([0.95, 0.89, 0.89, 0.5])
    assert isotonic_decreasing([0.85, 0.93], [3, 1]) == pytest.approx([0.87, 0.87])


def test_a_rate_measured_twice_keeps_the_mean_of_its_measurements() -> None:
    s = CapacitySearch(1.0, 100.0)
    s.observe(10.0, 0.95, 100.0)
    s.observe(10.0, 0.91, 90.0)
    (p,) = s.points()
    assert p.measurements == 2 and p.attainment == pytest.approx(0.93) and p.goodput == pytest.approx(95.0)
    assert s.result().capacity == pytest.approx(95.0)  # the mean, not the last (90) or the best
    assert s.result().remeasured == (10.0,)


def test_goodput_below_the_lowest_pass_is_bounded_and_refined() -> None:
    # Attainment falls faster than the rate rises just below the crossing (a TPOT knee): the
    # goodput peaks below the lowest pass. The bound goodput(p)/attainment(p) says so, and the
    # search measures there instead of stopping at the crossing.
    def f(r):
        return 1.0 / (1.0 + np.exp(40 * (np.log(r) - math.log(10.0))))

    s = CapacitySearch(RATE_MIN, RATE_MAX, prior=knee_of(f))
    drive(s, f)
    res = s.result()
    assert min(p.rate for p in res.points) < knee_of(f) * 0.97
    assert res.capacity == pytest.approx(true_capacity(f), rel=0.01)
    assert res.converged


def test_points_from_another_class_save_points() -> None:
    f = cliff(12.0, 30)
    fresh = CapacitySearch(RATE_MIN, RATE_MAX)
    drive(fresh, f)
    fed = CapacitySearch(RATE_MIN, RATE_MAX)
    for p in fresh.points()[:3]:  # e.g. measured while searching a looser class
        fed.observe(p.rate, p.attainment, p.goodput)
    drive(fed, f)
    assert fed.result().capacity == pytest.approx(fresh.result().capacity, rel=0.02)
    assert fed.points_used - 3 < fresh.points_used  # its own measurements


def test_max_points_bounds_the_search() -> None:
    s = CapacitySearch(RATE_MIN, RATE_MAX, max_points=3)
    drive(s, logistic(7.0, 20))
    assert s.points_used == 3 and not s.result().converged


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="rate_min"):
        CapacitySearch(10.0, 1.0)
    with pytest.raises(ValueError, match="prior"):
        CapacitySearch(1.0, 10.0, prior=-1.0)
    with pytest.raises(ValueError, match="attainment"):
        CapacitySearch(1.0, 10.0).observe(2.0, 1.5, 0.0)


def test_result_to_dict() -> None:
    s = CapacitySearch(1.0, 100.0)
    drive(s, cliff(30.0, 30))
    d = s.result().to_dict()
    assert d["points_used"] == s.points_used and len(d["points"]) >= 2  # type: ignore[arg-type]
