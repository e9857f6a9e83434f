"""Calibration of the verdict and the capacity search (issues 17 and 31): the full table.

Part 0 (issue 31), the rule `orch run` applies (MEDIAN_SKEW): the median block ratio as the
estimand, its bound's coverage per end under normal, t(3) and contaminated noise, false accepts at the bar
with their standard errors, power at 2/4/6 blocks, carry-over, a constant search error,
skewed blocks, retries, and the sequential design's blocks and GPU-hours per decided experiment.
Part 1 (``--legacy``) is issue 17's table of the geometric-mean rule (ROBUST), kept to compare.

Part 1, the verdict. Every case of issue 17 that the analysis owns, simulated with fixed seeds:
false accepts at the bar under symmetric, heavy-tailed and skewed block noise (3, 5, 10
blocks; both directions), the same with a plain Student t bound for contrast, power, A/A, the
spread floor, Holm for REJECT and ACCEPT, censored capacities (both arms above the range, the
generator's ceiling against retry-until-valid), the search in the loop, the interval's label
against its coverage, and ABBA drift. One row each: case, goal, measured, simulations.

Part 2, the search. On a family of attainment curves that bend differently (M/M/1 TTFT tails
from gentle to cliff, half with a TPOT knee), noise-free, binomial and overdispersed, cold and
with a prior 3% and 10% off: the share within 2% of the true capacity by point 8 (cold) or 5
(prior), the distribution of points-to-within-2% (the first point after which the estimate
stays within 2%), and of the points the search used before it stopped.

Run: .venv/bin/python benchmarks/verdict_calibration.py [--scale 1.0] [--curves 300]
(a few CPU-minutes at the defaults; --scale 0.2 for a quick look).
"""

from __future__ import annotations

import argparse
import math
import time
import zlib

import numpy as np

from orchestrator.analysis import verdict_cases as vc
from orchestrator.analysis.calibration import (
    Case,
    Curve,
    at_most,
    cliff_curve,
    curve_family,
    drift_false_accepts,
    false_accepts,
    holm_family,
    interval_coverage,
    loop_false_accepts,
    points_to_within,
    power_at,
    resolution_bias,
    search_bias,
    search_pool,
    search_trace,
    tpot_knee_curve,
)
from orchestrator.analysis.critical import FAR_END, FLOORED_SHARE, far_end
from orchestrator.analysis.search import CapacitySearch
from orchestrator.analysis.stats import (
    MEDIAN,
    ROBUST,
    SD_FLOOR,
    STUDENT_T,
    critical_value,
    judge_many,
)

BOUND = 0.06  # 1 - confidence + 0.01 at confidence 0.95
RATE_MIN, RATE_MAX = 0.5, 64.0


