"""One block's inputs to a bar: each arm's capacity with what its search could establish
(``CapacityValue``), and the block's ratio as an interval of ln ratios (``BlockRatio``). Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from orchestrator.outcomes import CENSORING, Censoring


@dataclass(frozen=True, slots=True)
class CapacityValue:
    """One arm's capacity in one block, with what the search could and could not establish.

    ``value`` is the measured capacity (highest passing goodput; 0 if no rate passed);
    ``lower``/``upper`` bound the true capacity (``upper`` may be inf). ``censored`` is None or
    one of ``CENSORING``; ``converged`` is False when the search ran out of points before its
    bound closed. Only an uncensored, converged value is a point estimate."""

    value: float
    lower: float | None = None
    upper: float | None = None
    censored: Censoring | None = None
    converged: bool = True

    def __post_init__(self) -> None:
        if self.censored is not None and self.censored not in CENSORING:
            raise ValueError(f"censored must be None or one of {', '.join(CENSORING)} (got {self.censored!r})")
        if math.isnan(self.value) or self.value < 0:
            raise ValueError(f"a capacity must be a number >= 0 (got {self.value})")
        if self.censored is None and self.converged and self.value == 0.0:
            # Zero is only ever the search's "no rate passed": censored below its lowest rate.
            object.__setattr__(self, "censored", "below_min")
        lo, hi = self.bounds
        if not lo <= self.value <= hi:
            raise ValueError(f"capacity {self.value} lies outside its bounds [{lo}, {hi}]")

    @classmethod
    def exact(cls, value: float) -> CapacityValue:
        return cls(float(value))

    @property
    def is_point(self) -> bool:
        return self.censored is None and self.converged and self.value > 0

    @property
    def bounds(self) -> tuple[float, float]:
        """(lowest, highest) the true capacity can be."""
        if self.is_point:
            return self.value, self.value
        lo = self.lower if self.lower is not None else 0.0 if self.censored == "below_min" else self.value
        hi = self.upper if self.upper is not None else math.inf
        return lo, hi

    def describe(self) -> str:
        lo, hi = self.bounds
        why = {"below_min": "below the search's lowest rate", "above_max": "above the search's highest rate",
               "at_ceiling": "at the load generator's ceiling"}.get(self.censored or "", "")
        if not self.converged:
            why = f"{why}, unconverged" if why else "unconverged (ran out of points)"
        return f"{why}: in [{lo:.4g}, {hi:.4g}]"


@dataclass(frozen=True, slots=True)
class BlockRatio:
    """One block's B/A as an interval of ln ratios (a point when both capacities are).
    ``a`` is the denominator's value and ``b`` the numerator's; ``names`` names them (A and B,
    or the pair a bar compares: ("A", "C") for C/A)."""

    block: int
    a: CapacityValue
    b: CapacityValue
    names: tuple[str, str] = ("A", "B")

    @classmethod
    def of(cls, block: int, a: float | CapacityValue, b: float | CapacityValue,
           names: tuple[str, str] = ("A", "B")) -> BlockRatio:
        def cv(x: float | CapacityValue) -> CapacityValue:
            return x if isinstance(x, CapacityValue) else CapacityValue(float(x))

        return cls(block, cv(a), cv(b), names)

    @property
    def interval(self) -> tuple[float, float]:
        """(lowest, highest) ln(B/A) the capacities allow; (-inf, inf) for 0/0."""
        alo, ahi = self.a.bounds
        blo, bhi = self.b.bounds
        with np.errstate(divide="ignore", invalid="ignore"):
            lo = _safe_log_ratio(blo, ahi, low=True)
            hi = _safe_log_ratio(bhi, alo, low=False)
        return lo, hi

    @property
    def is_point(self) -> bool:
        return self.a.is_point and self.b.is_point

    def reason(self) -> str:
        """Why this block gives no point ratio ('' when it does)."""
        if self.is_point:
            return ""
        if self.a.value == 0.0 and self.b.value == 0.0:
            return f"block {self.block}: both arms at 0 (no passing rate): no ratio (0/0 is not 1)"
        den, num = self.names
        parts = [f"{arm} {v.describe()}" for arm, v in ((den, self.a), (num, self.b)) if not v.is_point]
        lo, hi = self.interval
        return (f"block {self.block}: " + "; ".join(parts)
                + f"; {num}/{den} in [{math.exp(lo):.4g}, {math.exp(hi):.4g}]")


def block_log_ratio(b: float, a: float, block: int = 0) -> float | BlockRatio:
    """ln(b/a) of one block; both at zero is no ratio at all (0/0 is not 1): a ``BlockRatio``
    unbounded both ways, which the verdict judges as INCONCLUSIVE and says why."""
    if a <= 0 and b <= 0:
        return BlockRatio.of(block, 0.0, 0.0)
    if a <= 0:
        return math.inf
    if b <= 0:
        return -math.inf
    return math.log(b / a)


def _safe_log_ratio(num: float, den: float, low: bool) -> float:
    if num == 0.0 and den == 0.0:
        return -math.inf if low else math.inf
    if den == math.inf and num == math.inf:
        return -math.inf if low else math.inf
    if num == 0.0 or den == math.inf:
        return -math.inf
    if den == 0.0 or num == math.inf:
        return math.inf
    return math.log(num / den)
