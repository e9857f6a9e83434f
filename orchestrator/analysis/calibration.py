"""Synthetic ground truth for calibrating the verdict and the capacity search (issue 17). Pure.

- ``block_noise``: per-block noise of ln(B/A) with mean 0 and sd ``sigma`` in the shapes the
  verdict must survive: symmetric (normal, Laplace), heavy-tailed (Student t(3)), and left-skewed
  (arm B occasionally has a bad block: ``contaminated`` 15% of blocks, an ``exp_tail``
  (normal plus an exponential loss), and the extreme ``exponential`` with no symmetric part).
  The skewed shapes at these parameters are the ones ``stats.NOISE_FAMILY`` registers;
  ``contaminated_far`` (bad blocks 10 clean sds low) lies outside it on purpose.
- ``Curve`` and ``curve_family``: attainment-vs-rate curves that bend differently: an M/M/1-like
  TTFT tail, 1 - rho exp(-s (1 - rho)), whose sharpness s (the TTFT limit in service times)
  runs from gentle (s ~ 2) to a cliff (s ~ 300), times a TPOT knee (per-request TPOT lognormal
  around a median that grows with load) that makes attainment bend before the TTFT cliff.
- ``measure``: one load point of a curve: Poisson arrivals over the window, binomial
  attainment, or overdispersed (a per-point random effect on the logit, as bursty load gives).
- ``search_trace``: drive a ``CapacitySearch`` on a curve and record its estimate after every
  point (for the points-to-within-2% distribution).

Used by ``tests/unit/test_verdict_calibration.py`` and ``benchmarks/verdict_calibration.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from orchestrator.analysis.balance import abba_orders, order_balance
from orchestrator.analysis.blocks import BlockRatio, CapacityValue
from orchestrator.analysis.critical import CONTAMINATED_SHARE, CONTAMINATED_SHIFT, EXP_TAIL_WIDTH
from orchestrator.analysis.search import CapacitySearch
from orchestrator.analysis.stats import (
    ROBUST,
    SD_FLOOR,
    STUDENT_T,
    BarEvidence,
    Direction,
    Method,
    judge,
    judge_bars,
    judge_many,
)
from orchestrator.outcomes import Censoring

NOISE_KINDS = ("normal", "student_t3", "laplace", "contaminated", "exp_tail", "exponential", "contaminated_far")


def block_noise(rng: np.random.Generator, kind: str, shape: int | tuple[int, ...], sigma: float) -> np.ndarray:
    """Block noise of ln(B/A): mean 0, standard deviation ``sigma``; skewed kinds have their
    long tail on the left (B's bad blocks)."""
    if kind == "normal":
        return rng.normal(0.0, sigma, shape)
    if kind == "student_t3":  # t(3) has variance 3
        return rng.standard_t(3, shape) * sigma / math.sqrt(3.0)
    if kind == "laplace":
        return rng.laplace(0.0, sigma / math.sqrt(2.0), shape)
    if kind in ("contaminated", "contaminated_far"):
        p, d = CONTAMINATED_SHARE, (CONTAMINATED_SHIFT if kind == "contaminated" else 10.0)
        s = sigma / math.sqrt(1.0 + p * (1 - p) * d * d)
        bad = rng.random(shape) < p
        return rng.normal(0.0, s, shape) - d * s * (bad - p)
    if kind == "exp_tail":
        s = sigma / math.sqrt(1.0 + EXP_TAIL_WIDTH**2)
        return rng.normal(0.0, s, shape) - EXP_TAIL_WIDTH * s * (rng.standard_exponential(shape) - 1.0)
    if kind == "exponential":
        return sigma * (1.0 - rng.standard_exponential(shape))
    raise ValueError(f"unknown noise kind {kind!r}")


@dataclass(frozen=True)
class Curve:
    """Attainment of a class vs offered rate (requests/s) and the goodput it implies.

    ``mu``: the service rate (req/s) at which the queue saturates; ``sharpness``: the TTFT
    limit in mean service times (small: attainment bends early and gently; large: a cliff
    near saturation); ``tpot_knee``: load (rho) at which half the requests miss the TPOT limit
    (inf: no TPOT knee); ``tpot_width``: how gradually (larger: sharper)."""

    mu: float
    sharpness: float
    tpot_knee: float = math.inf
    tpot_width: float = 10.0
    tokens: float = 256.0  # output tokens per request

    def attainment(self, rate: float | np.ndarray) -> np.ndarray:
        rho = np.asarray(rate, dtype=np.float64) / self.mu
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            ttft = np.where(rho < 1.0, 1.0 - rho * np.exp(-self.sharpness * (1.0 - rho)), 0.0)
            tpot = (special.ndtr(self.tpot_width * np.log(self.tpot_knee / np.maximum(rho, 1e-300)))
                    if math.isfinite(self.tpot_knee) else 1.0)
        return np.clip(ttft * tpot, 0.0, 1.0)

    def goodput(self, rate: float | np.ndarray) -> np.ndarray:
        return np.asarray(rate, dtype=np.float64) * self.attainment(rate) * self.tokens

    def truth(self, rate_min: float, rate_max: float, threshold: float = 0.9) -> tuple[float, float]:
        """(true capacity, the rate where attainment crosses the threshold) over the range."""
        r = np.exp(np.linspace(math.log(rate_min), math.log(rate_max), 200_001))
        a = self.attainment(r)
        ok = a >= threshold
        if not ok.any():
            return 0.0, rate_min
        cap = float((r * a * self.tokens)[ok].max())
        return cap, float(r[ok].max())


def curve_family(rng: np.random.Generator, n: int, rate_min: float = 0.5, rate_max: float = 64.0) -> list[Curve]:
    """``n`` curves whose 0.9 crossing lies well inside the range, sharpness log-uniform from
    gentle to cliff; half have a TPOT knee near or before the TTFT cliff."""
    out: list[Curve] = []
    while len(out) < n:
        s = math.exp(rng.uniform(math.log(2.0), math.log(300.0)))
        knee = math.exp(rng.uniform(math.log(0.5), math.log(1.3))) if len(out) % 2 else math.inf
        width = math.exp(rng.uniform(math.log(2.0), math.log(60.0)))
        probe = Curve(1.0, s, knee, width)
        _, cross = probe.truth(1e-3, 1.5)
        target = math.exp(rng.uniform(math.log(2.0), math.log(40.0)))  # crossing rate, req/s
        c = Curve(target / cross, s, knee, width)
        if c.attainment(rate_min) >= 0.9:
            out.append(c)
    return out


def measure(curve: Curve, rate: float, rng: np.random.Generator | None, noise: str = "none",
            point_s: float = 120.0, overdispersion: float = 0.3, poisson: bool = False) -> tuple[float, float]:
    """(attainment, goodput) of one point: exact, ``binomial`` (rate x ``point_s`` requests,
    each kept with the curve's attainment) or ``overdispersed`` (a per-point normal effect of
    sd ``overdispersion`` on the logit of attainment, then binomial). ``poisson`` also draws the
    number of requests sent (the arrival-count noise every search shares: goodput then moves by
    about 1/sqrt(rate x point_s) whatever the search does)."""
    a = float(curve.attainment(rate))
    if noise == "none" or rng is None:
        return a, rate * a * curve.tokens
    if noise == "overdispersed":
        z = special.logit(min(max(a, 1e-6), 1 - 1e-6)) + rng.normal(0.0, overdispersion)
        a = float(special.expit(z))
    elif noise != "binomial":
        raise ValueError(f"unknown point noise {noise!r}")
    expected = rate * point_s
    sent = max(int(rng.poisson(expected)) if poisson else round(expected), 30)
    kept = int(rng.binomial(sent, a))
    return kept / sent, kept / sent * rate * curve.tokens * (sent / expected if poisson else 1.0)


def search_trace(search: CapacitySearch, curve: Curve, rng: np.random.Generator | None = None,
                 noise: str = "none") -> list[float]:
    """Run the search to its end; the capacity it would report after each point."""
    trace: list[float] = []
    while (rate := search.next_rate()) is not None:
        search.observe(rate, *measure(curve, rate, rng, noise))
        trace.append(search.result().capacity)
    return trace


def points_to_within(trace: list[float], truth: float, tolerance: float = 0.02) -> float:
    """Points after which the estimate is and stays within ``tolerance`` of the truth (inf if
    the search ends outside it)."""
    k = math.inf
    for i in range(len(trace) - 1, -1, -1):
        if abs(trace[i] / truth - 1.0) <= tolerance:
            k = i + 1
        else:
            break
    return k


# --- the calibration cases of issue 17 ---------------------------------------------------------
# Each returns what the benchmark prints and the tests assert; ``sims`` sets the cost.


@dataclass(frozen=True)
class Case:
    """One row of the calibration table: a case, its goal, what was measured."""

    case: str
    goal: str
    measured: float
    simulations: int
    ok: bool


def at_most(limit: float) -> str:
    return f"<= {limit:.3f}"


def false_accepts(kind: str, blocks: int, sims: int, rng: np.random.Generator, *, confidence: float = 0.95,
                  sigma: float = 0.08, threshold: float = 1.10, true_ratio: float | None = None,
                  direction: Direction = "at_least", method: Method = ROBUST, sd_floor: float = SD_FLOOR) -> float:
    """ACCEPT rate with the true ratio at the bar (or ``true_ratio``): block noise of ``kind``,
    its long tail against the claim (B's bad blocks for at_least, A's for at_most)."""
    noise = block_noise(rng, kind, (sims, blocks), sigma)
    if direction == "at_most":
        noise = -noise
    r = math.log(true_ratio if true_ratio is not None else threshold) + noise
    return float((judge_many(r, threshold, confidence, direction, method=method, sd_floor=sd_floor) == 1).mean())


def power_at(sims: int, rng: np.random.Generator, *, true_ratio: float = 1.25, threshold: float = 1.10,
             sigma: float = 0.05, blocks: int = 5, confidence: float = 0.95, method: Method = ROBUST) -> float:
    r = math.log(true_ratio) + rng.normal(0.0, sigma, (sims, blocks))
    return float((judge_many(r, threshold, confidence, method=method) == 1).mean())


def holm_family(test: str, kind: str, bars: int, blocks: int, sims: int, rng: np.random.Generator, *,
                sigma: float = 0.08, method: Method = ROBUST, plain: bool = True) -> tuple[float, float]:
    """P(any bar of ``bars``, each exactly at its boundary, gets a false ``test`` verdict):
    (with Holm as ``judge_bars`` applies it, each bar at its own level; nan unless ``plain``).
    The noise's long tail is set against the tested claim."""
    thresholds = [1.05, 1.10, 1.15, 1.20, 1.25][:bars]
    sign = 1.0 if test == "ACCEPT" else -1.0  # left tail fools ACCEPT, right tail REJECT
    holm_hits = plain_hits = 0
    for _ in range(sims):
        ev = [BarEvidence(list(math.log(t) + sign * block_noise(rng, kind, blocks, sigma)), t, 0.95)
              for t in thresholds]
        holm_hits += any(j.verdict == test for j in judge_bars(ev, method=method))
        if plain:
            plain_hits += any(judge(e.log_ratios, e.threshold, e.confidence, method=method).verdict == test
                              for e in ev)
    return holm_hits / sims, plain_hits / sims if plain else math.nan


def resolution_bias(blocks: int, sims: int, rng: np.random.Generator, *, bias: float = 0.005,
                    sigma: float = 0.002, threshold: float = 1.15, sd_floor: float = SD_FLOOR) -> float:
    """ACCEPT rate when the true ratio is at the bar but every block reads ``bias`` high (a
    search's constant error within its precision) with almost no spread."""
    r = math.log(threshold) + bias + rng.normal(0.0, sigma, (sims, blocks))
    return float((judge_many(r, threshold, 0.95, sd_floor=sd_floor) == 1).mean())


def interval_coverage(blocks: int, sims: int, rng: np.random.Generator, *, method: Method = STUDENT_T,
                      confidence: float = 0.95, sigma: float = 0.08) -> tuple[float, str]:
    """Share of judgements whose [lower, upper] covers the true ratio, and the label's claim."""
    truth = 1.2
    hits = 0
    label = ""
    for _ in range(sims):
        j = judge(math.log(truth) + rng.normal(0.0, sigma, blocks), 1.1, confidence, method=method)
        hits += j.lower <= truth <= j.upper
        label = j.label
    return hits / sims, label


def drift_false_accepts(blocks: int, sims: int, rng: np.random.Generator, *, drift: float = 0.03,
                        sigma: float = 0.03, threshold: float = 1.10, dropped: tuple[int, ...] = (),
                        method: Method = STUDENT_T) -> tuple[float, str]:
    """ACCEPT rate at the bar under ABBA with a linear drift of ``drift`` per run (the arm that
    runs second gains it), and ``order_balance``'s warning for that design."""
    orders = abba_orders(blocks)
    kept = [b for b in range(blocks) if b not in dropped]
    # The later of the two runs gains the drift: +d per position B runs after A.
    shift = np.array([drift * (orders[b].index("B") - orders[b].index("A")) for b in kept])
    r = math.log(threshold) + shift + rng.normal(0.0, sigma, (sims, len(kept)))
    rate = float((judge_many(r, threshold, 0.95, method=method) == 1).mean())
    return rate, order_balance(orders, dropped).warning


# --- the search in the loop ---------------------------------------------------------------------


def tpot_knee_curve(rng: np.random.Generator) -> Curve:
    """A curve that bends before its cliff: a sharp-ish TPOT knee well before the TTFT cliff
    (the goodput peaks 3-8% above the goodput at the 0.9 crossing)."""
    return Curve(math.exp(rng.uniform(math.log(3.0), math.log(40.0))), 300.0, 0.8, rng.uniform(15.0, 50.0))


def cliff_curve(rng: np.random.Generator) -> Curve:
    """An M/M/1 cliff without a TPOT knee."""
    return Curve(math.exp(rng.uniform(math.log(3.0), math.log(40.0))), rng.uniform(80.0, 300.0))


def _scaled(v: CapacityValue, k: float) -> CapacityValue:
    lo, hi = v.bounds
    return CapacityValue(v.value * k, lower=lo * k, upper=hi * k, censored=v.censored, converged=v.converged)


@dataclass(frozen=True)
class Pool:
    """Searches of one arm: ``values`` relative to the curve's unscaled true capacity (the
    block's scale noise included), ``errors`` the search's own ln error against the scaled
    truth, ``voided`` whether the old executor would have voided the run (a rate asked above
    ``void_above``)."""

    values: list[CapacityValue]
    errors: np.ndarray
    voided: np.ndarray
    censored: list[Censoring | None]


def search_pool(curve: Curve, size: int, rng: np.random.Generator, *, sigma_arm: float = 0.02,
                prior_sd: float | None = 0.03, noise: str = "binomial", rate_min: float = 0.5,
                rate_max: float = 64.0, ceiling: float | None = None,
                void_above: float | None = None) -> Pool:
    """``size`` searches of one arm, each on the curve scaled by exp(N(0, sigma_arm)) (the
    block's true capacity moves with it; a prior ``prior_sd`` off the scaled crossing)."""
    truth0, cross0 = curve.truth(curve.mu * 1e-4, curve.mu * 1.5)  # the whole curve, not the range
    values: list[CapacityValue] = []
    errors: list[float] = []
    voided: list[bool] = []
    censored: list[Censoring | None] = []
    for _ in range(size):
        k = math.exp(rng.normal(0.0, sigma_arm))
        c = Curve(curve.mu * k, curve.sharpness, curve.tpot_knee, curve.tpot_width, curve.tokens)
        prior = cross0 * k * math.exp(rng.normal(0.0, prior_sd)) if prior_sd is not None else None
        s = CapacitySearch(rate_min, rate_max, prior=prior, ceiling=ceiling)
        asked = []
        while (rate := s.next_rate()) is not None:
            asked.append(rate)
            s.observe(rate, *measure(c, rate, rng, noise))
        res = s.result()
        values.append(_scaled(res.value(), 1.0 / truth0))
        errors.append(math.log(res.capacity / (truth0 * k)) if res.capacity > 0 else -math.inf)
        voided.append(void_above is not None and max(asked) > void_above)
        censored.append(res.censored)
    return Pool(values, np.array(errors), np.array(voided), censored)


def _draw(pool: list[CapacityValue], rng: np.random.Generator, shape: tuple[int, int]) -> list[list[CapacityValue]]:
    idx = rng.integers(0, len(pool), shape)
    return [[pool[i] for i in row] for row in idx]


def loop_false_accepts(a_pool: list[CapacityValue], b_pool: list[CapacityValue], ratio: float, blocks: int,
                       sims: int, rng: np.random.Generator, *, threshold: float | None = None,
                       method: Method = ROBUST) -> float:
    """ACCEPT rate of experiments whose blocks draw each arm's capacity from its search pool
    (B's truth = ``ratio`` x A's); the bar is at the true ratio unless ``threshold`` says."""
    t = ratio if threshold is None else threshold
    a_rows, b_rows = _draw(a_pool, rng, (sims, blocks)), _draw(b_pool, rng, (sims, blocks))
    accepts = 0
    for ar, br in zip(a_rows, b_rows, strict=True):
        blk = [BlockRatio(i, a, _scaled(b, ratio)) for i, (a, b) in enumerate(zip(ar, br, strict=True))]
        accepts += judge(blk, t, 0.95, method=method).verdict == "ACCEPT"
    return accepts / sims


def search_bias(pool: Pool) -> tuple[float, float]:
    """(mean ln error, share within 2%) of a pool's searches against their own truth."""
    e = pool.errors[np.isfinite(pool.errors)]
    return float(e.mean()), float((np.abs(np.exp(e) - 1) <= 0.02).mean())
