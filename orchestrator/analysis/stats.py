"""The statistics of a bar (DESIGN section 10). Pure: numpy and scipy only.

Unit = one block (one run of each arm, back to back). Per block r_b = ln(C_B / C_A). A bar is
judged with a one-sided Student t bound on the mean of r_b at the bar's confidence:

- ``at_least`` T: ACCEPT if exp(lower bound) > T; REJECT if exp(upper bound) < T.
- ``at_most`` T (regression gate): ACCEPT if exp(upper bound) < T; REJECT if exp(lower) > T.
- otherwise INCONCLUSIVE. Fewer than 2 blocks is INCONCLUSIVE, never ACCEPT: one pair of runs
  carries no estimate of its own spread (DESIGN section 9, guard 10).

Both bounds are one-sided at the same confidence, so ACCEPT and REJECT are each tests at level
1 - confidence and can never both hold. Several bars of one plan are corrected with Holm's
step-down procedure (``judge_bars``). ``blocks_needed`` is the power analysis: the smallest
number of blocks whose ACCEPT probability reaches the asked power, from the noncentral t.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
from scipy import stats as sps

Verdict = Literal["ACCEPT", "REJECT", "INCONCLUSIVE"]
Direction = Literal["at_least", "at_most"]
DIRECTIONS: tuple[str, ...] = ("at_least", "at_most")

# A power analysis that needs more blocks than this is reported as infeasible.
MAX_BLOCKS = 10_000


@dataclass(frozen=True, slots=True)
class Judgement:
    """A bar's verdict with the evidence behind it.

    ``estimate`` is the geometric-mean ratio exp(mean r_b); ``lower`` and ``upper`` are the
    one-sided bounds on the ratio at ``confidence`` (each alone holds with that confidence).
    ``p_value`` is the one-sided p-value of the ACCEPT test (H0: the bar is not met)."""

    verdict: Verdict
    estimate: float
    lower: float
    upper: float
    n: int
    threshold: float
    confidence: float
    direction: Direction
    p_value: float
    sd: float  # sample standard deviation of the per-block log ratios (nan with n < 2)
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        """Plain dict (JSON-ready: inf and nan become None)."""
        out: dict[str, object] = {}
        for k in self.__slots__:  # type: ignore[attr-defined]
            v = getattr(self, k)
            out[k] = None if isinstance(v, float) and not math.isfinite(v) else v
        return out


@lru_cache(maxsize=4096)
def t_quantile(confidence: float, df: int) -> float:
    """One-sided Student t quantile (cached: calibration runs call it thousands of times)."""
    return float(sps.t.ppf(confidence, df))


def _check(threshold: float, confidence: float, direction: str) -> None:
    if not (threshold > 0 and math.isfinite(threshold)):
        raise ValueError(f"threshold must be a finite ratio > 0 (got {threshold})")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1) (got {confidence})")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)} (got {direction!r})")


def _p_accept(mean: float, sd: float, n: int, log_t: float, direction: str) -> float:
    """One-sided p-value of H0 'the bar is not met' given the block log ratios' summary."""
    if n < 2:
        return 1.0
    diff = (mean - log_t) if direction == "at_least" else (log_t - mean)
    if sd == 0.0:
        return 0.0 if diff > 0 else 1.0
    return float(sps.t.sf(diff / (sd / math.sqrt(n)), n - 1))


def judge(
    log_ratios: Sequence[float] | np.ndarray,
    threshold: float,
    confidence: float,
    direction: Direction = "at_least",
) -> Judgement:
    """Judge a bar from per-block log ratios ln(C_B / C_A) (see module doc for the rule).

    An infinite log ratio (an arm with zero capacity in a block) makes the t bound meaningless:
    the verdict is then INCONCLUSIVE with a note, and the caller should look at that block.
    NaN is a bug upstream and raises ``ValueError``."""
    _check(threshold, confidence, direction)
    r = np.asarray(log_ratios, dtype=np.float64).ravel()
    n = int(r.size)
    log_t = math.log(threshold)
    if np.isnan(r).any():
        raise ValueError("log ratios contain NaN")
    if n == 0:
        return Judgement("INCONCLUSIVE", math.nan, 0.0, math.inf, 0, threshold, confidence,
                         direction, 1.0, math.nan, "no blocks")
    if not np.isfinite(r).all():
        est = float(np.exp(np.mean(r))) if not (np.isposinf(r).any() and np.isneginf(r).any()) else math.nan
        return Judgement("INCONCLUSIVE", est, 0.0, math.inf, n, threshold, confidence, direction,
                         1.0, math.nan, "a block has zero capacity in one arm; its ratio is infinite")
    mean = float(r.mean())
    if n < 2:
        return Judgement("INCONCLUSIVE", math.exp(mean), 0.0, math.inf, n, threshold, confidence,
                         direction, 1.0, math.nan, "one block: no decision from a single pair of runs")
    sd = float(r.std(ddof=1))
    half = t_quantile(confidence, n - 1) * sd / math.sqrt(n)
    lo, hi = mean - half, mean + half
    if direction == "at_least":
        accept, reject = lo > log_t, hi < log_t
    else:
        accept, reject = hi < log_t, lo > log_t
    verdict: Verdict = "ACCEPT" if accept else "REJECT" if reject else "INCONCLUSIVE"
    return Judgement(verdict, math.exp(mean), math.exp(lo), math.exp(hi), n, threshold, confidence,
                     direction, _p_accept(mean, sd, n, log_t, direction), sd)


