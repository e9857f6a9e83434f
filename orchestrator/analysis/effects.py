"""Effects of a sweep's factors on capacity, with intervals. Pure: numpy and scipy only.

**The model.** ln C_bk = beta_b + mu_k + e_bk: the log capacity of cell (arm) k in block b is
a block effect (the hour, the machine, the drift of that block) plus the cell's own effect
plus noise. The cell effects decompose into factor effects: in a full factorial of two
factors F and G, mu_(i,j) = m + f_i + g_j + (fg)_ij. Every contrast below is a combination of
cells whose weights sum to zero, so beta_b cancels within each block: a block gives the
contrast's value d_b from its own runs (the per-block log ratios against the baseline, arm A,
are the same numbers with the block effect taken out). The estimate is the mean of d_b over the
blocks where every cell has a point capacity, and its interval is Student's t at the sweep's
two-sided confidence with n - 1 degrees of freedom, the spread floored at ``SD_FLOOR`` as a
bar's is: the error of a contrast is estimated from its own block-to-block variation (the
block x cell interaction), so a cell that is noisier than another widens only the contrasts it
enters.

- **Main effect** of factor F at level l against its first level: the ratio of geometric mean
  capacities, exp(mean over cells with F = l of ln C - mean over cells with F = first of ln C),
  averaged over the other factors' levels as the design holds them (every combination in a full
  factorial; a balanced half in a fraction, where main effects are aliased with interactions of
  the other factors).
- **Interaction** of two factors F and G (full factorial), levels i and j against the first
  levels: exp((ln C_ij - ln C_i0) - (ln C_0j - ln C_00)), averaged over any further factors: how
  much F's ratio at G = j differs from F's ratio at G's first level (1: no interaction).

**Incomplete blocks** (``sweep.max_arms_per_block``: each block runs the baseline A and some of
the other cells) give no block every contrast, so ``intrablock_effects`` estimates the cell
effects by the intrablock least-squares analysis of the same model (Yates): within each block the
block effect is removed by centring its ln capacities on the block's mean, which leaves, for the
effects theta_k = mu_k - mu_A of the cells against the baseline, the reduced normal equations
C theta = Q with C = sum_b (I - J / k_b) over the cells of block b (k_b of them) and Q the sum of
the centred values per cell (A's row and column struck out: theta_A = 0). A block enters when A
has a point capacity in it (its other cells are measured against the block's baseline); a cell
of it without one is left out of that block. A contrast w (the weights above) is estimated by
w' theta, with variance sigma^2 w' C^-1 w; sigma^2 is the residual mean square of the within-block
fit, on N - b - (cells - 1) degrees of freedom (N runs in b blocks), its square root floored at
``SD_FLOOR`` / sqrt 2 (a difference of two runs is then floored as a bar's block ratio is). The
interval is Student's t on those degrees of freedom at the sweep's confidence; none when they
are fewer than 1. The model pools one error variance over every cell: a cell noisier than the
others widens every contrast here, not only its own (the complete design's per-contrast spread
does not assume it). An effect of a cell with no point capacity in any block is not estimable
and is left out.

**The search's resolution.** A capacity comes from a search that stops when its bracket is
``search.precision`` wide, and the same curve bends the same way in every block: that error is
a cell's own and does not average away over blocks (a bar's ends carry it too). Each end of a
contrast is widened by ``resolution`` (ln(1 + precision)) times the contrast's weight on one
side, sum |w| / 2: once for a main effect (a ratio of two groups of cells), twice for an
interaction (a ratio of ratios).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as sps

from orchestrator.analysis.stats import SD_FLOOR

EffectKind = Literal["main", "interaction"]


@dataclass(frozen=True)
class Effect:
    """One contrast of a sweep: a ratio of geometric mean capacities with its two-sided
    interval (None: fewer than 2 blocks)."""

    kind: EffectKind
    service_class: str
    factors: tuple[str, ...]  # one (main) or two (interaction)
    levels: tuple[str, ...]  # the level of each factor compared
    reference: tuple[str, ...]  # the level each is compared against (the first)
    ratio: float
    lower: float | None
    upper: float | None
    confidence: float
    blocks: int

    @property
    def label(self) -> str:
        """What it is, in words, e.g. ``replicas 2 vs 1`` or ``replicas 2 vs 1 x mns 64 vs 4``."""
        return " x ".join(f"{f} {lv} vs {ref}" for f, lv, ref in zip(self.factors, self.levels, self.reference,
                                                                      strict=True))

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "class": self.service_class, "factors": list(self.factors),
                "levels": list(self.levels), "reference": list(self.reference), "ratio": self.ratio,
                "lower": self.lower, "upper": self.upper, "confidence": self.confidence, "blocks": self.blocks,
                "label": self.label}


def contrast_interval(d: Sequence[float], confidence: float, sd_floor: float = SD_FLOOR, widen: float = 0.0,
                      ) -> tuple[float, float | None, float | None]:
    """(estimate, lower, upper) of exp(mean d) from per-block contrasts ``d`` (ln units): a
    two-sided Student t interval, each end widened by ``widen`` (ln units: the search's
    resolution on the contrast); no interval with fewer than 2 blocks."""
    x = np.asarray(d, dtype=float)
    mean = float(x.mean())
    if len(x) < 2:
        return math.exp(mean), None, None
    sd = max(float(x.std(ddof=1)), sd_floor)
    half = float(sps.t.ppf(0.5 + confidence / 2, len(x) - 1)) * sd / math.sqrt(len(x)) + widen
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _weights(cells: Mapping[str, tuple[int, ...]], term: Mapping[int, int]) -> dict[str, float]:
    """Contrast weights over cells for a main effect (``term`` {factor: level}) or a two-factor
    interaction ({f: i, g: j}): +/- 1/count of each group of cells, summing to zero."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for arm, cell in cells.items():
        key = tuple(cell[f] for f in term)
        if all(k in (0, term[f]) for k, f in zip(key, term, strict=True)):
            groups.setdefault(key, []).append(arm)
    w: dict[str, float] = {}
    for key, arms in groups.items():
        # main effect: + at level l, - at level 0; interaction: + at (i,j) and (0,0), - at (i,0), (0,j)
        sign = (-1) ** sum(1 for k in key if k == 0)
        for arm in arms:
            w[arm] = sign / len(arms)
    return w