def verdict_cases(scale: float) -> list[Case]:
    rng = np.random.default_rng(20260517)
    n = max(int(100_000 * scale), 2000)
    rows: list[Case] = []

    def add(case: str, goal: str, measured: float, sims: int, ok: bool) -> None:
        rows.append(Case(case, goal, measured, sims, ok))
        print(f"  {case:<66} {goal:>10} {measured:>9.4f} {sims:>8}  {'ok' if ok else 'MISSED'}", flush=True)

    for kind in ("normal", "student_t3", "laplace", "contaminated", "exp_tail", "exponential"):
        for direction, threshold in (("at_least", 1.10), ("at_most", 0.97)):
            for blocks in (3, 5, 10):
                r = false_accepts(kind, blocks, n, rng, threshold=threshold, direction=direction)
                add(f"false accepts at the bar: {kind}, {direction}, {blocks} blocks", at_most(BOUND), r, n, r <= BOUND)
    for kind in ("contaminated", "exp_tail", "exponential"):
        for blocks in (3, 5, 10):
            r = false_accepts(kind, blocks, n, rng, method=STUDENT_T)
            add(f"  (contrast) Student t bound: {kind}, {blocks} blocks", "-", r, n, True)
    for blocks in (3, 5, 10):
        r = false_accepts("contaminated_far", blocks, n, rng)
        add(f"  (outside the family) 15% of blocks 10 clean sds low, {blocks} blocks", "report", r, n, True)
    r = power_at(n, rng)
    add("power: true 1.25 vs bar 1.10, sigma 0.05, 5 blocks", ">= 0.800", r, n, r >= 0.8)
    r = power_at(n, rng, method=STUDENT_T)
    add("  (contrast) same with a Student t bound", "-", r, n, True)
    for blocks in (3, 5, 10):
        r = false_accepts("normal", blocks, n, rng, true_ratio=1.0, threshold=1.05)
        add(f"A/A vs at_least 1.05, {blocks} blocks", at_most(0.05), r, n, r <= 0.05)
    for blocks in (3, 5, 10):
        r = resolution_bias(blocks, n, rng)
        add(f"every block 0.5% high, sd 0.002, at the bar, {blocks} blocks (floor 0.01)", at_most(BOUND), r, n, r <= BOUND)
        r = resolution_bias(blocks, n, rng, sd_floor=0.0)
        add(f"  (contrast) same without the spread floor, {blocks} blocks", "-", r, n, True)

    h = max(int(3000 * scale), 500)
    for test in ("REJECT", "ACCEPT"):
        holm, plain = holm_family(test, "normal", 3, 5, h, rng, method=STUDENT_T)
        add(f"3 bars at their boundaries, any false {test} (Holm), normal, t bound", at_most(BOUND), holm, h, holm <= BOUND)
        add(f"  (contrast) each bar at its own level, {test}", "-", plain, h, True)
        holm, _ = holm_family(test, "exp_tail", 3, 5, h, rng, plain=False)
        add(f"3 bars at their boundaries, any false {test} (Holm), exp tail, robust", at_most(BOUND), holm, h, holm <= BOUND)

    # Censored capacities: both arms above rate.max, B truly 10% worse, bar at_least 0.97.
    p = max(int(400 * scale), 80)
    a = search_pool(Curve(200.0, 100.0), p, rng, prior_sd=None)
    b = search_pool(Curve(180.0, 100.0), p, rng, prior_sd=None)
    va, vb = np.array([v.value for v in a.values]), np.array([v.value for v in b.values])
    e = max(int(4000 * scale), 500)
    ia, ib = rng.integers(0, p, (n, 4)), rng.integers(0, p, (n, 4))
    raw = float((judge_many(np.log(0.9 * vb[ib] / va[ia]), 0.97, 0.95) == 1).mean())
    add("  (contrast) both arms above rate.max, raw capacities, 4 blocks", "-", raw, n, True)
    r = loop_false_accepts(a.values, b.values, 0.9, 4, e, rng, threshold=0.97)
    add("both arms above rate.max, B 10% worse vs 0.97, censored, 4 blocks", at_most(BOUND), r, e, r <= BOUND)

    # The generator's ceiling: A's capacity at the ceiling; B at the bar (0.95 x A).
    ac, bc, ceiling = Curve(21.0, 150.0), Curve(21.0 * 0.95, 150.0), 20.5
    old_a = search_pool(ac, p, rng, sigma_arm=0.03, void_above=ceiling)
    old_b = search_pool(bc, p, rng, sigma_arm=0.03, void_above=ceiling)
    ka = np.array([v.value for v, d in zip(old_a.values, old_a.voided, strict=True) if not d])
    kb = np.array([v.value for v, d in zip(old_b.values, old_b.voided, strict=True) if not d])
    new_a = search_pool(ac, p, rng, sigma_arm=0.03, ceiling=ceiling)
    new_b = search_pool(bc, p, rng, sigma_arm=0.03, ceiling=ceiling)
    for blocks in (3, 5):
        ia, ib = rng.integers(0, ka.size, (n, blocks)), rng.integers(0, kb.size, (n, blocks))
        lr = math.log(0.95) + np.log(kb[ib]) - np.log(ka[ia])
        for method in (STUDENT_T, "robust"):
            r = float((judge_many(lr, 0.95, 0.95, method=method) == 1).mean())
            add(f"  (contrast) ceiling: void and retry until valid, {method}, {blocks} blocks", "-", r, n, True)
            r = loop_false_accepts(new_a.values, new_b.values, 0.95, blocks, e, rng, method=method)
            add(f"ceiling caps the search, censored at_ceiling, {method}, {blocks} blocks", at_most(BOUND), r, e, r <= BOUND)
    share = float(np.mean([c == "at_ceiling" for c in new_a.censored]))
    add("  share of A's searches censored at the ceiling", "report", share, p, True)

    # The search in the loop: a knee-bent arm A vs a cliff arm B, B at the bar.
    sa, sb = search_pool(tpot_knee_curve(rng), p, rng), search_pool(cliff_curve(rng), p, rng)
    bias = search_bias(sb)[0] - search_bias(sa)[0]
    add("search in the loop: ln bias of B/A (knee-bent A, cliff B)", "|x|<=0.005", bias, 2 * p, abs(bias) <= 0.005)
    for blocks in (5, 10):
        for method in ("robust", STUDENT_T):
            r = loop_false_accepts(sa.values, sb.values, 1.10, blocks, e, rng, method=method)
            goal = at_most(BOUND) if method == "robust" else "-"
            add(f"search in the loop at the bar, {method}, {blocks} blocks", goal, r, e, method != "robust" or r <= BOUND)
    errs = np.array([search_pool(tpot_knee_curve(rng), 1, rng, sigma_arm=0.0, noise="none").errors[0]
                     for _ in range(p)])
    add("TPOT knee (bends before its cliff), prior 3%: mean ln error", "|x|<=0.004", float(errs.mean()), p,
        abs(errs.mean()) <= 0.004)
    add("TPOT knee, prior 3%: worst ln error", ">= -0.020", float(errs.min()), p, errs.min() >= -0.02)

    cov, _ = interval_coverage(5, e, rng)
    add("label '90% two-sided interval' (t bound): coverage", "0.88-0.92", cov, e, 0.88 <= cov <= 0.92)
    cov, _ = interval_coverage(5, e, rng, method="robust")
    add("label '90% two-sided interval' (robust bound): coverage", ">= 0.890", cov, e, cov >= 0.89)
    for blocks, dropped in ((4, ()), (3, ()), (4, (1,))):
        r, warning = drift_false_accepts(blocks, n, rng, dropped=dropped)
        flagged = bool(warning) == (blocks % 2 == 1 or bool(dropped))
        add(f"ABBA {blocks} blocks{' less block 1' if dropped else ''}, drift 0.03/run, t bound: "
            f"{'warned' if warning else 'balanced'}", "warned iff", r, n, flagged)
    return rows


