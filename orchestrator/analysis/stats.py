"""The statistics of a bar (DESIGN section 10). Pure: numpy and scipy only.

Unit = one block (one run of each arm, back to back). Per block r_b = ln(C_B / C_A). **The
estimand** (issue 31) is the median block ratio: the ratio a typical block shows, half the blocks
above it and half below; under symmetric block noise it is the geometric mean. A bar is judged
with one-sided bounds on it:

- ``at_least`` T: ACCEPT if exp(lower bound) > T; REJECT if exp(upper bound) < T.
- ``at_most`` T (regression gate): ACCEPT if exp(upper bound) < T; REJECT if exp(lower) > T.
- otherwise INCONCLUSIVE. Fewer than 2 blocks is INCONCLUSIVE, never ACCEPT: one pair of runs
  carries no estimate of its own spread (DESIGN section 9, guard 10).

**The bound** is location -/+ (c * scale + resolution) (``analysis.critical`` owns the
statistic and c): the mean of the r_b up to 9 blocks, a trimmed mean beyond, with c the worst
case over normal, t(3) and 15%-contaminated block noise each centred at its median. Centred where
the estimand is, a skewed shape no longer forces a wide bound: each end covers 95-97.5% at a 95%
promise (the geometric-mean rule, ``ROBUST``, covered 99.2-99.8% under normal noise and needed
twice the blocks for the same power). Two floors:

- *Zero spread.* The per-block spread is floored at ``SD_FLOOR`` (0.01 in ln units): identical
  block ratios are not certainty. (At 2 blocks a floored spread takes half the critical value:
  ``critical.FLOORED_SHARE``.)
- *Resolution.* An error every block may share (a capacity search's precision: its bracket is
  2% wide, and the same curve bends the same way in every block) does not average away: it
  widens each end by itself whatever the number of blocks (``resolution``; the verdict passes
  ln(1 + search.precision) for a capacity bar). No number of blocks decides a bar closer than
  the search can resolve.

``benchmarks/verdict_calibration.py`` prints the coverage, false accepts, power, carry-over,
skewed-block, retry and sequential figures (part 0); ``ROBUST`` and ``STUDENT_T`` stay for
verdicts stored before and for comparison.

**Censored capacities.** A block whose capacity is censored (below the search's lowest rate,
above its highest, at the load generator's ceiling) or unconverged gives no point ratio, only
an interval (``CapacityValue``, ``BlockRatio``). Such blocks are judged as intervals: the lower
bound is the least it can be over every ratio the intervals allow (a concave function of the
block values, so its minimum lies at a corner of the box), the upper bound the most. An interval
open on the side a test needs (a ratio unbounded below for ACCEPT of ``at_least``) makes that
test impossible; 0/0 (both arms without a passing rate) is unbounded both ways, never 1.

Several bars of one plan are corrected with Holm's step-down procedure, for ACCEPT and for
REJECT alike (``judge_bars``). Every judgement carries ``label``: what exactly its interval is.
The power analysis (``analysis.power``) and the balance of a design against drift
(``analysis.balance``) live beside this module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from itertools import product
from typing import Any

import numpy as np

from orchestrator.analysis.blocks import BlockRatio
from orchestrator.analysis.critical import (
    DEFAULT_METHOD,
    MEDIAN,
    MEDIAN_RULES,
    MEDIAN_SKEW,
    NOISE_FAMILY,
    ROBUST,
    STUDENT_T,
    Method,
    critical_value,
    describe,
    end_factors,
    far_end,
    location_scale,
    t_quantile,
    tail_probability,
)
from orchestrator.outcomes import Verdict
from orchestrator.plan.experiment import DIRECTIONS, Direction

__all__ = [
    "DEFAULT_METHOD", "MEDIAN", "MEDIAN_RULES", "MEDIAN_SKEW", "NOISE_FAMILY", "ROBUST", "SD_FLOOR", "STUDENT_T", "BarEvidence", "Judgement", "Method", "check_bar",
    "critical_value", "judge", "judge_bars", "judge_many", "log_ratios", "t_quantile", "tail_probability",
]

# Measurement resolution: the per-block sd of ln(B/A) is never taken below this (ln units).
SD_FLOOR = 0.01
# Interval-valued blocks are judged at every corner of their box; beyond this many, the bar is
# INCONCLUSIVE (2^k corners).
MAX_INTERVAL_BLOCKS = 12


# --- the judgement ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Judgement:
    """A bar's verdict with the evidence behind it.

    ``estimate`` is the geometric-mean ratio exp(mean r_b); ``lower`` and ``upper`` are
    one-sided bounds on the ratio, at ``lower_level`` and ``upper_level`` (equal to
    ``confidence`` unless Holm moved them); ``label`` says in words what the interval is.
    ``p_value`` is the one-sided p-value of the ACCEPT test (H0: the bar is not met) and
    ``p_reject`` that of the REJECT test (H0: the bar is met). ``sd`` is the sample sd of the
    block log ratios; ``sd_used`` what the bound used (floored). ``censored`` lists the blocks
    judged as intervals and why."""

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
    p_reject: float = 1.0
    lower_level: float = math.nan
    upper_level: float = math.nan
    method: str = DEFAULT_METHOD
    sd_used: float = math.nan
    censored: tuple[str, ...] = ()
    label: str = ""
    sd_floor: float = SD_FLOOR
    resolution: float = 0.0  # ln units added to each end (the search's precision)

    def to_dict(self) -> dict[str, object]:
        """Plain dict (JSON-ready: inf and nan become None, tuples lists)."""
        out: dict[str, object] = {}
        for f in fields(self):
            k, v = f.name, getattr(self, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                v = None
            elif isinstance(v, tuple):
                v = list(v)
            out[k] = v
        return out


def check_bar(threshold: float, confidence: float, direction: str) -> None:
    if not (threshold > 0 and math.isfinite(threshold)):
        raise ValueError(f"threshold must be a finite ratio > 0 (got {threshold})")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1) (got {confidence})")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)} (got {direction!r})")


# --- the rule ----------------------------------------------------------------------------------


def _as_intervals(values: Sequence[float | BlockRatio] | np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Per block (lowest, highest) ln ratio and the reasons of the interval-valued blocks."""
    if isinstance(values, np.ndarray):
        r = values.astype(np.float64).ravel()
        return r, r, []
    lo, hi, why = [], [], []
    for v in values:
        if isinstance(v, BlockRatio):
            a, b = v.interval
            lo.append(a)
            hi.append(b)
            if not v.is_point:
                why.append(v.reason())
        else:
            lo.append(float(v))
            hi.append(float(v))
    return np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64), why