def log_ratios(b_values: Sequence[float], a_values: Sequence[float]) -> np.ndarray:
    """Per-block ln(B / A) from paired per-block values (capacities, goodputs)."""
    b = np.asarray(b_values, dtype=np.float64)
    a = np.asarray(a_values, dtype=np.float64)
    if b.shape != a.shape:
        raise ValueError(f"B has {b.size} blocks and A has {a.size}; they must pair up")
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(b) - np.log(a)


def holm(p_values: Sequence[float], alpha: float | Sequence[float] = 0.05) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected, in the input order.

    Sort p ascending; reject H_(k) while p_(k) <= alpha_(k) / (m - k) (k from 0) and stop at the
    first that is not. ``alpha`` may be one level or one per hypothesis (then each is held to
    its own level; the family-wise error stays at most the largest alpha)."""
    p = np.asarray(p_values, dtype=np.float64)
    m = p.size
    alphas = np.broadcast_to(np.asarray(alpha, dtype=np.float64), (m,))
    rejected = [False] * m
    for k, i in enumerate(np.argsort(p, kind="stable")):
        if p[i] <= alphas[i] / (m - k):
            rejected[int(i)] = True
        else:
            break
    return rejected


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (reject H_i at level alpha iff adjusted_i <= alpha)."""
    p = np.asarray(p_values, dtype=np.float64)
    m = p.size
    order = np.argsort(p, kind="stable")
    adj = np.empty(m)
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * p[i]))
        adj[i] = running
    return [float(x) for x in adj]


@dataclass(frozen=True, slots=True)
class BarEvidence:
    """One bar's input to ``judge_bars``: its per-block log ratios and registered terms."""

    log_ratios: Sequence[float]
    threshold: float
    confidence: float
    direction: Direction = "at_least"


def judge_bars(bars: Sequence[BarEvidence]) -> list[Judgement]:
    """Judge every bar of a plan with Holm's correction of the ACCEPT tests.

    Bars are ranked by their ACCEPT p-value; the k-th (from 0) of m is judged at confidence
    1 - (1 - c) / (m - k), and only if every bar ranked before it was accepted (step-down).
    The returned bounds are at the level each bar was actually judged at, so a verdict and its
    interval always agree. REJECT is a test of the opposite claim and keeps the bar's own level
    (a false REJECT cannot make a change ship)."""
    plain = [judge(b.log_ratios, b.threshold, b.confidence, b.direction) for b in bars]
    m = len(bars)
    if m <= 1:
        return plain
    out: list[Judgement | None] = [None] * m
    still_stepping = True
    for k, i in enumerate(np.argsort([j.p_value for j in plain], kind="stable")):
        b = bars[int(i)]
        level = 1.0 - (1.0 - b.confidence) / (m - k)
        j = judge(b.log_ratios, b.threshold, level, b.direction)
        if j.verdict == "ACCEPT" and not still_stepping:
            j = _replace_verdict(j, "INCONCLUSIVE", "Holm: a bar ranked before it was not accepted")
        elif j.verdict != "ACCEPT":
            still_stepping = False
            if plain[int(i)].verdict == "REJECT":
                out[int(i)] = _with_note(plain[int(i)], f"Holm rank {k + 1} of {m}; REJECT at its own confidence")
                continue
        out[int(i)] = _with_note(j, f"Holm rank {k + 1} of {m}, judged at confidence {level:.4g}")
    return [j for j in out if j is not None]


def _replace_verdict(j: Judgement, verdict: Verdict, note: str) -> Judgement:
    return Judgement(verdict, j.estimate, j.lower, j.upper, j.n, j.threshold, j.confidence,
                     j.direction, j.p_value, j.sd, note)


def _with_note(j: Judgement, note: str) -> Judgement:
    text = f"{j.note}; {note}" if j.note else note
    return Judgement(j.verdict, j.estimate, j.lower, j.upper, j.n, j.threshold, j.confidence,
                     j.direction, j.p_value, j.sd, text)


def accept_probability(
    n: int,
    sigma: float,
    true_ratio: float,
    threshold: float,
    confidence: float,
    direction: Direction = "at_least",
) -> float:
    """P(ACCEPT) with ``n`` blocks of normal log-ratio noise ``sigma`` (noncentral t)."""
    _check(threshold, confidence, direction)
    if n < 2:
        return 0.0
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0 (got {sigma})")
    delta = math.log(true_ratio) - math.log(threshold)
    if direction == "at_most":
        delta = -delta
    ncp = delta / (sigma / math.sqrt(n))
    return float(sps.nct.sf(t_quantile(confidence, n - 1), n - 1, ncp))


def blocks_needed(
    sigma: float,
    true_ratio: float,
    threshold: float,
    confidence: float,
    power: float = 0.8,
    direction: Direction = "at_least",
) -> int:
    """Smallest number of blocks (>= 2) whose ACCEPT probability is at least ``power``.

    ``sigma`` is the spread of the per-block log ratio (from a pilot or the simulator). Raises
    ``ValueError`` when the true ratio does not clear the bar (no number of blocks helps) or
    when more than ``MAX_BLOCKS`` would be needed."""
    _check(threshold, confidence, direction)
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1) (got {power})")
    clears = true_ratio > threshold if direction == "at_least" else true_ratio < threshold
    if not clears:
        raise ValueError(
            f"a true ratio of {true_ratio:g} does not clear the bar ({direction} {threshold:g}); "
            "no number of blocks gives power above 1 - confidence"
        )

    def ok(n: int) -> bool:
        return accept_probability(n, sigma, true_ratio, threshold, confidence, direction) >= power

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
