"""Capacity over history from censored and converged runs (issue 32, item 1): the Turnbull NPMLE
against independent computations (Kaplan-Meier by hand, the likelihood maximised over a grid,
the empirical distribution), its median's rules, the order-statistic interval against the
binomial distribution and its coverage under censoring, and the counts as a reader sees them."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from orchestrator.analysis.blocks import CapacityValue
from orchestrator.analysis.censored import (
    RunInterval,
    censored_median,
    describe_median,
    describe_runs,
    innermost_intervals,
    order_statistic_k,
    run_interval,
    turnbull,
)


def _point(v: float) -> RunInterval:
    return run_interval(v, None, True, None)


def _above(v: float) -> RunInterval:
    return run_interval(v, "above_max", True, None)


def _below(upper: float) -> RunInterval:
    return run_interval(0.0, "below_min", True, upper)


def _loglik(lower: list[float], upper: list[float], inner: np.ndarray, mass: np.ndarray) -> float:
    return float(sum(math.log(sum(m for (q, p), m in zip(inner, mass, strict=True) if lo <= q and p <= hi))
                     for lo, hi in zip(lower, upper, strict=True)))


def test_points_only_give_the_empirical_distribution_and_the_interpolated_median() -> None:
    values = [120.0, 80.0, 80.0, 200.0, 150.0, 90.0]
    inner, mass = turnbull(values, values)
    assert inner[:, 0].tolist() == [80.0, 90.0, 120.0, 150.0, 200.0]
    assert mass == pytest.approx([2 / 6, 1 / 6, 1 / 6, 1 / 6, 1 / 6])
    m = censored_median([_point(v) for v in values])
    assert m.median == pytest.approx(float(np.median(values)))  # (90 + 120) / 2, as percentile_cont
    assert m.censored is None and (m.n_points, m.runs) == (6, 6)
    assert describe_runs(m) == "6"


def test_right_censored_runs_give_the_kaplan_meier_estimate() -> None:
    """Points 100, 150, 200, 300 and runs censored above at 120 and 250: Turnbull's masses are the
    product-limit estimate's jumps, computed here by hand."""
    runs = [_point(100), _above(120), _point(150), _point(200), _above(250), _point(300)]
    inner, mass = turnbull([r.lower for r in runs], [r.upper for r in runs])
    # Kaplan-Meier: at 100, 6 at risk; 150: 4; 200: 3; 300: 1 (the censored leave after their bound)
    survival, jumps = 1.0, []
    for at_risk in (6, 4, 3, 1):
        after = survival * (at_risk - 1) / at_risk
        jumps.append(survival - after)
        survival = after
    assert inner.tolist() == [[100, 100], [150, 150], [200, 200], [300, 300]]
    assert mass == pytest.approx(jumps)
    m = censored_median(runs)
    # F(150) = 1/6 + 5/24 < 1/2 <= F(200): the median is 200; the point-only median was 175
    assert (m.median, m.censored) == (200.0, None)
    assert describe_runs(m) == "6 = 4 points + 2 censored >= 120"


def test_mixed_intervals_maximise_the_likelihood_over_a_grid() -> None:
    """Points, a run censored below, one above and an unconverged bracket: the EM's masses reach
    the largest likelihood a fine grid over the simplex finds, and sit where the grid's best is."""
    runs = [_below(60), _point(50), run_interval(40, None, False, 120), _point(110), _above(100), _point(130)]
    lo, hi = [r.lower for r in runs], [r.upper for r in runs]
    inner, mass = turnbull(lo, hi)
    assert inner.tolist() == [[50, 50], [110, 110], [130, 130]]
    step = 0.005
    best, best_mass = -math.inf, None
    for i, j in itertools.product(range(201), repeat=2):
        a, b = i * step, j * step
        if a + b > 1 or a == 0 or b == 0 or a + b == 1:
            continue
        grid = np.array([a, b, 1 - a - b])
        ll = _loglik(lo, hi, inner, grid)
        if ll > best:
            best, best_mass = ll, grid
    assert _loglik(lo, hi, inner, mass) >= best - 1e-9
    assert mass == pytest.approx(best_mass, abs=2 * step)


