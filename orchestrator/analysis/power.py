"""Power analysis of a bar (DESIGN section 10). Pure: scipy only.

``blocks_needed`` is the smallest number of blocks whose ACCEPT probability (normal block noise,
the method's critical value from ``analysis.stats``) reaches the asked power.
"""

from __future__ import annotations

import math

from scipy import stats as sps

from orchestrator.analysis.critical import far_end
from orchestrator.analysis.stats import (
    DEFAULT_METHOD,
    MEDIAN_SKEW,
    Direction,
    Method,
    check_bar,
    critical_value,
)

# A power analysis that needs more blocks than this is reported as infeasible.
MAX_BLOCKS = 10_000


def accept_probability(
    n: int,
    sigma: float,
    true_ratio: float,
    threshold: float,
    confidence: float,
    direction: Direction = "at_least",
    method: Method = DEFAULT_METHOD,
    resolution: float = 0.0,
) -> float:
    """P(ACCEPT) with ``n`` blocks of normal log-ratio noise ``sigma`` (noncentral t at the
    method's critical value; the spread floor is ignored, which is exact for sigma >> floor).
    MEDIAN_SKEW's far end: under normal noise the sample's skew is independent of its mean and
    sd (Basu), so half the experiments face the near end's critical value and half the far's."""
    check_bar(threshold, confidence, direction)
    if n < 2:
        return 0.0
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0 (got {sigma})")
    delta = math.log(true_ratio) - math.log(threshold)
    if direction == "at_most":
        delta = -delta
    delta -= resolution  # the resolution widens the end the test needs
    ncp = delta / (sigma / math.sqrt(n))
    c = critical_value(n, confidence, method)
    far = far_end(n) if method == MEDIAN_SKEW else 1.0
    return float((sps.nct.sf(c, n - 1, ncp) + sps.nct.sf(c * far, n - 1, ncp)) / 2)


def blocks_needed(
    sigma: float,
    true_ratio: float,
    threshold: float,
    confidence: float,
    power: float = 0.8,
    direction: Direction = "at_least",
    method: Method = DEFAULT_METHOD,
    resolution: float = 0.0,
) -> int:
    """Smallest number of blocks (>= 2) whose ACCEPT probability is at least ``power``.

    ``sigma`` is the spread of the per-block log ratio (from a pilot or the simulator). Raises
    ``ValueError`` when the true ratio does not clear the bar (no number of blocks helps) or
    when more than ``MAX_BLOCKS`` would be needed."""
    check_bar(threshold, confidence, direction)
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1) (got {power})")
    margin = math.log(true_ratio / threshold) * (1 if direction == "at_least" else -1)
    clears = margin > resolution
    if not clears:
        raise ValueError(
            f"a true ratio of {true_ratio:g} does not clear the bar ({direction} {threshold:g}) by more than the "
            f"search's resolution ({100 * math.expm1(resolution):.2g}%); no number of blocks gives power above "
            "1 - confidence"
        )

    def ok(n: int) -> bool:
        return accept_probability(n, sigma, true_ratio, threshold, confidence, direction, method, resolution) >= power

    hi = 2
    while not ok(hi):
        if hi >= MAX_BLOCKS:
            raise ValueError(f"more than {MAX_BLOCKS} blocks needed; the effect is too small for the noise")
        hi = min(hi * 2, MAX_BLOCKS)
    lo = max(2, hi // 2)
    if ok(lo):
        return lo
    while hi - lo > 1:  # ok(hi) and not ok(lo); power rises with n
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi
