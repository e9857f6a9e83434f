"""The verdict rules of issue 31, each with a test that fails without it: the median block ratio
as the estimand with a near-exact bound (coverage, power), the search's resolution on each end,
the carry-over rule, the sequential looks, voided attempts per arm, and a stored verdict
re-judged by the rule that made it. The calibration table is benchmarks/verdict_calibration.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats as sps

from orchestrator.analysis import verdict_cases as vc
from orchestrator.analysis.carryover import order_effect
from orchestrator.analysis.critical import (
    MEDIAN,
    MEDIAN_SKEW,
    ROBUST,
    Method,
    critical_value,
    far_end,
    skew_sign,
    trim_count,
)
from orchestrator.analysis.power import accept_probability
from orchestrator.analysis.sequential import SPENDINGS, look_blocks, shares, spent
from orchestrator.analysis.stats import judge
from orchestrator.control.verdicts import judge_experiment, recheck_verdicts
from orchestrator.plan import Bar, Design
from tests.unit.test_verdict_gate import _caps, _Store

pytestmark = pytest.mark.unit


def _plan(blocks: int, at_least: float = 1.10, metric: str = "capacity", **design) -> SimpleNamespace:
    bar = Bar.model_validate({"id": "b", "class": "standard", "at_least": at_least, "metric": metric,
                              **({"rate": 5.0} if metric != "capacity" else {})})
    return SimpleNamespace(bars=[bar], design=Design(blocks=blocks, order="ABBA", seed=1, **design),
                           arms={"A": None, "B": None}, search=SimpleNamespace(precision=0.02, point_s=10.0,
                                                                               warmup_s=2.0, cooldown_s=1.0),
                           arm=lambda name: SimpleNamespace(gpus=1),
                           per_block=None, block_arms=lambda: [("A", "B")] * blocks)  # complete blocks


# --- the estimand and its bound --------------------------------------------------------------


@pytest.mark.parametrize("kind", vc.NOISES)
@pytest.mark.parametrize("blocks", [2, 3, 4, 6, 9, 10])
def test_each_end_covers_the_median_near_its_promise(kind: str, blocks: int) -> None:
    """95% one-sided ends cover the true median 95-97% of the time under normal, t(3) and
    contaminated noise (the geometric-mean rule before covered 99%+ under normal noise).
    40,000 draws: a standard error of 0.001 on each end."""
    c = vc.coverage(kind, blocks, 40_000, np.random.default_rng([31, blocks, len(kind)]))
    for end in (c.lower, c.upper):
        assert 0.945 <= end <= 0.973, (kind, blocks, c)


@pytest.mark.parametrize("kind", vc.NOISES)
def test_two_blocks_keep_the_promise_whatever_the_noise_to_floor_ratio(kind: str) -> None:
    """At 2 blocks a floored spread takes half the critical value: every end covers at least 95%
    from far under the floor to far over it (more under it: the floor is a resolution), where the
    full value covered 0.975-0.994 at sd 0.05."""
    for sigma in (0.002, 0.01, 0.02, 0.05, 0.1, 0.5):
        c = vc.coverage(kind, 2, 40_000, np.random.default_rng([7, int(sigma * 1000)]), sigma=sigma)
        assert min(c.lower, c.upper) >= 0.945, (kind, sigma, c)
    full = vc.coverage(kind, 2, 40_000, np.random.default_rng(8), method=MEDIAN)
    assert max(full.lower, full.upper) > 0.973


def test_the_floored_share_keeps_the_promise_at_every_floor() -> None:
    """The scan behind FLOORED_SHARE: at 2 blocks, floors of 0-3 clean sds, every shape."""
    lowest, highest, where = vc.floored_scan(0.95, 1 << 16)
    assert lowest >= 0.945, where
    assert highest > 0.99  # far under the floor it over-covers: the floor is a resolution


def test_two_identical_blocks_are_judged_at_the_floor_with_half_the_value() -> None:
    j = judge([0.1, 0.1], 1.0, 0.95)
    half = 0.5 * critical_value(2, 0.95) * 0.01 / math.sqrt(2)
    assert math.log(j.lower) == pytest.approx(0.1 - half) and math.log(j.upper) == pytest.approx(0.1 + half)
    assert "0.5x the critical value where the spread floor sets the width" in j.label
    apart = judge([0.08, 0.12], 1.0, 0.95)  # spread 0.028 > the floor: the full value
    assert math.log(apart.lower) == pytest.approx(0.1 - critical_value(2, 0.95) * 0.02)  # se: 0.04 / 2


@pytest.mark.parametrize("blocks", [3, 4])
def test_one_symmetric_critical_value_over_covers_the_far_end(blocks: int) -> None:
    """What the far-end factor fixes: MEDIAN's one critical value covers the contaminated
    shape's far end above 97% at 3 and 4 blocks (0.979, 0.974)."""
    c = vc.coverage("contaminated", blocks, 40_000, np.random.default_rng([31, blocks, 12]), method=MEDIAN)
    assert c.upper > 0.972


