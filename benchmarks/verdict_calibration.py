"""Calibration of the verdict and the capacity search (issue 17): the full table.

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
from orchestrator.analysis.search import CapacitySearch
from orchestrator.analysis.stats import STUDENT_T, critical_value, judge_many

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="simulations per case, relative to the default")
    ap.add_argument("--curves", type=int, default=300, help="curves per search configuration")
    args = ap.parse_args()
    t0 = time.time()
    print("Part 1: verdict calibration (confidence 0.95; false accepts goal <= 1 - confidence + 0.01)")
    print("  robust critical values c(n) at 95%: "
          + ", ".join(f"{k}: {critical_value(k, 0.95):.2f} (t {critical_value(k, 0.95, STUDENT_T):.2f})"
                      for k in (2, 3, 4, 5, 10, 20)))
    print(f"  {'case':<66} {'goal':>10} {'measured':>9} {'sims':>8}")
    rows = verdict_cases(args.scale)
    missed = [r for r in rows if not r.ok]
    print(f"  {len(rows)} rows, {len(missed)} missed")
    search_table(args.curves)
    print(f"\n{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
