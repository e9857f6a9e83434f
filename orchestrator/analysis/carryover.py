"""Carry-over between the runs of a block, estimated from the design (issue 31). Pure.

Within a block the arms run back to back, so a run may carry what the run before it left (a
warm node, a filled cache, a hot GPU). ABBA balances a carry-over only when both arms leave the
same one: if the arm run right after B is 3% slower (and after A it is not), every block run
B-then-A reads ln(B/A) 3% high and every A-then-B block reads it true, so the mean is 1.5% high
whatever the number of blocks, and a bar at the truth is accepted more and more often as blocks
are added (0.29 at 16 blocks, sd 0.02, in the issue's Monte Carlo).

What the design can estimate is the **order effect**: the mean log ratio of the blocks where the
bar's numerator ran after its denominator minus that of the blocks where it ran before. It is
the sum of the two arms' carry-overs (plus twice a linear drift per run, which ABBA does cancel
from the estimate); the half-difference of the carry-overs, which biases the estimate, is not
estimable from two orders, but under any carry-over that only one arm leaves it is half the
order effect. So the rule tests the order effect: with a two-sided interval (each end a
one-sided bound at the bar's confidence) lying wholly outside +-``bound``, the plan's
registered action applies: ``void`` (the bar is INCONCLUSIVE: rerun with a settle period or a
cache reset between arms) or ``warn`` (the verdict stands with the estimate in its note).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

# A group's spread is never taken below this (ln units), as SD_FLOOR does for a bar.
SPREAD_FLOOR = 0.01


@dataclass(frozen=True, slots=True)
class OrderEffect:
    """Mean ln ratio (numerator after denominator) minus (numerator before), in ln units, with
    its two-sided interval at ``level`` (each end a one-sided ``confidence`` bound). ``estimable``
    is False when either order has fewer than 2 blocks (no interval)."""

    estimate: float
    lower: float
    upper: float
    after: int
    before: int
    confidence: float
    bound: float  # ln units
    numerator: str = "B"
    denominator: str = "A"

    @property
    def estimable(self) -> bool:
        return self.after >= 2 and self.before >= 2 and math.isfinite(self.lower)

    @property
    def exceeds(self) -> bool:
        """The interval lies wholly outside +-bound: evidence of an order effect beyond it."""
        return self.estimable and (self.lower > self.bound or self.upper < -self.bound)

    def describe(self) -> str:
        what = (f"order effect ({self.numerator} after {self.denominator} minus before; carry-over or "
                "within-block drift)")
        if not self.estimable:
            return (f"{what}: not estimable ({self.after} block(s) ran {self.numerator} after {self.denominator}, "
                    f"{self.before} before; 2 each way are needed)")
        pct = lambda x: f"{100 * math.expm1(x):+.2f}%"  # noqa: E731
        return (f"{what}: {pct(self.estimate)} ({pct(self.lower)}..{pct(self.upper)}, each end a one-sided "
                f"{100 * self.confidence:.4g}% bound; registered bound +-{100 * math.expm1(self.bound):.2g}%)")

    def to_dict(self) -> dict[str, object]:
        def f(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {"estimate": f(self.estimate), "lower": f(self.lower), "upper": f(self.upper), "after": self.after,
                "before": self.before, "confidence": self.confidence, "bound": self.bound,
                "exceeds": self.exceeds}


def welch_rows(x: np.ndarray, y: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows of two groups' ln ratios -> (mean difference, half-width of its one-sided
    ``confidence`` bound), Welch's, each group's sd floored (vectorised: the calibration's too)."""
    nx, ny = x.shape[1], y.shape[1]
    vx = np.maximum(x.var(axis=1, ddof=1), SPREAD_FLOOR**2) / nx
    vy = np.maximum(y.var(axis=1, ddof=1), SPREAD_FLOOR**2) / ny
    df = (vx + vy) ** 2 / (vx**2 / (nx - 1) + vy**2 / (ny - 1))
    return x.mean(axis=1) - y.mean(axis=1), sps.t.ppf(confidence, df) * np.sqrt(vx + vy)


def order_effect(log_ratios: Sequence[float], numerator_after: Sequence[bool], confidence: float,
                 bound: float = 0.0, names: tuple[str, str] = ("A", "B")) -> OrderEffect:
    """The order effect of one bar's blocks: ``log_ratios[i]`` is a block's ln(num/den) and
    ``numerator_after[i]`` whether the numerator ran after the denominator in it. Welch's
    interval (the two orders' spreads need not be equal), each group's sd floored."""
    if len(log_ratios) != len(numerator_after):
        raise ValueError("one order per block")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1) (got {confidence})")
    r = np.asarray(log_ratios, dtype=np.float64)
    after = np.asarray(numerator_after, dtype=bool)
    x, y = r[after], r[~after]
    den, num = names
    if x.size == 0 or y.size == 0:
        return OrderEffect(math.nan, -math.inf, math.inf, int(x.size), int(y.size), confidence, bound, num, den)
    est = float(x.mean() - y.mean())
    if x.size < 2 or y.size < 2:
        return OrderEffect(est, -math.inf, math.inf, int(x.size), int(y.size), confidence, bound, num, den)
    diff, halves = welch_rows(x[None, :], y[None, :], confidence)
    est, half = float(diff[0]), float(halves[0])
    return OrderEffect(est, est - half, est + half, int(x.size), int(y.size), confidence, bound, num, den)