def judge(
    log_ratios: Sequence[float | BlockRatio] | np.ndarray,
    threshold: float,
    confidence: float,
    direction: Direction = "at_least",
    *,
    accept_confidence: float | None = None,
    reject_confidence: float | None = None,
    sd_floor: float = SD_FLOOR,
    method: Method = DEFAULT_METHOD,
    compare: str = "B/A",
    resolution: float = 0.0,
) -> Judgement:
    """Judge a bar from per-block log ratios ln(C_B / C_A) or ``BlockRatio``s (see the module
    doc for the rule). ``accept_confidence``/``reject_confidence`` set the level of each test
    apart (Holm does); both default to ``confidence``. ``compare`` names the ratio in the
    label (B/A; C/A for a bar of a third arm). ``resolution`` (ln units) is an error every block
    may share (a capacity search's precision): it does not average away, so it widens each end
    of the bound by itself whatever the number of blocks.

    A float infinite log ratio (an arm with zero capacity in a block) makes the bound
    meaningless: the verdict is INCONCLUSIVE with a note. NaN is a bug upstream and raises."""
    check_bar(threshold, confidence, direction)
    c_acc = confidence if accept_confidence is None else accept_confidence
    c_rej = confidence if reject_confidence is None else reject_confidence
    check_bar(threshold, c_acc, direction)
    check_bar(threshold, c_rej, direction)
    if not sd_floor >= 0:
        raise ValueError(f"sd_floor must be >= 0 (got {sd_floor})")
    if not (resolution >= 0 and math.isfinite(resolution)):
        raise ValueError(f"resolution must be a finite number >= 0 (got {resolution})")
    lo_r, hi_r, why = _as_intervals(log_ratios)
    n = int(lo_r.size)
    log_t = math.log(threshold)
    # ACCEPT of at_least and REJECT of at_most test the lower bound; the others the upper.
    lower_level, upper_level = (c_acc, c_rej) if direction == "at_least" else (c_rej, c_acc)
    def make(verdict: Verdict, estimate: float, lb: float, ub: float, p_acc: float, p_rej: float, sd: float,
             note: str) -> Judgement:
        return _labelled(Judgement(
            verdict, estimate, math.exp(lb), math.exp(ub), n, threshold, confidence, direction, p_acc, sd, note,
            p_reject=p_rej, lower_level=lower_level, upper_level=upper_level, method=method,
            sd_used=max(sd, sd_floor) if math.isfinite(sd) else math.nan, censored=tuple(why), sd_floor=sd_floor,
            resolution=resolution,
        ), compare=compare)

    def inconclusive(estimate: float, note: str) -> Judgement:
        return make("INCONCLUSIVE", estimate, -math.inf, math.inf, 1.0, 1.0, math.nan, note)

    if np.isnan(lo_r).any() or np.isnan(hi_r).any():
        raise ValueError("log ratios contain NaN")
    if n == 0:
        return inconclusive(math.nan, "no blocks")
    points = lo_r == hi_r
    if points.all() and not np.isfinite(lo_r).all():
        r = lo_r
        est = float(np.exp(np.mean(r))) if not (np.isposinf(r).any() and np.isneginf(r).any()) else math.nan
        return inconclusive(est, "a block has zero capacity in one arm; its ratio is infinite")
    with np.errstate(invalid="ignore"):
        mid = np.where(points, lo_r, (lo_r + hi_r) / 2)
    estimate = (float(np.exp(location_scale(mid[None, :], sd_floor, method)[0][0])) if n >= 2 else float(np.exp(mid[0]))) \
        if np.isfinite(mid).all() else math.nan
    if n < 2:
        # A censored or unconverged block's estimate is its interval's midpoint: say so.
        bound = f"; {len(why)} block(s) censored or unconverged: the estimate is a midpoint" if why else ""
        return inconclusive(estimate, "one block: no decision from a single pair of runs" + bound)
    open_idx = np.flatnonzero(~points)
    if open_idx.size > MAX_INTERVAL_BLOCKS:
        return inconclusive(estimate, f"{open_idx.size} blocks are censored or unconverged: no bound")

    # Every corner of the box of interval-valued blocks (one row when all are points). The
    # lower bound is concave in the block values and the upper convex, so their extremes over
    # the box lie at corners. An infinite end makes both bounds infinite (the spread grows
    # without bound along that edge: with c > 1 either bound runs off; conservative otherwise).
    if not (np.isfinite(lo_r).all() and np.isfinite(hi_r).all()):
        lb, ub, t_lo, t_hi = -math.inf, math.inf, -math.inf, math.inf
    else:
        rows = np.tile(lo_r, (1 << open_idx.size, 1))
        for k, corner in enumerate(product((0, 1), repeat=open_idx.size)):
            for col, side in zip(open_idx, corner, strict=True):
                if side:
                    rows[k, col] = hi_r[col]
        loc, se, _ = location_scale(rows, sd_floor, method)
        # Each end's factor on its critical value (MEDIAN_SKEW's far end; 1 otherwise). With
        # interval-valued blocks both ends take the wide one: a fixed factor keeps the bounds
        # concave/convex over the box (its corners stay its extremes) and only widens them.
        if open_idx.size == 0:
            f_lo, f_hi = end_factors(rows, method, sd_floor)
        else:
            f_lo = f_hi = np.full(rows.shape[0], far_end(n) if method == MEDIAN_SKEW else 1.0)
        c_lo = critical_value(n, lower_level, method) * f_lo
        c_hi = critical_value(n, upper_level, method) * f_hi
        lb = float(np.min(loc - c_lo * se)) - resolution
        ub = float(np.max(loc + c_hi * se)) + resolution
        with np.errstate(divide="ignore", invalid="ignore"):  # +-inf with a zero floor and no spread
            t_low = np.nan_to_num((loc - resolution - log_t) / se / f_lo, nan=0.0, posinf=math.inf,
                                  neginf=-math.inf)
            t_high = np.nan_to_num((loc + resolution - log_t) / se / f_hi, nan=0.0, posinf=math.inf,
                                   neginf=-math.inf)
        t_lo, t_hi = float(t_low.min()), float(t_high.max())
    p_up = tail_probability(t_lo, n, method)  # evidence that the mean is above the threshold
    p_down = tail_probability(-t_hi, n, method)  # ... below it
    if direction == "at_least":
        accept, reject, p_acc, p_rej = lb > log_t, ub < log_t, p_up, p_down
    else:
        accept, reject, p_acc, p_rej = ub < log_t, lb > log_t, p_down, p_up
    verdict: Verdict = "ACCEPT" if accept else "REJECT" if reject else "INCONCLUSIVE"
    note = ""
    if not math.isfinite(lb) and not math.isfinite(ub):
        note = "a block's ratio is unbounded (censored or 0/0): no bound on the mean; " + "; ".join(why)
    elif why and verdict == "INCONCLUSIVE":
        note = f"{len(why)} block(s) censored or unconverged: judged as intervals"
    elif why:
        note = f"{len(why)} block(s) censored or unconverged: judged as intervals; the verdict holds at every ratio they allow"
    sd_sample = float(np.std(mid, ddof=1)) if np.isfinite(mid).all() else math.nan
    return make(verdict, estimate, lb, ub, p_acc, p_rej, sd_sample, note)


