"""The cases of issue 31, simulated against the verdict rule as `orch run` applies it (MEDIAN_SKEW's
bound, the search's resolution, the carry-over rule, the sequential looks). Pure; used by
``benchmarks/verdict_calibration.py`` and its tests. Every noise shape is centred at its median:
the estimand a bar states (the median block ratio).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from orchestrator.analysis.carryover import welch_rows
from orchestrator.analysis.critical import (
    CONTAMINATED_SHARE,
    CONTAMINATED_SHIFT,
    DEFAULT_METHOD,
    MEDIAN_SKEW,
    Method,
    contaminated,
    contaminated_median,
    critical_value,
    end_factors,
    location_scale,
    skew_sign,
)
from orchestrator.analysis.sequential import Spending, look_blocks, shares
from orchestrator.analysis.stats import SD_FLOOR, judge_many

NOISES = ("normal", "student_t3", "contaminated")


def median_noise(rng: np.random.Generator, kind: str, shape: tuple[int, ...], sigma: float) -> np.ndarray:
    """Block noise with median 0 and scale ``sigma`` (the clean blocks' sd): normal, t(3)
    scaled to sd ``sigma``, or 15% of blocks 5.5 clean sds low (B's bad blocks)."""
    if kind == "normal":
        return rng.normal(0.0, sigma, shape)
    if kind == "student_t3":
        return rng.standard_t(3, shape) * sigma / math.sqrt(3.0)
    if kind == "contaminated":
        z = rng.standard_normal(shape) - CONTAMINATED_SHIFT * (rng.random(shape) < CONTAMINATED_SHARE)
        return sigma * (z - contaminated_median())
    raise ValueError(f"unknown noise {kind!r}")


@dataclass(frozen=True)
class Coverage:
    lower: float  # share of lower ends at or below the truth
    upper: float
    sims: int


def _ends(r: np.ndarray, confidence: float, method: Method, resolution: float) -> tuple[np.ndarray, np.ndarray]:
    """Each row's one-sided bounds (ln units), as ``judge`` computes them for points."""
    loc, se, _ = location_scale(r, SD_FLOOR, method)
    c = critical_value(r.shape[1], confidence, method)
    f_lo, f_hi = end_factors(r, method, SD_FLOOR)
    return loc - (c * f_lo * se + resolution), loc + (c * f_hi * se + resolution)


def coverage(kind: str, blocks: int, sims: int, rng: np.random.Generator, *, sigma: float = 0.05,
             confidence: float = 0.95, method: Method = DEFAULT_METHOD) -> Coverage:
    """How often each one-sided end covers the true median ratio (1.0 here)."""
    r = median_noise(rng, kind, (sims, blocks), sigma)
    lo, hi = _ends(r, confidence, method, 0.0)
    return Coverage(float((lo <= 0).mean()), float((hi >= 0).mean()), sims)


def power(kind: str, blocks: int, sims: int, rng: np.random.Generator, *, true_ratio: float = 1.25,
          threshold: float = 1.10, sigma: float = 0.05, resolution: float = 0.0, method: Method = DEFAULT_METHOD) -> float:
    r = math.log(true_ratio) + median_noise(rng, kind, (sims, blocks), sigma)
    return float((judge_many(r, threshold, 0.95, resolution=resolution, method=method) == 1).mean())


def carry_penalties(blocks: int, carry: float, *, lead_in: bool = False, across_blocks: bool = False,
                    switch_only: bool = False) -> np.ndarray:
    """Per ABBA block, ln(B/A)'s shift from a carry-over B leaves: the run right after a run of B
    (any arm; with ``switch_only`` only A) loses ``carry`` of its capacity. ``across_blocks``:
    the block's first run follows the previous block's last (runs back to back); otherwise the
    carry-over stays inside a block (the issue's model: a block's first run follows nothing).
    ``lead_in``: each block begins with a lead-in run of its first arm (``lead_in_s``), unmeasured."""
    out = np.zeros(blocks)
    before: str | None = None
    for b in range(blocks):
        seq = ["A", "B"] if b % 2 == 0 else ["B", "A"]
        prev = before if across_blocks else None
        if lead_in:
            prev = seq[0]  # the lead-in of the block's first arm ran right before its first run
        shift = {}
        for arm in seq:
            hit = prev == "B" and not (switch_only and arm == "B")
            shift[arm] = math.log1p(-carry) if hit else 0.0
            prev = arm
        before = prev
        out[b] = shift["B"] - shift["A"]
    return out


def carryover_false_accepts(blocks: int, sims: int, rng: np.random.Generator, *, sigma: float, carry: float = 0.03,
                            bound: float = 0.0, void: bool = True, threshold: float = 1.0,
                            resolution: float = 0.0, lead_in: bool = False, across_blocks: bool = False,
                            switch_only: bool = False) -> tuple[float, float]:
    """ABBA; a carry-over B leaves (``carry_penalties``: by default the run right after B inside
    a block is ``carry`` slower, so B-then-A blocks read ln(B/A) ``carry`` high); the true ratio
    at the bar. (false accepts, share voided) with the carry-over rule voiding (``void``) or not;
    ``resolution``: a capacity bar's search resolution on each end."""
    after = np.array([b % 2 == 0 for b in range(blocks)])  # AB blocks: B after A
    shift = carry_penalties(blocks, carry, lead_in=lead_in, across_blocks=across_blocks, switch_only=switch_only)
    r = math.log(threshold) + rng.normal(0.0, sigma, (sims, blocks)) + shift
    accept = judge_many(r, threshold, 0.95, resolution=resolution) == 1
    diff, half = welch_rows(r[:, after], r[:, ~after], 0.95)
    b = math.log1p(bound)
    voided = (diff - half > b) | (diff + half < -b)
    return float((accept & ~voided).mean() if void else accept.mean()), float(voided.mean())


def skewed_false_accepts(share: float, sigma: float, blocks: int, sims: int, rng: np.random.Generator, *,
                         drop: float = 0.30, at: str = "median", threshold: float = 1.10) -> float:
    """B 30% worse in ``share`` of blocks (clean sd ``sigma``); the median (or the mean of the
    log ratios) at the bar."""
    bad = rng.random((sims, blocks)) < share
    x = rng.normal(0.0, sigma, (sims, blocks)) + np.where(bad, math.log1p(-drop), 0.0)
    # the population's median / mean, by a large draw of the same mixture
    big = np.random.default_rng(1).normal(0.0, sigma, 1 << 20) + np.where(
        np.random.default_rng(2).random(1 << 20) < share, math.log1p(-drop), 0.0)
    centre = float(np.median(big) if at == "median" else big.mean())
    r = math.log(threshold) + x - centre
    return float((judge_many(r, threshold, 0.95) == 1).mean())


@dataclass(frozen=True)
class SequentialResult:
    false_accepts: float  # at the bar
    power: float  # at the alternative
    mean_blocks_null: float
    mean_blocks_alt: float
    decided_alt: float  # share of experiments decided (ACCEPT or REJECT) at the alternative


def sequential_run(planned: int, sims: int, rng: np.random.Generator, *, spending: Spending | None,
                   min_blocks: int = 2, sigma: float = 0.05, threshold: float = 1.10, alternative: float = 1.25,
                   kind: str = "normal", resolution: float = 0.0) -> SequentialResult:
    """One bar, ABBA looks every 2 blocks (``spending`` None: a fixed design of ``planned``)."""
    looks = [planned] if spending is None else look_blocks(planned, min_blocks, 2)
    share = [1.0] if spending is None else shares(looks, planned, 0.05, spending)
    out = []
    for truth in (threshold, alternative):
        r = math.log(truth) + median_noise(rng, kind, (sims, planned), sigma)
        verdict = np.zeros(sims, dtype=np.int8)
        used = np.full(sims, planned)
        open_ = np.ones(sims, dtype=bool)
        for n, s in zip(looks, share, strict=True):
            v = judge_many(r[:, :n], threshold, 0.95, resolution=resolution, accept_confidence=1 - 0.05 * s)
            stop = open_ & (v != 0)
            verdict[stop] = v[stop]
            used[stop] = n
            open_ &= v == 0
        out.append((float((verdict == 1).mean()), float(used.mean()), float((verdict != 0).mean())))
    (fa, blocks_null, _), (pw, blocks_alt, decided) = out
    return SequentialResult(fa, pw, blocks_null, blocks_alt, decided)


def retry_selection(sims: int, rng: np.random.Generator, *, sigma_arm: float = 0.03, void_base: float = 0.05,
                    void_low: float = 0.30, retries: int = 2) -> float:
    """Mean ln bias of B/A kept runs when a guard voids a run more often when its capacity came
    out low (``void_low`` below -1 sd, ``void_base`` otherwise) and it is retried until valid:
    only B's runs are so selected (the worst case: A's selection would cancel it)."""
    kept = np.zeros(sims)
    pending = np.ones(sims, dtype=bool)
    for attempt in range(retries + 1):
        z = rng.standard_normal(sims)
        p = np.where(z < -1.0, void_low, void_base)
        ok = pending & ((rng.random(sims) >= p) | (attempt == retries))
        kept[ok] = sigma_arm * z[ok]
        pending &= ~ok
    return float(kept.mean())


# --- why a few blocks cannot cover within 95-97% under every shape ------------------------------

LOCATIONS = ("mean", "median", "hodges_lehmann", "trimmed")


def _location(x: np.ndarray, kind: str) -> np.ndarray:
    n = x.shape[1]
    if kind == "mean":
        return x.mean(axis=1)
    if kind == "median":
        return np.median(x, axis=1)
    if kind == "hodges_lehmann":  # the median of the Walsh averages
        i, j = np.triu_indices(n)
        return np.median((x[:, i] + x[:, j]) / 2, axis=1)
    if kind == "trimmed":  # one block off each end
        return np.sort(x, axis=1)[:, 1:n - 1].mean(axis=1)
    raise ValueError(f"unknown location {kind!r}")


@dataclass(frozen=True)
class SmallBlocksRow:
    location: str
    blocks: int
    critical: float  # the family's worst-case one-sided 95% quantile of location / (sd / sqrt(n))
    cover: dict[str, tuple[float, float]]  # shape -> (lower end, upper end) coverage at sigma 0.05
    power: float  # 1.25 vs a 1.10 bar, sd 0.05, normal


def small_blocks_scan(blocks: int, location: str, draws: int, seed: int = 31) -> SmallBlocksRow:
    """One location statistic over ``blocks`` blocks, studentised by the sample sd, with one
    symmetric critical value (the worst case over the family: normal, t(3), 15% contaminated low
    and high, each centred at its median), as ``critical`` calibrates MEDIAN's: each shape's
    coverage per end (the spread floored as ``judge`` floors it) and the power. It shows what
    limits coverage at 2-4 blocks: a shape whose statistic is skewed (contamination pulls the
    location and inflates the sd together) covers its far end above 97% once the near end of
    its mirror image is held at 95%, whatever the location."""
    rng = np.random.default_rng([seed, blocks])
    qs = []
    for shape in ("normal", "student_t3", "contaminated"):
        x = median_noise(rng, shape, (draws, blocks), 1.0)
        t = _location(x, location) / (x.std(axis=1, ddof=1) / math.sqrt(blocks))
        qs += [np.quantile(t, 0.95), -np.quantile(t, 0.05)]  # the mirror image's upper quantile
    c = float(max(qs))
    cover: dict[str, tuple[float, float]] = {}
    for shape in NOISES:
        x = median_noise(rng, shape, (draws, blocks), 0.05)
        loc, se = _location(x, location), np.maximum(x.std(axis=1, ddof=1), SD_FLOOR) / math.sqrt(blocks)
        cover[shape] = (float((loc - c * se <= 0).mean()), float((loc + c * se >= 0).mean()))
    x = math.log(1.25) + median_noise(rng, "normal", (draws, blocks), 0.05)
    loc, se = _location(x, location), np.maximum(x.std(axis=1, ddof=1), SD_FLOOR) / math.sqrt(blocks)
    return SmallBlocksRow(location, blocks, c, cover, float((loc - c * se > math.log(1.10)).mean()))


# --- MEDIAN_SKEW's far-end factor: the scan behind ``critical.FAR_END`` --------------------------


@dataclass(frozen=True)
class FarEndRow:
    blocks: int
    factor: float
    critical: float  # the near end's worst-case 95% critical value with this factor
    lowest: float  # the lowest coverage of any end of any shape (sd 0.05, spread floored)
    highest: float  # ... the highest
    power: float  # 1.25 vs a 1.10 bar, sd 0.05, normal


def far_end_scan(blocks: int, factor: float, draws: int, seed: int = 41) -> FarEndRow:
    """MEDIAN_SKEW's statistic at ``blocks`` with the far end ``factor`` times the near end's
    critical value: its worst-case 95% value over the family (centred at each shape's median,
    the spread not floored, as ``critical`` calibrates), then each end's coverage under each
    shape at sd 0.05 with the spread floored as ``judge`` floors it, and the power. ``FAR_END``
    holds, per block count, the smallest factor (steps of 0.1) whose coverage stays in 95-97%."""
    rng = np.random.default_rng([seed, blocks])

    def shapes(scale: float) -> list[np.ndarray]:
        return [scale * rng.standard_normal((draws, blocks)), scale * rng.standard_t(3, (draws, blocks)),
                scale * contaminated(rng, (draws, blocks)), -scale * contaminated(rng, (draws, blocks))]

    def ends(x: np.ndarray, floor: float) -> tuple[np.ndarray, np.ndarray]:
        loc, se, _ = location_scale(x, floor, MEDIAN_SKEW)
        s = skew_sign(x)
        t = loc / se
        # the lower end's statistic, and the upper end's (the mirror image's lower end)
        return np.where(s < 0, t, t / factor), np.where(s > 0, -t, -t / factor)

    c = max(float(np.quantile(ends(x, 0.0)[0], 0.95)) for x in shapes(1.0))
    cover = [float((e <= c).mean()) for x in shapes(0.05) for e in ends(x, SD_FLOOR)]
    x = math.log(1.25) - math.log(1.10) + 0.05 * rng.standard_normal((draws, blocks))
    return FarEndRow(blocks, factor, c, min(cover), max(cover), float((ends(x, SD_FLOOR)[0] > c).mean()))


# --- 2 blocks and the spread floor: the scan behind ``critical.FLOORED_SHARE`` ------------------


def floored_scan(confidence: float, draws: int, floors: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 3.0),
                 seed: int = 43) -> tuple[float, float, str]:
    """MEDIAN_SKEW at 2 blocks as ``judge`` applies it (a floored spread takes ``FLOORED_SHARE``
    of the critical value) over noise of unit clean sd and floors of ``floors`` sds: (the lowest
    coverage of any end of any shape, at which floor and shape, the highest). The promise holds
    when the lowest is at least ``confidence`` (to Monte Carlo error) at every floor."""
    rng = np.random.default_rng([seed, int(confidence * 1e6)])
    shapes = {"normal": rng.standard_normal((draws, 2)), "student_t3": rng.standard_t(3, (draws, 2)) / math.sqrt(3),
              "contaminated low": contaminated(rng, (draws, 2)), "contaminated high": -contaminated(rng, (draws, 2))}
    c = critical_value(2, confidence, MEDIAN_SKEW)
    lowest, highest, where = 1.0, 0.0, ""
    for floor in floors:
        for name, x in shapes.items():
            loc, se, _ = location_scale(x, floor, MEDIAN_SKEW)
            f_lo, f_hi = end_factors(x, MEDIAN_SKEW, floor)
            for cover in ((loc - c * f_lo * se <= 0).mean(), (loc + c * f_hi * se >= 0).mean()):
                if cover < lowest:
                    lowest, where = float(cover), f"floor {floor:g} sd, {name}"
                highest = max(highest, float(cover))
    return lowest, highest, where