def test_the_far_end_is_the_one_away_from_the_long_tail() -> None:
    """A low outlier (a long low tail) leaves the lower end at the near critical value and
    widens the upper one; its mirror image the reverse; no skew takes the wide value on both."""
    x = np.log([1.20, 1.22, 1.23, 1.05])
    j = judge(x, 1.1, 0.95)
    loc, c = x.mean(), critical_value(4, 0.95)
    se = x.std(ddof=1) / 2
    assert skew_sign(x[None, :])[0] == -1 and far_end(4) > 1
    assert math.log(j.lower) == pytest.approx(loc - c * se)
    assert math.log(j.upper) == pytest.approx(loc + far_end(4) * c * se)
    m = judge(-x, 1 / 1.1, 0.95)
    assert math.log(m.lower) == pytest.approx(-loc - far_end(4) * c * se)
    assert math.log(m.upper) == pytest.approx(-loc + c * se)
    even = math.log(1.25) + np.array([-0.05, 0.0, 0.05, 0.0])
    flat = judge(even, 1.1, 0.95)
    assert skew_sign(even[None, :])[0] == 0
    assert -math.log(flat.lower) + math.log(flat.estimate) == pytest.approx(
        math.log(flat.upper) - math.log(flat.estimate))
    assert "4 blocks" not in j.label and "long tail" in j.label


@pytest.mark.parametrize("blocks", [3, 4, 9])
def test_the_p_value_agrees_with_the_verdict(blocks: int) -> None:
    """ACCEPT at 95% iff the one-sided p-value is at most 0.05, for either sign of skew."""
    rng = np.random.default_rng(blocks)
    for _ in range(300):
        x = math.log(1.2) + rng.normal(0, 0.06, blocks)
        j = judge(x, 1.1, 0.95)
        if abs(j.p_value - 0.05) > 1e-3:
            assert (j.verdict == "ACCEPT") == (j.p_value <= 0.05), (x, j.p_value)


def test_power_analysis_matches_the_simulated_rule_at_four_blocks() -> None:
    """The dry run's power (half the experiments at each end's critical value, exact under
    normal noise) equals the simulated rule's to Monte Carlo error."""
    sim = vc.power("normal", 4, 80_000, np.random.default_rng(9))
    assert accept_probability(4, 0.05, 1.25, 1.10, 0.95) == pytest.approx(sim, abs=0.006)
    assert accept_probability(4, 0.05, 1.25, 1.10, 0.95, method=MEDIAN) > sim  # one value: more power, over-covers


def test_censored_blocks_take_the_wide_value_on_both_ends() -> None:
    from orchestrator.analysis.blocks import BlockRatio, CapacityValue

    pts = [1.20, 1.22, 1.23]
    # B unconverged in [115, 125] against A's 100: the block's ratio is in [1.15, 1.25]
    cens = BlockRatio.of(3, 100.0, CapacityValue(120.0, 115.0, 125.0, converged=False))
    j = judge([*np.log(pts), cens], 1.1, 0.95)
    assert j.censored and j.verdict != "INCONCLUSIVE" or math.isfinite(j.lower)
    # every corner, each end at the wide value, is at least as wide as the point rule's bound
    for corner in (1.15, 1.25):
        rows = np.log([*pts, corner])
        loc, se = rows.mean(), rows.std(ddof=1) / 2
        wide = far_end(4) * critical_value(4, 0.95) * se
        assert math.log(j.lower) <= loc - wide + 1e-12 and math.log(j.upper) >= loc + wide - 1e-12
    # ... and equal to the widest of them
    lows = [np.log([*pts, c]).mean() - far_end(4) * critical_value(4, 0.95) * np.log([*pts, c]).std(ddof=1) / 2
            for c in (1.15, 1.25)]
    assert math.log(j.lower) == pytest.approx(min(lows))


def test_the_robust_mean_rule_over_covers_which_is_what_changed() -> None:
    c = vc.coverage("normal", 4, 40_000, np.random.default_rng(5), method=ROBUST)
    assert c.lower > 0.985