def sweep_effects(
    factors: Mapping[str, Sequence[str]],
    cells: Mapping[str, tuple[int, ...]],
    ln_capacity: Mapping[int, Mapping[str, float]],
    service_class: str,
    confidence: float,
    interactions: bool,
    resolution: float = 0.0,
) -> list[Effect]:
    """Every main effect (each factor's levels against its first) and, with ``interactions``
    (a full factorial), every two-factor interaction, from ``ln_capacity`` block -> arm -> ln C
    (only blocks where every cell has a value are used; the caller leaves out the rest).
    ``factors``: each factor's levels as text, in the order of ``cells``' indices; ``resolution``:
    the search's, ln(1 + precision) (module docstring)."""
    names = list(factors)
    blocks = sorted(b for b, row in ln_capacity.items() if all(a in row for a in cells))
    out: list[Effect] = []
    if not blocks:
        return out
    for kind, term in _terms(factors, interactions):
        w = _weights(cells, term)
        d = [sum(wk * ln_capacity[b][arm] for arm, wk in w.items()) for b in blocks]
        ratio, lo, hi = contrast_interval(d, confidence, widen=resolution_widening(w, resolution))
        out.append(Effect(kind, service_class, tuple(names[f] for f in term),
                          tuple(factors[names[f]][lv] for f, lv in term.items()),
                          tuple(factors[names[f]][0] for f in term), ratio, lo, hi, confidence, len(blocks)))
    return out


def resolution_widening(weights: Mapping[str, float], resolution: float) -> float:
    """How far the search's resolution can move a contrast (ln units): each cell's capacity may
    sit up to ``resolution`` below its truth, so the contrast moves by at most that times the
    weight on one side (sum |w| / 2)."""
    return resolution * sum(abs(w) for w in weights.values()) / 2


def _terms(factors: Mapping[str, Sequence[str]], interactions: bool) -> list[tuple[EffectKind, dict[int, int]]]:
    """Each main effect's {factor: level} and, with ``interactions``, each two-factor interaction's."""
    names = list(factors)
    terms: list[tuple[EffectKind, dict[int, int]]] = [
        ("main", {f: lv}) for f, levels in enumerate(factors.values()) for lv in range(1, len(levels))]
    if interactions:
        terms += [("interaction", {f: i, g: j}) for f, g in itertools.combinations(range(len(names)), 2)
                  for i in range(1, len(factors[names[f]])) for j in range(1, len(factors[names[g]]))]
    return terms