def test_the_issues_three_arm_example_counts_every_run() -> None:
    """Arm C: 149, 171, 181 counted, three runs censored at >= 256, 256, 267 left out. From all
    six the CDF is 1/2 from 181 up to 267 (the innermost interval of the censored ones): the
    median is that flat stretch's midpoint, not the 171 of the points alone."""
    runs = [_point(149), _point(171), _point(181), _above(256), _above(256), _above(267)]
    m = censored_median(runs)
    assert (m.median, m.censored) == ((181 + 267) / 2, None)
    assert (m.low, m.high, m.level) == (149.0, math.inf, pytest.approx(1 - 2 / 2**6))
    assert describe_runs(m) == "6 = 3 points + 3 censored >= 256"


def test_a_median_censored_above_reads_at_least() -> None:
    m = censored_median([_above(1323), _above(1365)])
    assert (m.median, m.censored) == (1365.0, "above")
    assert describe_median(m.median, m.censored) == ">= 1,365"
    assert describe_runs(m) == "2 = 2 censored >= 1,323"
    more = censored_median([_point(100), _point(200), _above(300), _above(300), _above(400)])
    assert (more.median, more.censored) == (400.0, "above")  # 3 of 5 runs at least 300; the NPMLE: >= 400


def test_a_median_censored_below_reads_at_most() -> None:
    m = censored_median([_below(50), _below(50), _below(40), _point(100), _point(200)])
    # 3 of 5 runs at most 50, one at most 40: the NPMLE puts their mass in [0, 40]
    assert (m.median, m.censored) == (40.0, "below")
    assert describe_median(m.median, m.censored) == "<= 40"
    assert describe_runs(m) == "5 = 2 points + 3 censored <= 50"


def test_an_unconverged_bracket_holding_the_median_gives_its_midpoint() -> None:
    m = censored_median([run_interval(100, None, False, 140), _point(50), _point(300)])
    assert (m.median, m.censored, m.n_unconverged) == (120.0, None, 1)
    assert describe_runs(m) == "3 = 2 points + 1 unconverged"