def test_power_at_four_blocks_meets_the_target() -> None:
    rng = np.random.default_rng(44)
    assert vc.power("normal", 4, 40_000, rng) >= 0.8
    assert vc.power("normal", 4, 40_000, rng, method=ROBUST) < 0.7  # the old rule's price


def test_the_trim_starts_at_ten_blocks_and_the_critical_values_are_seeded() -> None:
    assert [trim_count(n) for n in (2, 9, 10, 20, 40)] == [0, 0, 1, 3, 7]
    assert critical_value(4, 0.95, MEDIAN) == critical_value(4, 0.95, MEDIAN)
    assert abs(critical_value(5, 0.95, MEDIAN) - sps.t.ppf(0.95, 4)) < 0.1  # near Student t where it is exact


def test_skewed_blocks_with_the_median_at_the_bar_are_not_accepted() -> None:
    rng = np.random.default_rng(3)
    for share in (0.1, 0.2):
        assert vc.skewed_false_accepts(share, 0.02, 10, 20_000, rng) <= 0.06


def test_the_label_names_the_estimand() -> None:
    j = judge(np.log([1.2, 1.25, 1.22, 1.24]), 1.1, 0.95)
    assert "median block ratio" in j.label and j.method == MEDIAN_SKEW
    assert "long tail" in j.label and "1.7x" in j.label


# --- the search's resolution ------------------------------------------------------------------


def test_a_constant_search_error_never_decides_a_bar_closer_than_the_resolution() -> None:
    """Every block 1.5% high with no spread: without the resolution 40 blocks ACCEPT a bar at
    the truth; with a 2% search's resolution on each end no number of blocks does."""
    rho = math.log1p(0.02)
    assert judge([0.015] * 40, 1.0, 0.95).verdict == "ACCEPT"
    for n in (2, 5, 10, 40):
        j = judge([0.015] * n, 1.0, 0.95, resolution=rho)
        assert j.verdict == "INCONCLUSIVE" and j.lower < 1.0
    assert "resolution" in judge([0.015] * 4, 1.0, 0.95, resolution=rho).label


def test_capacity_bars_carry_the_search_precision_and_point_bars_none() -> None:
    (o,) = judge_experiment(_Store(_caps([100.0] * 4, [115.0, 117.0, 116.0, 118.0])), 1, _plan(4))
    assert o.judgement.resolution == pytest.approx(math.log1p(0.02))
    assert o.evidence()["resolution"] == pytest.approx(math.log1p(0.02))


# --- carry-over --------------------------------------------------------------------------------


def test_the_order_effect_is_welchs_interval() -> None:
    rng = np.random.default_rng(9)
    x, y = rng.normal(0.0, 0.03, 6), rng.normal(0.02, 0.05, 5)
    oe = order_effect([*x, *y], [True] * 6 + [False] * 5, 0.95)
    ci = sps.ttest_ind(x, y, equal_var=False).confidence_interval(0.90)
    assert oe.estimate == pytest.approx(x.mean() - y.mean())
    assert (oe.lower, oe.upper) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert not order_effect([0.1, 0.2, 0.3], [True, True, False], 0.95).estimable


def _carried_caps() -> dict:
    """ABBA, B 20% better, but the run right after B is 5% slower inside a block: blocks run
    B-then-A (odd blocks) read B/A 5% high."""
    rng = np.random.default_rng(1)
    a = [100.0 * (0.95 if blk % 2 else 1.0) * math.exp(rng.normal(0, 0.005)) for blk in range(8)]
    b = [120.0 * math.exp(rng.normal(0, 0.005)) for _ in range(8)]
    return _caps(a, b)


def test_a_carry_over_beyond_its_bound_voids_the_verdict() -> None:
    (o,) = judge_experiment(_Store(_carried_caps()), 1, _plan(8))
    assert o.carryover is not None and o.carryover.exceeds and o.carryover.estimate < 0
    assert o.judgement.verdict == "INCONCLUSIVE" and "exceeds its bound" in o.judgement.note
    assert o.evidence()["carryover"]["exceeds"] is True


def test_a_registered_warn_keeps_the_verdict_and_says_so() -> None:
    (o,) = judge_experiment(_Store(_carried_caps()), 1, _plan(8, carryover={"action": "warn"}))
    assert o.judgement.verdict == "ACCEPT" and "warned" in o.judgement.note