def se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 1e-12) / n)


def issue31_table(scale: float) -> list[Case]:
    """Part 0: every case of issue 31 against the rule `orch run` applies."""
    rng = np.random.default_rng(20261206)
    n = max(int(200_000 * scale), 4000)
    rows: list[Case] = []

    def add(case: str, goal: str, measured: float, sims: int, ok: bool, extra: str = "") -> None:
        rows.append(Case(case, goal, measured, sims, ok))
        print(f"  {case:<70} {goal:>12} {measured:>8.4f} {extra:>9} {sims:>8}  {'ok' if ok else 'MISSED'}", flush=True)

    print(f"  {'case':<70} {'goal':>12} {'measured':>8} {'(se)':>9} {'sims':>8}")
    for kind in vc.NOISES:
        for blocks in (2, 3, 4, 6, 9, 10, 20, 60, 100):
            c = vc.coverage(kind, blocks, n if blocks <= 20 else n // 4, rng)
            for end, v in (("lower", c.lower), ("upper", c.upper)):
                add(f"coverage of the {end} end (95% one-sided), {kind}, {blocks} blocks", "0.950-0.970",
                    v, c.sims, 0.95 - 2 * se(v, c.sims) <= v <= 0.97 + 2 * se(v, c.sims), f"({se(v, c.sims):.4f})")
            fa = 1 - c.lower
            add(f"false accepts, median at the bar, {kind}, {blocks} blocks", at_most(BOUND), fa, c.sims,
                fa <= BOUND, f"({se(fa, c.sims):.4f})")
    for kind in vc.NOISES:  # the spread floor's reach at 2 blocks: a floored spread takes half the value
        for sigma in (0.02, 0.5):
            c = vc.coverage(kind, 2, n, rng, sigma=sigma)
            add(f"  (floor) 2 blocks, {kind}, sd {sigma} ({sigma / SD_FLOOR:g} floors): lower / upper end",
                ">= 0.950", c.lower, n, min(c.lower, c.upper) >= 0.95 - 2 * se(0.95, n), f"{c.upper:.4f}")
        c = vc.coverage(kind, 2, n, rng, method=MEDIAN)
        add(f"  (contrast) 2 blocks, {kind}, the full value on a floored spread (MEDIAN): lower end", "-", c.lower,
            n, True, f"{c.upper:.4f}")
    for blocks in (3, 4):
        c = vc.coverage("contaminated", blocks, n, rng, method=MEDIAN)
        add(f"  (contrast) upper end, contaminated, {blocks} blocks, one symmetric value (MEDIAN)", "-", c.upper, n,
            True)
    for kind in vc.NOISES:
        for blocks in (2, 4, 6):
            p = vc.power(kind, blocks, n, rng)
            goal = ">= 0.800" if (kind, blocks) == ("normal", 4) else "report"
            add(f"power 1.25 vs bar 1.10, sd 0.05, {kind}, {blocks} blocks", goal, p, n,
                goal == "report" or p >= 0.8, f"({se(p, n):.4f})")
        p = vc.power(kind, 4, n, rng, resolution=math.log1p(0.02))
        add(f"  same, 4 blocks, with a 2% search's resolution on each end, {kind}", "report", p, n, True)
    p = vc.power("normal", 4, n, rng, method=ROBUST)
    add("  (contrast) power, normal, 4 blocks, the geometric-mean rule before (ROBUST)", "-", p, n, True)

    for sigma in (0.02, 0.01):
        for blocks in (10, 16):
            fa, _ = vc.carryover_false_accepts(blocks, n, rng, sigma=sigma, lead_in=True)
            add(f"carry-over 3% after B, sd {sigma}, {blocks} blocks, no search floor, lead-in runs, rule voids",
                at_most(BOUND), fa, n, fa <= BOUND, f"({se(fa, n):.4f})")
            fa, _ = vc.carryover_false_accepts(blocks, n, rng, sigma=sigma)
            add("  same, ABBA without lead-ins (`orch plan validate` warns for a bar at a rate)", "-", fa, n, True,
                f"({se(fa, n):.4f})")
            fa, _ = vc.carryover_false_accepts(blocks, n, rng, sigma=sigma, across_blocks=True)
            add("  same, blocks back to back (the carry-over crosses them), ABBA without lead-ins", "report", fa, n,
                True, f"({se(fa, n):.4f})")
            fa, _ = vc.carryover_false_accepts(blocks, n, rng, sigma=sigma, lead_in=True, switch_only=True)
            add("  (not cancelled) a carry-over only a switch of arms leaves, with lead-ins", "-", fa, n, True)
            fa, _ = vc.carryover_false_accepts(blocks, n, rng, sigma=sigma, void=False)
            add("  (contrast) ABBA without lead-ins or the carry-over rule", "-", fa, n, True)
            _, voids = vc.carryover_false_accepts(blocks, n, rng, sigma=sigma, carry=0.0)
            add("  price: experiments voided with no carry-over", "report", voids, n, True)
            fa, _ = vc.carryover_false_accepts(blocks, n, rng, sigma=sigma, resolution=math.log1p(0.02))
            add("  same, a capacity bar (a 2% search's resolution on each end), rule voids", at_most(BOUND), fa, n,
                fa <= BOUND, f"({se(fa, n):.4f})")

    # A constant search error: noise-free searches of a true ratio 1.0, 48 shape/scale pairs.
    crng = np.random.default_rng(48)
    shapes = curve_family(crng, 8, RATE_MIN, RATE_MAX)
    errs = []
    for i, a in enumerate(shapes):
        b = shapes[(i + 1) % len(shapes)]
        for k in (0.6, 0.8, 1.0, 1.3, 1.7, 2.2):
            pair = [Curve(c.mu * k, c.sharpness, c.tpot_knee, c.tpot_width, c.tokens) for c in (a, b)]
            ea, eb = (search_pool(c, 1, crng, sigma_arm=0.0, prior_sd=None, noise="none").errors[0] for c in pair)
            errs.append(eb - ea)
    for rho, what in ((math.log1p(0.02), "with the resolution floor"), (0.0, "(contrast) without it")):
        hits = sum(any(judge_many(np.full((1, m), e), 1.0, 0.95, resolution=rho)[0] == 1 for m in range(2, 41))
                   for e in errs if math.isfinite(e))
        add(f"constant search error: pairs (of 48) accepting 1.0 at some n <= 40, {what}",
            "0" if rho else "-", float(hits), len(errs), hits == 0 or rho == 0.0)
    add("  largest |ln error| of a noise-free pair (precision 2% = 0.0198)", "report",
        float(np.nanmax(np.abs(np.array(errs)))), len(errs), True)

    for share in (0.10, 0.20):
        for sigma in (0.02, 0.05):
            fa = vc.skewed_false_accepts(share, sigma, 10, n, rng)
            add(f"B 30% worse in {share:.0%} of blocks, sd {sigma}, median at the bar, 10 blocks", at_most(BOUND), fa,
                n, fa <= BOUND, f"({se(fa, n):.4f})")
            fa = vc.skewed_false_accepts(share, sigma, 10, n, rng, at="mean")
            add("  (another estimand) same with the geometric mean at the bar", "-", fa, n, True)

    bias = vc.retry_selection(n, rng)
    add("retries: ln bias of B/A kept after voids (30% void below -1 sd)", "<= 0.0198", bias, n, abs(bias) <= 0.0198)

    print("\n  sequential design: 8 planned blocks, looks every 2 from 2, sd 0.05, 1.25 vs bar 1.10 "
          "(GPU-hours: 1 GPU-hour per run, 2 per block)")
    print(f"  {'rule':<22} {'false acc':>9} {'power':>7} {'blocks@bar':>10} {'blocks@1.25':>11} "
          f"{'GPU-h/decided@1.25':>18}")
    for spending in (None, "obrien_fleming", "pocock"):
        for kind in vc.NOISES:
            r = vc.sequential_run(8, n, rng, spending=spending, kind=kind)
            per = 2 * r.mean_blocks_alt / max(r.decided_alt, 1e-9)
            name = f"{spending or 'fixed 8 blocks'} {kind}"
            print(f"  {name:<34} {r.false_accepts:>9.4f} {r.power:>7.3f} {r.mean_blocks_null:>10.2f} "
                  f"{r.mean_blocks_alt:>11.2f} {per:>18.2f}", flush=True)
            rows.append(Case(f"sequential {name}: false accepts", at_most(BOUND), r.false_accepts, n,
                             r.false_accepts <= BOUND))
    return rows


def search_table(curves: int) -> None:
    print("\nPart 2: capacity search on curves that bend differently "
          f"({curves} curves each; range {RATE_MIN}-{RATE_MAX} req/s, precision 2%, max 12 points)")
    print(f"  {'noise':<14}{'prior':>7} {'by pt':>5} {'within 2%':>9} {'final':>6} {'stop<=8':>7} "
          f"{'stop mean':>9} {'p90':>4} {'max':>4}   points-to-within-2% (1..12, never)")
    for noise in ("none", "binomial", "overdispersed"):
        for prior_sd in (None, 0.03, 0.10):
            rng = np.random.default_rng([17, zlib.crc32(noise.encode()), int((prior_sd or 0) * 100)])
            to2, stops, final = [], [], []
            for c in curve_family(rng, curves, RATE_MIN, RATE_MAX):
                truth, cross = c.truth(RATE_MIN, RATE_MAX)
                prior = None
                if prior_sd is not None:  # exactly prior_sd off, either side
                    prior = cross * math.exp(prior_sd if rng.random() < 0.5 else -prior_sd)
                tr = search_trace(CapacitySearch(RATE_MIN, RATE_MAX, prior=prior), c, rng, noise)
                to2.append(points_to_within(tr, truth))
                stops.append(len(tr))
                final.append(abs(tr[-1] / truth - 1) <= 0.02)
            t, s = np.array(to2), np.array(stops)
            by = 8 if prior_sd is None else 5
            hist = np.bincount(np.where(np.isfinite(t), t, 13).astype(int), minlength=14)[1:]
            label = "cold" if prior_sd is None else f"{prior_sd:.0%}"
            print(f"  {noise:<14}{label:>7} {by:>5} {np.mean(t <= by):>9.3f} {np.mean(final):>6.3f} "
                  f"{np.mean(s <= 8):>7.3f} {s.mean():>9.2f} {np.quantile(s, 0.9):>4.0f} {s.max():>4}   "
                  f"{' '.join(str(x) for x in hist)}", flush=True)
            if prior_sd == 0.10:
                print(f"  {'':<14}{'':>7} {8:>5} {np.mean(t <= 8):>9.3f}   (prior 10% off: within 2% by point 8)")


def small_blocks_table(scale: float) -> None:
    """Why 2-4 blocks miss 95-97% per end: every location statistic at one symmetric critical value."""
    draws = max(int((1 << 18) * scale), 1 << 14)
    print(f"\nSmall blocks: each location / (sd / sqrt n), its worst-case c over the family; coverage per end "
          f"(lower/upper) at sd 0.05, spread floored; power 1.25 vs 1.10 ({draws} draws a row)")
    print(f"  {'blocks':>6} {'location':<15} {'c':>6}  " + "  ".join(f"{k:>17}" for k in vc.NOISES) + "   power")
    for blocks in (2, 3, 4, 5):
        for location in vc.LOCATIONS:
            if location == "trimmed" and blocks < 3:
                continue
            row = vc.small_blocks_scan(blocks, location, draws)
            cells = "  ".join(f"{lo:>8.3f}/{hi:<8.3f}" for lo, hi in row.cover.values())
            print(f"  {blocks:>6} {location:<15} {row.critical:>6.2f}  {cells}   {row.power:.3f}", flush=True)


def far_end_table(scale: float) -> None:
    """The scan behind ``critical.FAR_END``: per block count, each factor's worst-case critical
    value, the lowest and highest coverage of any end under any shape, and the power."""
    draws = max(int((1 << 18) * scale), 1 << 14)
    print(f"\nFar-end factor (MEDIAN_SKEW): coverage range over every end and shape at sd 0.05, spread floored; "
          f"power 1.25 vs 1.10, normal ({draws} draws a row); FAR_END = {dict(FAR_END)}")
    print(f"  {'blocks':>6} {'factor':>6} {'c':>6} {'lowest':>7} {'highest':>7} {'power':>6}")
    for blocks, factors in ((3, (1.0, 2.0, 2.2, 2.3, 2.5)), (4, (1.0, 1.4, 1.5, 1.7, 2.0)),
                            (5, (1.0, 1.2)), (9, (1.0, 1.1, 1.2, 1.3))):
        for f in factors:
            r = vc.far_end_scan(blocks, f, draws)
            mark = "  <- FAR_END" if f == far_end(blocks) else ""
            print(f"  {blocks:>6} {f:>6.1f} {r.critical:>6.3f} {r.lowest:>7.4f} {r.highest:>7.4f} {r.power:>6.3f}{mark}",
                  flush=True)


def floored_table(scale: float) -> None:
    """The scan behind ``critical.FLOORED_SHARE``: at 2 blocks, over floors of 0-3 clean sds and
    every shape, the lowest coverage of any end at each confidence (the promise) and the highest."""
    draws = max(int((1 << 19) * scale), 1 << 15)
    print(f"\n2 blocks, a floored spread at {FLOORED_SHARE[2]:g}x the critical value: lowest / highest coverage of "
          f"any end over floors of 0-3 clean sds and every shape ({draws} draws a shape)")
    for conf in (0.90, 0.95, 0.975, 0.99):
        lo, hi, where = vc.floored_scan(conf, draws)
        print(f"  confidence {conf:<6g} lowest {lo:.4f} ({where})  highest {hi:.4f}  "
              f"{'ok' if lo >= conf - 2 * se(conf, draws) else 'MISSED'}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="simulations per case, relative to the default")
    ap.add_argument("--curves", type=int, default=300, help="curves per search configuration")
    ap.add_argument("--legacy", action="store_true", help="also print issue 17's table (the ROBUST rule)")
    ap.add_argument("--floored", action="store_true",
                    help="also print the scan behind the 2-block floored share (every floor, shape, confidence)")
    ap.add_argument("--far-end", action="store_true",
                    help="also print the scan behind the far-end factor of the median rule (MEDIAN_SKEW)")
    ap.add_argument("--small-blocks", action="store_true",
                    help="also print why 2-4 blocks cover above 97%% at one end (every location statistic)")
    args = ap.parse_args()
    t0 = time.time()
    print("Part 0 (issue 31): the median block ratio, confidence 0.95; false accepts goal <= 0.06")
    print("  critical values c(n) at 95% (median rule's near end x far-end factor / one symmetric value / "
          "Student t): "
          + ", ".join(f"{k}: {critical_value(k, 0.95):.2f}x{far_end(k):g} / {critical_value(k, 0.95, MEDIAN):.2f} / "
                      f"{critical_value(k, 0.95, STUDENT_T):.2f}" for k in (2, 3, 4, 5, 6, 9, 10, 20, 40, 60, 100)))
    rows = issue31_table(args.scale)
    missed = [r for r in rows if not r.ok]
    print(f"  {len(rows)} rows, {len(missed)} missed" + "".join(f"\n    MISSED: {r.case} {r.measured:.4f}" for r in missed))
    if args.legacy:
        print("\nPart 1: issue 17's table, the geometric-mean rule (ROBUST); goal <= 0.06")
        print("  robust critical values c(n) at 95%: "
              + ", ".join(f"{k}: {critical_value(k, 0.95, ROBUST):.2f} (t {critical_value(k, 0.95, STUDENT_T):.2f})"
                          for k in (2, 3, 4, 5, 10, 20)))
        print(f"  {'case':<66} {'goal':>10} {'measured':>9} {'sims':>8}")
        legacy = verdict_cases(args.scale)
        print(f"  {len(legacy)} rows, {len([r for r in legacy if not r.ok])} missed")
    if args.small_blocks:
        small_blocks_table(args.scale)
    if args.far_end:
        far_end_table(args.scale)
    if args.floored:
        floored_table(args.scale)
    search_table(args.curves)
    print(f"\n{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