def judge_many(
    log_ratios: np.ndarray,
    threshold: float,
    confidence: float,
    direction: Direction = "at_least",
    *,
    sd_floor: float = SD_FLOOR,
    method: Method = DEFAULT_METHOD,
    resolution: float = 0.0,
    accept_confidence: float | None = None,
) -> np.ndarray:
    """Verdicts of many experiments at once (rows of exact block log ratios), as ``judge``
    would give them: an array of +1 (ACCEPT), -1 (REJECT), 0 (INCONCLUSIVE). For calibration.
    ``accept_confidence`` (default ``confidence``) is the level of both tests, as a sequential
    look or Holm sets it."""
    check_bar(threshold, confidence, direction)
    x = np.atleast_2d(np.asarray(log_ratios, dtype=np.float64))
    n = x.shape[1]
    if n < 2:
        return np.zeros(x.shape[0], dtype=np.int8)
    loc, se, _ = location_scale(x, sd_floor, method)
    level = confidence if accept_confidence is None else accept_confidence
    c = critical_value(n, level, method)
    f_lo, f_hi = end_factors(x, method, sd_floor)
    log_t = math.log(threshold)
    lo, hi = loc - (c * f_lo * se + resolution), loc + (c * f_hi * se + resolution)
    if direction == "at_least":
        accept, reject = lo > log_t, hi < log_t
    else:
        accept, reject = hi < log_t, lo > log_t
    return accept.astype(np.int8) - reject.astype(np.int8)