def test_a_bound_wider_than_the_effect_lets_it_stand() -> None:
    (o,) = judge_experiment(_Store(_carried_caps()), 1, _plan(8, carryover={"bound": 0.2}))
    assert o.carryover is not None and not o.carryover.exceeds
    assert o.judgement.verdict == "ACCEPT"


def test_the_rule_keeps_false_accepts_down_where_the_noise_lets_it_see() -> None:
    rng = np.random.default_rng(12)
    with_rule, _ = vc.carryover_false_accepts(16, 20_000, rng, sigma=0.01)
    without, _ = vc.carryover_false_accepts(16, 20_000, rng, sigma=0.01, void=False)
    assert with_rule <= 0.06 < without


# --- sequential looks ---------------------------------------------------------------------------


def test_lead_ins_cancel_a_carry_over_one_arm_leaves() -> None:
    """The issue's case: the run right after B inside a block is 3% slower; a bar without a
    search's resolution at sd 0.02, 10 blocks. ABBA and the order-effect rule: false accepts
    about 0.18; with a lead-in of each block's first arm every run follows the same arm."""
    assert list(vc.carry_penalties(4, 0.03)) == pytest.approx([0, -math.log1p(-0.03), 0, -math.log1p(-0.03)])
    assert not vc.carry_penalties(6, 0.03, lead_in=True).any()
    assert not vc.carry_penalties(6, 0.03, across_blocks=True).any()  # back to back, ABBA is balanced
    assert vc.carry_penalties(4, 0.03, lead_in=True, switch_only=True).any()  # what lead-ins do not cancel
    rng = np.random.default_rng(21)
    led, _ = vc.carryover_false_accepts(10, 40_000, rng, sigma=0.02, lead_in=True)
    plain, _ = vc.carryover_false_accepts(10, 40_000, rng, sigma=0.02)
    assert led <= 0.06 < 0.12 < plain


def test_alpha_spending_sums_to_alpha() -> None:
    assert look_blocks(8, 2, 2) == [2, 4, 6, 8] and look_blocks(9, 3, 2) == [4, 6, 8, 9]
    for kind in SPENDINGS:
        s = shares([2, 4, 6, 8], 8, 0.05, kind)
        assert sum(s) == pytest.approx(1.0) and all(x > 0 for x in s)
        assert spent(1.0, 0.05, kind) == pytest.approx(0.05)
    obf = shares([2, 4, 6, 8], 8, 0.05, "obrien_fleming")
    assert obf[0] < 0.01 < obf[-1]  # almost nothing early


def test_an_obvious_win_stops_at_the_first_look_and_prices_the_rest() -> None:
    store = _Store(_caps([100.0] * 8, [150.0, 151.0, 149.0, 150.5, 150.0, 149.5, 151.0, 150.0]))
    store.points = lambda run_id: [1, 2, 3]  # three load points per run
    (o,) = judge_experiment(store, 1, _plan(8, sequential={"min_blocks": 2, "spending": "pocock"}))
    assert o.look is not None and o.look.stopped and o.look.blocks == 2
    assert o.judgement.verdict == "ACCEPT" and o.blocks == [0, 1] and "sequential look 1 of 4" in o.judgement.label
    # 2 runs x 3 points x 13 s per block, 6 blocks not run
    assert o.gpu_hours_saved == pytest.approx(6 * 2 * 3 * 13 / 3600)


def test_the_sequential_rule_keeps_its_error_and_saves_blocks() -> None:
    rng = np.random.default_rng(8)
    fixed = vc.sequential_run(8, 20_000, rng, spending=None)
    seq = vc.sequential_run(8, 20_000, rng, spending="obrien_fleming")
    assert seq.false_accepts <= 0.05 + 0.005 and seq.mean_blocks_alt < fixed.mean_blocks_alt - 2


# --- retries and a stored verdict's rule ----------------------------------------------------------


def test_voided_attempts_are_counted_per_arm() -> None:
    store = _Store(_caps([100.0] * 4, [115.0, 117.0, 116.0, 118.0]))
    store._runs.append(SimpleNamespace(id=99, block=1, arm="B", status="done", valid=False, finished=True,
                                       invalid_reason="steady_state"))
    (o,) = judge_experiment(store, 1, _plan(4))
    assert o.voided == {"A": 0, "B": 1} and o.evidence()["voided_attempts"] == {"A": 0, "B": 1}


def test_the_selection_of_retried_runs_stays_inside_the_resolution() -> None:
    bias = vc.retry_selection(100_000, np.random.default_rng(2))
    assert 0 < bias < math.log1p(0.02)


