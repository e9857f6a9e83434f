"""Statistics of a bar: the verdict rule, censored blocks, Holm, labels, power, design balance.

The calibration over simulated experiments (false accepts under symmetric, heavy-tailed and
skewed block noise, Holm for ACCEPT and REJECT, the search in the loop) is in
``test_verdict_calibration.py``."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import stats as sps

from orchestrator.analysis.balance import abba_orders, order_balance
from orchestrator.analysis.blocks import BlockRatio, CapacityValue
from orchestrator.analysis.power import accept_probability, blocks_needed
from orchestrator.analysis.stats import (
    ROBUST,
    SD_FLOOR,
    STUDENT_T,
    BarEvidence,
    critical_value,
    judge,
    judge_bars,
    judge_many,
    log_ratios,
    tail_probability,
)

# --- the rule -------------------------------------------------------------------------------


def test_accepts_when_lower_bound_clears_threshold() -> None:
    j = judge([0.20, 0.25, 0.22, 0.24], threshold=1.15, confidence=0.95)
    assert j.verdict == "ACCEPT"
    assert j.n == 4
    assert j.lower > 1.15
    assert j.lower < j.estimate < j.upper
    assert j.estimate == pytest.approx(math.exp(np.mean([0.20, 0.25, 0.22, 0.24])))


@pytest.mark.parametrize("method", [ROBUST, STUDENT_T])
def test_bounds_are_one_sided_at_the_methods_critical_value(method: str) -> None:
    r = np.array([0.1, 0.3, 0.2, 0.15, 0.25])
    j = judge(r, threshold=1.0, confidence=0.9, method=method)  # type: ignore[arg-type]
    c = critical_value(5, 0.9, method)  # type: ignore[arg-type]
    half = c * r.std(ddof=1) / math.sqrt(5)
    assert math.log(j.lower) == pytest.approx(r.mean() - half)
    assert math.log(j.upper) == pytest.approx(r.mean() + half)
    if method == STUDENT_T:
        assert c == pytest.approx(sps.t.ppf(0.9, 4))
    else:  # wider than Student t: it also covers skewed block noise
        assert c > sps.t.ppf(0.9, 4)


def test_robust_critical_value_and_p_value_agree() -> None:
    for n in (2, 3, 5, 10, 40, 60):
        for conf in (0.9, 0.95, 0.975):
            c = critical_value(n, conf)
            assert tail_probability(c * 1.001 + 1e-9, n) <= 1 - conf + 1e-9
            assert tail_probability(c * 0.98, n) > 1 - conf
        assert critical_value(n, 0.95) < critical_value(n, 0.975)
    assert critical_value(41, 0.95) <= critical_value(40, 0.95) * 1.01  # smooth past the simulated range
    assert critical_value(3, 0.95) > critical_value(5, 0.95) > critical_value(10, 0.95)


def test_rejects_when_upper_bound_falls_short() -> None:
    j = judge([0.01, 0.03, 0.02, 0.00], threshold=1.15, confidence=0.95)
    assert j.verdict == "REJECT"
    assert j.upper < 1.15


def test_inconclusive_when_interval_straddles() -> None:
    j = judge([0.05, 0.30, 0.10, 0.25], threshold=1.15, confidence=0.95)
    assert j.verdict == "INCONCLUSIVE"
    assert j.lower < 1.15 < j.upper


@pytest.mark.parametrize("values", [[], [0.9]])
def test_fewer_than_two_blocks_is_never_accept(values: list[float]) -> None:
    j = judge(values, threshold=1.01, confidence=0.95)
    assert j.verdict == "INCONCLUSIVE"
    assert j.n == len(values)


def test_at_most_direction_gates_regressions() -> None:
    # Upgrade kept capacity (ratio ~1.0): "must not fall by more than 3%" is an at_least 0.97;
    # an at_most bar says "B must not exceed T" (e.g. latency or cost ratios).
    flat = [0.0, 0.01, -0.01, 0.005, 0.002, -0.004]
    assert judge(flat, 1.05, 0.95, "at_most").verdict == "ACCEPT"
    assert judge([0.2, 0.21, 0.19, 0.2], 1.05, 0.95, "at_most").verdict == "REJECT"
    assert judge(flat, 0.97, 0.95, "at_least").verdict == "ACCEPT"


def test_identical_blocks_are_not_certainty() -> None:
    # Issue 17: two (or four) identical ratios of 1.16 accepted a 1.15 bar with zero spread.
    assert judge([math.log(1.16)] * 2, 1.15, 0.95).verdict == "INCONCLUSIVE"
    j = judge([math.log(1.16)] * 4, 1.15, 0.95)
    assert j.verdict == "INCONCLUSIVE" and j.sd == 0.0 and j.sd_used == SD_FLOOR
    assert judge([math.log(1.16)] * 4, 1.15, 0.95, sd_floor=0.0).verdict == "ACCEPT"  # the floor did it
    # A clear margin still decides with identical blocks.
    assert judge([0.3, 0.3, 0.3], 1.15, 0.95).verdict == "ACCEPT"
    assert judge([0.0, 0.0, 0.0], 1.15, 0.95).verdict == "REJECT"
    with pytest.raises(ValueError, match="sd_floor"):
        judge([0.1, 0.2], 1.1, 0.95, sd_floor=-1.0)


def test_infinite_ratio_is_inconclusive_with_a_note() -> None:
    r = log_ratios([100.0, 0.0, 120.0], [90.0, 95.0, 100.0])
    j = judge(r, 1.1, 0.95)
    assert j.verdict == "INCONCLUSIVE"
    assert "zero capacity" in j.note


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="NaN"):
        judge([0.1, float("nan")], 1.1, 0.95)
    with pytest.raises(ValueError, match="confidence"):
        judge([0.1, 0.2], 1.1, 1.5)
    with pytest.raises(ValueError, match="direction"):
        judge([0.1, 0.2], 1.1, 0.95, "sideways")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pair up"):
        log_ratios([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="censored"):
        CapacityValue(10.0, censored="sideways")  # type: ignore[arg-type]


def test_judgement_to_dict_is_json_ready() -> None:
    d = judge([0.3], 1.1, 0.95).to_dict()
    assert d["verdict"] == "INCONCLUSIVE" and d["upper"] is None and d["n"] == 1
    assert isinstance(d["censored"], list) and isinstance(d["label"], str)


def test_judge_many_agrees_with_judge() -> None:
    rng = np.random.default_rng(1)
    for n in (2, 3, 5, 8):
        for direction in ("at_least", "at_most"):
            r = rng.normal(math.log(1.1), 0.06, size=(60, n))
            many = judge_many(r, 1.1, 0.95, direction)  # type: ignore[arg-type]
            one = [{"ACCEPT": 1, "REJECT": -1, "INCONCLUSIVE": 0}[judge(row, 1.1, 0.95, direction).verdict]  # type: ignore[arg-type]
                   for row in r]
            assert list(many) == one


# --- censored capacities ----------------------------------------------------------------------


def test_zero_over_zero_is_not_one() -> None:
    # Issue 17: both arms at 0 gave ln(0/0) = ln 1; four such blocks accepted with zero spread.
    blocks = [BlockRatio.of(b, 0.0, 0.0) for b in range(4)]
    assert all(not b.is_point and b.interval == (-math.inf, math.inf) for b in blocks)
    j = judge(blocks, 0.97, 0.95)
    assert j.verdict == "INCONCLUSIVE"
    assert "0/0 is not 1" in j.censored[0] and len(j.censored) == 4
    assert "unbounded" in j.note


def test_both_arms_above_the_range_is_no_point_estimate() -> None:
    # Issue 17: both arms above rate.max, B truly 10% worse, accepted a "no worse than 3%" bar.
    above = CapacityValue(1000.0, lower=1000.0, censored="above_max")
    blocks = [BlockRatio(b, above, above) for b in range(4)]
    j = judge(blocks, 0.97, 0.95)
    assert j.verdict == "INCONCLUSIVE" and len(j.censored) == 4
    assert "above the search's highest rate" in j.censored[0]


def test_a_censored_block_is_judged_as_an_interval() -> None:
    exact = [BlockRatio.of(b, 100.0, 100.0 * math.exp(x)) for b, x in enumerate([0.30, 0.32, 0.28, 0.31, 0.29])]
    # B stopped unconverged in block 5: its capacity lies in [125, 140] against A's 100.
    unconv = BlockRatio(5, CapacityValue(100.0), CapacityValue(125.0, lower=125.0, upper=140.0, converged=False))
    j = judge([*exact, unconv], 1.15, 0.95)
    assert j.verdict == "ACCEPT" and len(j.censored) == 1 and "unconverged" in j.censored[0]
    # The bound is the worst over the interval: at most what either end alone would give.
    lo_end = judge([*exact, BlockRatio.of(5, 100.0, 125.0)], 1.15, 0.95)
    hi_end = judge([*exact, BlockRatio.of(5, 100.0, 140.0)], 1.15, 0.95)
    assert j.lower <= min(lo_end.lower, hi_end.lower) + 1e-12
    assert j.upper >= max(lo_end.upper, hi_end.upper) - 1e-12
    # A wide interval that straddles makes it inconclusive, never a fake point.
    wide = BlockRatio(5, CapacityValue(100.0), CapacityValue(50.0, lower=50.0, upper=200.0, converged=False))
    assert judge([*exact, wide], 1.15, 0.95).verdict == "INCONCLUSIVE"


def test_one_censored_block_says_its_estimate_is_a_midpoint() -> None:
    unconv = BlockRatio(0, CapacityValue(100.0), CapacityValue(125.0, lower=125.0, upper=140.0, converged=False))
    j = judge([unconv], 1.05, 0.95)
    assert j.verdict == "INCONCLUSIVE" and j.n == 1
    assert "one block" in j.note and "censored or unconverged" in j.note
    assert j.estimate == pytest.approx(math.sqrt(1.25 * 1.40))
    assert "censored" not in judge([BlockRatio.of(0, 100.0, 125.0)], 1.05, 0.95).note


def test_a_bound_can_still_reject() -> None:
    # B below the search's lowest rate (at most 60) against A's 100: the ratio is <= 0.6.
    below = CapacityValue(0.0, lower=0.0, upper=60.0, censored="below_min")
    blocks = [BlockRatio.of(b, 100.0, 100.0 * math.exp(x)) for b, x in enumerate([-0.5, -0.55, -0.45, -0.52])]
    blk = BlockRatio(4, CapacityValue(100.0), below)
    assert blk.interval == (-math.inf, pytest.approx(math.log(0.6)))
    j = judge([*blocks, blk], 0.97, 0.95)
    assert j.verdict == "INCONCLUSIVE"  # an unbounded end leaves no bound on the mean ...
    assert "below the search's lowest rate" in j.censored[0]


def test_capacity_value_bounds() -> None:
    assert CapacityValue(120.0).is_point and CapacityValue(120.0).bounds == (120.0, 120.0)
    assert CapacityValue(0.0).censored == "below_min"  # zero is "no rate passed"
    assert CapacityValue(500.0, censored="at_ceiling").bounds == (500.0, math.inf)
    assert CapacityValue(500.0, upper=520.0, converged=False).bounds == (500.0, 520.0)
    with pytest.raises(ValueError, match="outside"):
        CapacityValue(500.0, upper=400.0, converged=False)


# --- Holm and labels --------------------------------------------------------------------------------


def test_judge_bars_applies_holm_to_accept() -> None:
    rng = np.random.default_rng(3)
    base = [0.18, 0.21, 0.16, 0.22]
    weak = list(0.0 + rng.normal(0, 0.05, 4))
    out = judge_bars([BarEvidence(base, 1.1, 0.95), BarEvidence(weak, 1.1, 0.95)], method=STUDENT_T)
    assert out[0].lower_level == pytest.approx(0.975)  # ranked first: alpha / 2
    assert "Holm" in out[0].note and "Holm-adjusted" in out[0].label
    # A bar whose plain p lies in (0.025, 0.05): ACCEPT alone, not once corrected for a second bar.
    borderline = [0.10, 0.05, 0.16, 0.13]
    plain = judge(borderline, 1.05, 0.95, method=STUDENT_T)
    assert 0.025 < plain.p_value < 0.05 and plain.verdict == "ACCEPT"
    corrected = judge_bars([BarEvidence(borderline, 1.05, 0.95), BarEvidence(weak, 1.1, 0.95)], method=STUDENT_T)
    assert corrected[0].verdict == "INCONCLUSIVE"
    assert judge_bars([BarEvidence(borderline, 1.05, 0.95)], method=STUDENT_T)[0].verdict == "ACCEPT"


def test_judge_bars_applies_holm_to_reject() -> None:
    # Issue 17: REJECT kept each bar's own level, so three bars at the boundary rejected ~3x as
    # often as stated. The same borderline evidence, mirrored, now needs Holm's level too.
    borderline = [-0.10, -0.05, -0.16, -0.13]
    plain = judge(borderline, 1 / 1.05, 0.95, method=STUDENT_T)
    assert plain.verdict == "REJECT" and 0.025 < plain.p_reject < 0.05
    other = [0.3, 0.31, 0.29, 0.3]  # clearly meets its bar: never rejected
    out = judge_bars([BarEvidence(borderline, 1 / 1.05, 0.95), BarEvidence(other, 1.1, 0.95)], method=STUDENT_T)
    assert out[0].verdict == "INCONCLUSIVE" and out[0].upper_level == pytest.approx(0.975)
    assert out[1].verdict == "ACCEPT"


def test_labels_say_what_the_interval_is() -> None:
    j = judge([0.2, 0.25, 0.22, 0.24], 1.15, 0.95)
    assert "one-sided 95% bound" in j.label and "90% two-sided interval" in j.label
    j2 = judge_bars([BarEvidence([0.2, 0.25, 0.22, 0.24], 1.15, 0.95), BarEvidence([0.0, 0.1, 0.05, 0.02], 1.5, 0.95)])
    assert "lower end a one-sided 97.5% bound" in j2[0].label
    assert "Holm-adjusted over 2 bars at family level 95%" in j2[0].label


def test_bars_of_different_confidences_state_one_family_level() -> None:
    """Issue 31: a family's promise is its weakest bar's (a true-null bar of rank k is tested at
    alpha_i / (m - k) <= alpha_i / m0, so any false ACCEPT is at most the largest alpha likely):
    every label says that one level, not each bar its own."""
    out = judge_bars([BarEvidence([0.2, 0.25, 0.22, 0.24], 1.15, 0.95),
                      BarEvidence([0.0, 0.1, 0.05, 0.02], 1.5, 0.9),
                      BarEvidence([0.1, 0.12, 0.08, 0.11], 1.05, 0.99)])
    found = [re.search(r"at family level (\d+)%", j.label) for j in out]
    assert all(found), [j.label for j in out]
    levels = {m.group(1) for m in found if m}
    assert levels == {"90"}, [j.label for j in out]
    # ... and each bar is still tested at its own alpha over its rank (0.99's bar stricter)
    assert "family level 90%" in out[2].note and out[2].lower_level > out[1].lower_level


# --- power ----------------------------------------------------------------------------------


def test_blocks_needed_matches_simulation() -> None:
    n = blocks_needed(sigma=0.1, true_ratio=1.25, threshold=1.15, confidence=0.95, power=0.8)
    assert accept_probability(n, 0.1, 1.25, 1.15, 0.95) >= 0.8
    assert accept_probability(n - 1, 0.1, 1.25, 1.15, 0.95) < 0.8
    rng = np.random.default_rng(11)
    r = math.log(1.25) + rng.normal(0.0, 0.1, size=(4000, n))
    simulated = float((judge_many(r, 1.15, 0.95) == 1).mean())
    print(f"\n[power] blocks_needed={n}: simulated ACCEPT rate {simulated:.3f} (target >= 0.80)")
    assert simulated >= 0.8 - 0.02
    assert blocks_needed(0.05, 1.25, 1.15, 0.95, 0.8) < n  # less noise, fewer blocks
    # The robust bound costs blocks against Student t's, never fewer.
    assert n >= blocks_needed(0.1, 1.25, 1.15, 0.95, 0.8, method=STUDENT_T)


def test_blocks_needed_refuses_hopeless_bars() -> None:
    with pytest.raises(ValueError, match="does not clear"):
        blocks_needed(0.1, 1.10, 1.15, 0.95, 0.8)
    with pytest.raises(ValueError, match="blocks needed"):
        blocks_needed(5.0, 1.0001, 1.0, 0.95, 0.8)
    assert blocks_needed(0.05, 0.90, 0.97, 0.95, 0.8, direction="at_most") >= 2


# --- the design ------------------------------------------------------------------------------


def test_abba_with_an_odd_number_of_blocks_is_unbalanced() -> None:
    assert order_balance(abba_orders(4)).balanced
    odd = order_balance(abba_orders(3))
    assert not odd.balanced and odd.a_first == 2 and odd.b_first == 1
    assert odd.drift_weight == pytest.approx(1 / 3)
    assert "even number of blocks" in odd.warning


def test_a_dropped_block_unbalances_abba() -> None:
    dropped = order_balance(abba_orders(4), dropped=[1])
    assert not dropped.balanced and "blocks [1] dropped" in dropped.warning
    assert order_balance(abba_orders(4), dropped=[0, 1]).balanced  # a whole AB/BA pair


def test_drift_weight_is_the_bias_a_linear_drift_leaves() -> None:
    # Simulate: true ln ratio 0, drift d per run; the arm that runs second gains d.
    d = 0.02
    for blocks, dropped in ((3, ()), (4, ()), (4, (2,)), (6, (1,))):
        orders = abba_orders(blocks)
        r = [d if o[0] == "A" else -d for b, o in enumerate(orders) if b not in dropped]
        bal = order_balance(orders, dropped)
        assert np.mean(r) == pytest.approx(bal.drift_weight * d)