def _pct(level: float) -> str:
    return f"{100 * level:.4g}%"


def _labelled(j: Judgement, holm: str = "", compare: str = "B/A") -> Judgement:
    """Attach the words that say exactly what ``lower``..``upper`` is (a ratio ``compare``)."""
    how = describe(j.method, j.n) + f"; spread floored at {j.sd_floor:g}"
    if j.resolution > 0:
        how += (f"; each end widened by the search's resolution ({100 * math.expm1(j.resolution):.2g}%, an error "
                "every block may share: no number of blocks decides a bar closer than that)")
    if j.lower_level == j.upper_level:
        two = 2 * j.lower_level - 1
        text = (f"{compare} {j.lower:.4g}..{j.upper:.4g}: each end a one-sided {_pct(j.lower_level)} bound "
                f"(together a {_pct(two)} two-sided interval); {how}")
    else:
        text = (f"{compare} {j.lower:.4g}..{j.upper:.4g}: lower end a one-sided {_pct(j.lower_level)} bound, "
                f"upper end a one-sided {_pct(j.upper_level)} bound; {how}")
    if holm:
        text += f"; {holm}"
    if j.censored:
        text += f"; {len(j.censored)} censored block(s) judged as intervals"
    return _replace(j, label=text)


def _replace(j: Judgement, **changes: Any) -> Judgement:
    return replace(j, **changes)


def log_ratios(b_values: Sequence[float], a_values: Sequence[float]) -> np.ndarray:
    """Per-block ln(B / A) from paired per-block values (capacities, goodputs)."""
    b = np.asarray(b_values, dtype=np.float64)
    a = np.asarray(a_values, dtype=np.float64)
    if b.shape != a.shape:
        raise ValueError(f"B has {b.size} blocks and A has {a.size}; they must pair up")
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(b) - np.log(a)


# --- several bars: Holm ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BarEvidence:
    """One bar's input to ``judge_bars``: its per-block log ratios (floats or ``BlockRatio``s)
    and registered terms; ``compare`` names the ratio (B/A, C/A, ...)."""

    log_ratios: Sequence[float | BlockRatio]
    threshold: float
    confidence: float
    direction: Direction = "at_least"
    compare: str = "B/A"
    resolution: float = 0.0