@pytest.mark.parametrize(("method", "b_caps"), [
    (ROBUST, [115.0, 117.0, 116.0, 118.0]),  # the geometric-mean rule before issue 31
    (MEDIAN, [115.0, 117.0, 116.0, 104.0]),  # the median rule with one value for both ends
])
def test_a_stored_verdict_is_rechecked_by_the_rule_that_made_it(method: Method, b_caps: list[float]) -> None:
    """`--verify` re-judges a stored verdict by the rule its evidence names, not today's."""
    store = _Store(_caps([100.0] * 4, b_caps))
    plan = _plan(4)
    (old,) = judge_experiment(store, 1, plan, method)
    (new,) = judge_experiment(store, 1, plan)
    assert new.judgement.method == MEDIAN_SKEW
    assert (old.judgement.lower, old.judgement.upper) != (new.judgement.lower, new.judgement.upper)
    j = old.judgement
    store.verdicts = lambda eid: [SimpleNamespace(bar_id="b", verdict=j.verdict, estimate=j.estimate, lower=j.lower,
                                                  upper=j.upper, blocks=j.n, judged_at=None,
                                                  evidence={"method": method})]
    store.get_experiment = lambda eid: SimpleNamespace(status="done")
    for r in store._runs:
        r.finished_at = None
    (check,) = recheck_verdicts(store, 1, plan)
    assert not check.differs and check.judged.judgement.method == method


# --- the plan language of the rules -------------------------------------------------------------


@pytest.mark.parametrize(("design", "problem"), [
    ({"blocks": 1, "sequential": {"min_blocks": 2}}, "a sequential design looks at 2 or more blocks"),
    ({"blocks": 4, "sequential": {"min_blocks": 6}}, "the first look (6 blocks) comes after the last block (4)"),
    ({"blocks": 4, "sequential": {"spending": "fast"}}, "obrien_fleming"),
    ({"blocks": 4, "carryover": {"action": "drop"}}, "'void' or 'warn'"),
    ({"blocks": 4, "carryover": {"bound": -0.1}}, "greater than or equal to 0"),
])
def test_a_wrong_rule_is_refused_with_its_field_path(tmp_path, design: dict, problem: str) -> None:
    import subprocess
    import sys

    import yaml

    from tests.unit.test_plan_hashes import ROOT

    data = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    data["design"] = {**design, "order": "ABBA", "seed": 7}
    f = tmp_path / "plan.yaml"
    f.write_text(yaml.safe_dump(data))
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "plan", "validate", str(f)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "design." in r.stderr and problem in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_small_blocks_scan_calibrates_as_the_rule_does() -> None:
    """The scan behind README's "what limits it" uses MEDIAN's own calibration: its mean row's
    critical value is the rule's (to Monte Carlo error), and with it every near end covers at
    least 95% under each shape."""
    for blocks in (3, 4, 5):
        row = vc.small_blocks_scan(blocks, "mean", 1 << 16)
        assert row.critical == pytest.approx(critical_value(blocks, 0.95, MEDIAN), rel=0.03)
        assert min(min(ends) for ends in row.cover.values()) >= 0.945


def test_the_far_end_factor_is_the_scan_that_chose_it() -> None:
    """``FAR_END`` at 4 blocks: one symmetric value (factor 1) leaves an end above 97%, the
    registered factor keeps every end of every shape in 95-97% at no great cost in power."""
    plain, chosen = vc.far_end_scan(4, 1.0, 1 << 16), vc.far_end_scan(4, far_end(4), 1 << 16)
    assert plain.highest > 0.972 and chosen.lowest >= 0.947 and chosen.highest <= 0.970
    assert chosen.power >= 0.9 and chosen.critical == pytest.approx(critical_value(4, 0.95), rel=0.02)


def test_many_blocks_trim_wider_so_the_far_end_stays_under_97_percent() -> None:
    """From 60 blocks MEDIAN_SKEW trims 30% (MEDIAN 19%): at 100 blocks MEDIAN's far end under
    contaminated noise covers about 0.977, MEDIAN_SKEW's about 0.96."""
    assert (trim_count(59, MEDIAN_SKEW), trim_count(60, MEDIAN_SKEW), trim_count(60)) == (11, 18, 11)
    new = vc.coverage("contaminated", 100, 20_000, np.random.default_rng(100))
    old = vc.coverage("contaminated", 100, 20_000, np.random.default_rng(100), method=MEDIAN)
    assert max(old.lower, old.upper) > 0.972 and max(new.lower, new.upper) <= 0.968
    assert min(new.lower, new.upper) >= 0.945