@pytest.mark.parametrize("n", range(1, 41))
def test_order_statistic_k_is_the_binomial_one(n: int) -> None:
    k, coverage = order_statistic_k(n, 0.95)
    want = max([j for j in range(1, (n + 1) // 2 + 1) if 2 * sps.binom.cdf(j - 1, n, 0.5) <= 0.05] or [1])
    assert k == want
    assert coverage == pytest.approx(1 - 2 * sps.binom.cdf(k - 1, n, 0.5))


@pytest.mark.parametrize("n", [1023, 1024, 5000])
def test_order_statistic_k_holds_for_a_group_of_thousands_of_runs(n: int) -> None:
    """A group past 1023 runs (a nightly gate over three years): 2.0**n overflowed and `orch
    capacity` failed; the exact sums give scipy's binomial answer."""
    k, coverage = order_statistic_k(n, 0.95)
    assert 2 * sps.binom.cdf(k - 1, n, 0.5) <= 0.05 < 2 * sps.binom.cdf(k, n, 0.5)
    assert coverage == pytest.approx(1 - 2 * sps.binom.cdf(k - 1, n, 0.5), abs=1e-12)


def test_the_median_interval_covers_under_censoring() -> None:
    """Lognormal capacities, a third of them censored above at a random bound below them and a
    tenth below: the interval of lower and upper ends covers the true median at least at its
    level (fixed seed; 2,000 groups of 15)."""
    rng = np.random.default_rng(7)
    true_median, covered = 1000.0, 0
    for _ in range(2000):
        x = true_median * np.exp(rng.normal(0, 0.4, 15))
        runs = []
        for v in x:
            u = rng.random()
            if u < 1 / 3:
                runs.append(_above(v * rng.uniform(0.5, 1.0)))
            elif u < 1 / 3 + 0.1:
                runs.append(_below(v * rng.uniform(1.0, 1.5)))
            else:
                runs.append(_point(v))
        m = censored_median(runs)
        covered += m.low <= true_median <= m.high
    _, level = order_statistic_k(15)
    assert level >= 0.95
    assert covered / 2000 >= level - 0.01  # binomial noise of 2,000 draws: sd 0.004


@pytest.mark.parametrize(("value", "censored", "converged", "upper"), [
    (250.0, None, True, None), (250.0, "above_max", True, None), (250.0, "at_ceiling", True, 400.0),
    (0.0, "below_min", True, 12.5), (0.0, None, True, 12.5), (90.0, None, False, 130.0), (90.0, "above_max", False, None),
])
def test_a_stored_capacity_reads_as_the_verdict_reads_it(value, censored, converged, upper) -> None:
    """run_interval is CapacityValue's bounds of the same stored row (control.verdicts reads it so)."""
    got = run_interval(value, censored, converged, upper)
    if censored is None and converged and value > 0:
        want = CapacityValue(value)
    else:
        lower = None if censored == "below_min" or (censored is None and converged) else value
        want = CapacityValue(value, lower=lower, upper=upper, censored=censored, converged=converged)
    assert (got.lower, got.upper) == want.bounds


def test_innermost_intervals_of_touching_closed_intervals() -> None:
    inner = innermost_intervals(np.array([0.0, 10.0, 10.0]), np.array([10.0, 20.0, math.inf]))
    assert inner.tolist() == [[10.0, 10.0]]  # all three hold 10


def test_no_runs_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one"):
        censored_median([])


def test_right_censoring_only_takes_the_product_limit_path_with_the_npmle_median() -> None:
    """Points and runs censored above only (ties between them included, on a coarse grid): the
    product-limit path's median is the Turnbull EM's, group by group."""
    from orchestrator.analysis.censored import npmle_median, right_censored_median

    rng = np.random.default_rng(5)
    for _ in range(400):
        n = int(rng.integers(1, 14))
        values = rng.integers(1, 9, size=n).astype(float) * 10  # ties are common
        censored = rng.random(n) < rng.choice([0.0, 0.2, 0.5, 0.9])
        points, above = list(values[~censored]), list(values[censored])
        lo = points + above
        hi = points + [math.inf] * len(above)
        inner, mass = turnbull(lo, hi)
        want = npmle_median(inner, mass)
        got = right_censored_median(points, above)
        assert got[1] == want[1] and got[0] == pytest.approx(want[0]), (points, above)


def _dense_turnbull(lo: np.ndarray, hi: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """The textbook self-consistency iteration over the full incidence matrix (Turnbull 1976)."""
    a = ((lo[:, None] <= inner[None, :, 0]) & (inner[None, :, 1] <= hi[:, None])).astype(float)
    mass = np.full(len(inner), 1.0 / len(inner))
    for _ in range(20_000):
        new = mass * (a / (a @ mass)[:, None]).mean(axis=0)
        if np.max(np.abs(new - mass)) < 1e-12:
            return new / new.sum()
        mass = new
    return mass / mass.sum()


def test_the_em_by_prefix_sums_is_the_textbook_iteration() -> None:
    """turnbull runs the EM on each observation's contiguous run of innermost intervals (prefix
    sums: a group of thousands of runs in milliseconds); its masses are the full matrix's, on
    groups with points, ties, runs censored above (bounded or not), below and unconverged."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(2, 60))
        v = np.round(rng.lognormal(6, 0.3, n), int(rng.integers(0, 2)))
        lo, hi = v.copy(), v.copy()
        for i in range(n):
            u = rng.random()
            if u < 0.25:
                hi[i] = math.inf if rng.random() < 0.7 else v[i] * 1.2
            elif u < 0.35:
                lo[i], hi[i] = 0.0, v[i] * rng.uniform(1, 1.5)
        inner, mass = turnbull(lo, hi)
        np.testing.assert_allclose(mass, _dense_turnbull(lo, hi, inner), atol=1e-12)