def _holm_levels(p: Sequence[float], alphas: Sequence[float]) -> tuple[list[float], list[bool]]:
    """Holm's step-down: per hypothesis the level it is tested at (its rank's alpha_i / (m - k))
    and whether it is still in the running (every hypothesis ranked before it was rejected)."""
    m = len(p)
    levels = [0.0] * m
    reached = [False] * m
    still = True
    for k, i in enumerate(np.argsort(p, kind="stable")):
        i = int(i)
        levels[i] = alphas[i] / (m - k)
        reached[i] = still
        if p[i] > levels[i]:
            still = False
    return levels, reached


def judge_bars(bars: Sequence[BarEvidence], *, sd_floor: float = SD_FLOOR, method: Method = DEFAULT_METHOD,
               spend: float = 1.0, look: str = "") -> list[Judgement]:
    """Judge every bar of a plan with Holm's step-down correction, for ACCEPT and for REJECT
    apart: a family of m bars makes a false ACCEPT of any of them, and a false REJECT of any of
    them, each at most 1 - confidence likely. The family is every bar of the plan, whatever
    pair of arms each compares (B/A, C/A, C/B of a three-arm plan are three bars of one family).

    Bars are ranked by their ACCEPT p-value; the k-th (from 0) of m is tested at confidence
    1 - (1 - c) / (m - k), and can ACCEPT only if every bar ranked before it was accepted.
    REJECT is the same over the REJECT p-values. The bounds are at the level each test was
    actually run at (the label says which), so a verdict and its interval always agree.

    ``spend`` is the share of each bar's alpha this judgement may use (a sequential look's,
    ``analysis.sequential``; 1 for a fixed design) and ``look`` says which look, for the label."""
    if not 0 < spend <= 1:
        raise ValueError(f"spend must be in (0, 1] (got {spend})")
    alphas = [(1.0 - b.confidence) * spend for b in bars]
    plain = [judge(b.log_ratios, b.threshold, b.confidence, b.direction, sd_floor=sd_floor, method=method,
                   compare=b.compare, resolution=b.resolution, accept_confidence=1.0 - a, reject_confidence=1.0 - a)
             for b, a in zip(bars, alphas, strict=True)]
    m = len(bars)
    if m <= 1:
        return [_labelled(j, look, b.compare) if look else j for j, b in zip(plain, bars, strict=True)]
    acc_level, acc_reached = _holm_levels([j.p_value for j in plain], alphas)
    rej_level, rej_reached = _holm_levels([j.p_reject for j in plain], alphas)
    # One family, one promise: a true-null bar of rank k is tested at alpha_i / (m - k) <= alpha_i / m0,
    # so a false ACCEPT (or REJECT) of any is at most the mean alpha of the true nulls, at most the
    # largest: the family's level is the lowest confidence among its bars, the same in every label.
    family = min(b.confidence for b in bars)
    acc_rank = {int(i): k + 1 for k, i in enumerate(np.argsort([j.p_value for j in plain], kind="stable"))}
    rej_rank = {int(i): k + 1 for k, i in enumerate(np.argsort([j.p_reject for j in plain], kind="stable"))}
    out = []
    for i, b in enumerate(bars):
        j = judge(b.log_ratios, b.threshold, b.confidence, b.direction,
                  accept_confidence=1.0 - acc_level[i], reject_confidence=1.0 - rej_level[i],
                  sd_floor=sd_floor, method=method, compare=b.compare, resolution=b.resolution)
        notes = [j.note] if j.note else []
        if j.verdict == "ACCEPT" and not acc_reached[i]:
            j = _replace(j, verdict="INCONCLUSIVE")
            notes.append("Holm: a bar ranked before it was not accepted")
        elif j.verdict == "REJECT" and not rej_reached[i]:
            j = _replace(j, verdict="INCONCLUSIVE")
            notes.append("Holm: a bar ranked before it was not rejected")
        holm = (f"Holm-adjusted over {m} bars at family level {_pct(family)}: ACCEPT tested at "
                f"{_pct(1.0 - acc_level[i])} (rank {acc_rank[i]} of {m}), REJECT at "
                f"{_pct(1.0 - rej_level[i])} (rank {rej_rank[i]} of {m})")
        notes.append(holm)
        out.append(_labelled(_replace(j, note="; ".join(notes)), "; ".join(x for x in (look, holm) if x), b.compare))
    return out