@dataclass(frozen=True)
class IntrablockFit:
    """The intrablock least-squares fit: each observed cell's effect against the baseline (ln
    units), their covariance over sigma^2, the residual sd (unfloored) and its degrees of freedom."""

    theta: dict[str, float]  # cell -> ln effect against the baseline (the baseline: 0)
    cov: dict[tuple[str, str], float]  # (cell, cell) -> entry of C^-1 (the baseline's: 0)
    sigma: float
    df: int
    blocks: int


def intrablock_fit(baseline: str, ln_capacity: Mapping[int, Mapping[str, float]]) -> IntrablockFit:
    """Fit ln C_bk = beta_b + mu_k + e_bk within blocks (``ln_capacity``: block -> cell -> ln C,
    each block holding the baseline; blocks without it, or with no other cell, add nothing)."""
    rows = {b: dict(row) for b, row in ln_capacity.items() if baseline in row and len(row) >= 2}
    cells = sorted({k for row in rows.values() for k in row} - {baseline})
    index = {k: i for i, k in enumerate(cells)}
    c = np.zeros((len(cells), len(cells)))
    q = np.zeros(len(cells))
    for row in rows.values():
        mean = sum(row.values()) / len(row)
        members = [index[k] for k in row if k != baseline]
        for i in members:
            c[i, i] += 1.0
            q[i] += row[cells[i]] - mean
            for j in members:
                c[i, j] -= 1.0 / len(row)
    if not cells:
        return IntrablockFit({baseline: 0.0}, {}, math.nan, 0, len(rows))
    inv = np.linalg.inv(c)  # connected through the baseline in every block: full rank
    theta = inv @ q
    mu = {baseline: 0.0} | {k: float(theta[index[k]]) for k in cells}
    rss = 0.0
    for row in rows.values():
        fitted_mean = sum(mu[k] for k in row) / len(row)
        mean = sum(row.values()) / len(row)
        rss += sum((y - mean - (mu[k] - fitted_mean)) ** 2 for k, y in row.items())
    n = sum(len(row) for row in rows.values())
    df = n - len(rows) - len(cells)
    cov = {(a, b): float(inv[index[a], index[b]]) for a in cells for b in cells}
    return IntrablockFit(mu, cov, math.sqrt(rss / df) if df > 0 else math.nan, df, len(rows))


def intrablock_effects(
    factors: Mapping[str, Sequence[str]],
    cells: Mapping[str, tuple[int, ...]],
    ln_capacity: Mapping[int, Mapping[str, float]],
    service_class: str,
    confidence: float,
    interactions: bool,
    baseline: str = "A",
    resolution: float = 0.0,
) -> list[Effect]:
    """``sweep_effects`` for incomplete blocks: the same main effects and interactions, from the
    intrablock least-squares fit (module docstring); ``ln_capacity`` block -> cell -> ln C of the
    cells each block ran with a point capacity."""
    fit = intrablock_fit(baseline, ln_capacity)
    names = list(factors)
    out: list[Effect] = []
    if not fit.blocks:
        return out
    sigma = max(fit.sigma, SD_FLOOR / math.sqrt(2)) if fit.df > 0 else math.nan
    for kind, term in _terms(factors, interactions):
        w = _weights(cells, term)
        if any(arm not in fit.theta for arm, wk in w.items() if wk):
            continue  # a cell never measured against the baseline: not estimable
        est = sum(wk * fit.theta[arm] for arm, wk in w.items())
        lo = hi = None
        if fit.df > 0:
            var = sum(wa * wb * fit.cov.get((a, b), 0.0) for a, wa in w.items() for b, wb in w.items())
            half = (float(sps.t.ppf(0.5 + confidence / 2, fit.df)) * sigma * math.sqrt(max(var, 0.0))
                    + resolution_widening(w, resolution))
            lo, hi = math.exp(est - half), math.exp(est + half)
        out.append(Effect(kind, service_class, tuple(names[f] for f in term),
                          tuple(factors[names[f]][lv] for f, lv in term.items()),
                          tuple(factors[names[f]][0] for f in term), math.exp(est), lo, hi, confidence, fit.blocks))
    return out
