"""Statistics of a bar: the verdict rule, Holm, power, and calibration over simulated experiments.

The calibration tests are the proof the method is honest: they print the observed rates
(visible with ``pytest -s``) and assert them against the bounds of issue #6."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.analysis.stats import (
    BarEvidence,
    accept_probability,
    blocks_needed,
    holm,
    holm_adjusted,
    judge,
    judge_bars,
    log_ratios,
)

N_EXPERIMENTS = 4000  # >= 2,000 per scenario, as the issue asks


def _noise(rng: np.random.Generator, kind: str, size: int, sigma: float) -> np.ndarray:
    """Block noise of standard deviation ``sigma``: normal or heavy-tailed."""
    if kind == "normal":
        return rng.normal(0.0, sigma, size)
    if kind == "student_t3":  # heavy tails; t(3) has variance 3
        return rng.standard_t(3, size) * sigma / math.sqrt(3.0)
    if kind == "laplace":
        return rng.laplace(0.0, sigma / math.sqrt(2.0), size)
    raise AssertionError(kind)


def _accept_rate(
    rng: np.random.Generator,
    kind: str,
    true_ratio: float,
    threshold: float,
    confidence: float,
    sigma: float,
    blocks: tuple[int, int] | int,
    direction: str = "at_least",
) -> float:
    accepts = 0
    for _ in range(N_EXPERIMENTS):
        n = blocks if isinstance(blocks, int) else int(rng.integers(blocks[0], blocks[1] + 1))
        r = math.log(true_ratio) + _noise(rng, kind, n, sigma)
        accepts += judge(r, threshold, confidence, direction).verdict == "ACCEPT"  # type: ignore[arg-type]
    return accepts / N_EXPERIMENTS


# --- the rule -------------------------------------------------------------------------------


def test_accepts_when_lower_bound_clears_threshold() -> None:
    j = judge([0.20, 0.25, 0.22, 0.24], threshold=1.15, confidence=0.95)
    assert j.verdict == "ACCEPT"
    assert j.n == 4
    assert j.lower > 1.15
    assert j.lower < j.estimate < j.upper
    assert j.estimate == pytest.approx(math.exp(np.mean([0.20, 0.25, 0.22, 0.24])))


def test_bounds_are_one_sided_student_t() -> None:
    r = np.array([0.1, 0.3, 0.2, 0.15, 0.25])
    j = judge(r, threshold=1.0, confidence=0.9)
    from scipy import stats as sps

    half = sps.t.ppf(0.9, 4) * r.std(ddof=1) / math.sqrt(5)
    assert math.log(j.lower) == pytest.approx(r.mean() - half)
    assert math.log(j.upper) == pytest.approx(r.mean() + half)


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
    assert judge([0.0, 0.01, -0.01, 0.005], 1.05, 0.95, "at_most").verdict == "ACCEPT"
    assert judge([0.2, 0.21, 0.19, 0.2], 1.05, 0.95, "at_most").verdict == "REJECT"
    assert judge([0.0, 0.01, -0.01, 0.005], 0.97, 0.95, "at_least").verdict == "ACCEPT"


def test_identical_blocks_have_zero_spread() -> None:
    assert judge([0.2, 0.2, 0.2], 1.15, 0.95).verdict == "ACCEPT"
    assert judge([0.1, 0.1, 0.1], 1.15, 0.95).verdict == "REJECT"


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


def test_judgement_to_dict_is_json_ready() -> None:
    d = judge([0.3], 1.1, 0.95).to_dict()
    assert d["verdict"] == "INCONCLUSIVE" and d["upper"] is None and d["n"] == 1


# --- Holm -----------------------------------------------------------------------------------


def test_holm_step_down() -> None:
    # m = 3: thresholds 0.05/3, 0.05/2, 0.05/1 in p order.
    assert holm([0.01, 0.04, 0.03], 0.05) == [True, False, False]
    assert holm([0.01, 0.02, 0.04], 0.05) == [True, True, True]
    assert holm([0.03, 0.001, 0.5], 0.05) == [False, True, False]
    assert holm_adjusted([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_judge_bars_applies_holm() -> None:
    rng = np.random.default_rng(3)
    base = [0.18, 0.21, 0.16, 0.22]
    weak = list(0.0 + rng.normal(0, 0.05, 4))
    out = judge_bars([BarEvidence(base, 1.1, 0.95), BarEvidence(weak, 1.1, 0.95)])
    assert out[0].confidence == pytest.approx(0.975)  # ranked first: alpha / 2
    assert "Holm" in out[0].note
    # A bar whose plain p lies in (0.025, 0.05): ACCEPT alone, not once corrected for a second bar.
    borderline = [0.10, 0.05, 0.16, 0.13]
    plain = judge(borderline, 1.05, 0.95)
    assert 0.025 < plain.p_value < 0.05 and plain.verdict == "ACCEPT"
    corrected = judge_bars([BarEvidence(borderline, 1.05, 0.95), BarEvidence(weak, 1.1, 0.95)])
    assert corrected[0].verdict == "INCONCLUSIVE"
    assert judge_bars([BarEvidence(borderline, 1.05, 0.95)])[0].verdict == "ACCEPT"


# --- power ----------------------------------------------------------------------------------


def test_blocks_needed_matches_simulation() -> None:
    n = blocks_needed(sigma=0.1, true_ratio=1.25, threshold=1.15, confidence=0.95, power=0.8)
    assert accept_probability(n, 0.1, 1.25, 1.15, 0.95) >= 0.8
    assert accept_probability(n - 1, 0.1, 1.25, 1.15, 0.95) < 0.8
    rng = np.random.default_rng(11)
    simulated = _accept_rate(rng, "normal", 1.25, 1.15, 0.95, 0.1, n)
    print(f"\n[power] blocks_needed={n}: simulated ACCEPT rate {simulated:.3f} (target >= 0.80)")
    assert simulated >= 0.8 - 0.02
    assert blocks_needed(0.05, 1.25, 1.15, 0.95, 0.8) < n  # less noise, fewer blocks


def test_blocks_needed_refuses_hopeless_bars() -> None:
    with pytest.raises(ValueError, match="does not clear"):
        blocks_needed(0.1, 1.10, 1.15, 0.95, 0.8)
    with pytest.raises(ValueError, match="blocks needed"):
        blocks_needed(5.0, 1.0001, 1.0, 0.95, 0.8)
    assert blocks_needed(0.05, 0.90, 0.97, 0.95, 0.8, direction="at_most") >= 2


# --- calibration: false accepts stay at or under 1 - confidence -------------------------------


@pytest.mark.parametrize("kind", ["normal", "student_t3", "laplace"])
@pytest.mark.parametrize("confidence", [0.95, 0.90])
def test_calibration_at_the_bar(kind: str, confidence: float) -> None:
    """True ratio == threshold, 3 to 10 blocks: ACCEPT <= 1 - confidence + 0.01."""
    rng = np.random.default_rng(20240 + int(confidence * 100) + len(kind))
    rate = _accept_rate(rng, kind, 1.15, 1.15, confidence, sigma=0.08, blocks=(3, 10))
    bound = 1 - confidence + 0.01
    print(f"\n[calibration] at the bar, {kind}, confidence {confidence}: ACCEPT rate {rate:.4f} (bound {bound:.2f})")
    assert rate <= bound


@pytest.mark.parametrize("kind", ["normal", "student_t3"])
def test_calibration_at_the_bar_at_most(kind: str) -> None:
    rng = np.random.default_rng(77 + len(kind))
    rate = _accept_rate(rng, kind, 0.97, 0.97, 0.95, sigma=0.05, blocks=(3, 10), direction="at_most")
    print(f"\n[calibration] at the bar (at_most), {kind}: ACCEPT rate {rate:.4f} (bound 0.06)")
    assert rate <= 0.06


@pytest.mark.parametrize("kind", ["normal", "student_t3"])
def test_calibration_a_a(kind: str) -> None:
    """A/A (true ratio 1), bar at_least 1.05: ACCEPT <= 1 - confidence."""
    rng = np.random.default_rng(5 + len(kind))
    rate = _accept_rate(rng, kind, 1.0, 1.05, 0.95, sigma=0.08, blocks=(3, 10))
    print(f"\n[calibration] A/A vs at_least 1.05, {kind}: ACCEPT rate {rate:.4f} (bound 0.05)")
    assert rate <= 0.05


def test_power_at_true_ratio_1_25() -> None:
    """True ratio 1.25, block sigma 0.05, 5 blocks, bar at_least 1.15: ACCEPT >= 0.8."""
    rng = np.random.default_rng(125)
    rate = _accept_rate(rng, "normal", 1.25, 1.15, 0.95, sigma=0.05, blocks=5)
    print(f"\n[calibration] power at 1.25 (sigma 0.05, 5 blocks, bar 1.15): ACCEPT rate {rate:.4f} (need >= 0.80)")
    assert rate >= 0.8
