"""The effects of a sweep in incomplete blocks (analysis.effects.intrablock_effects): the
intrablock fit against an independent least-squares fit with block and arm dummies, the model's
effects recovered whatever the block effects, intervals that cover at their confidence."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from orchestrator.analysis.effects import intrablock_effects, intrablock_fit
from orchestrator.plan.incomplete import block_arms

FACTORS = {"engine.max_num_seqs": ["4", "16", "64"], "replicas": ["1", "2"]}
CELLS = dict(zip("ABCDEF", itertools.product(range(3), range(2)), strict=True))
MAIN_F = [0.0, 0.5, 0.2]  # ln effect of each level of the first factor
MAIN_G = [0.0, 0.7]
INTER = {(1, 1): 0.1, (2, 1): -0.2}  # ln interaction of (F level, G level); 0 elsewhere
MU = {arm: MAIN_F[i] + MAIN_G[j] + INTER.get((i, j), 0.0) for arm, (i, j) in CELLS.items()}


def ln_capacities(blocks: int, sigma: float, rng: np.random.Generator, per_block: int = 3) -> dict[int, dict[str, float]]:
    """ln C_bk = block effect + the cell's effect + noise, for the arms each incomplete block runs."""
    out = {}
    for b, held in enumerate(block_arms("ABCDEF", per_block, blocks)):
        beta = rng.normal(6.0, 1.0)  # a large block effect: it must cancel
        out[b] = {arm: beta + MU[arm] + rng.normal(0, sigma) for arm in held}
    return out


def truth() -> dict[tuple[str, tuple[str, ...]], float]:
    """The model's effects as the estimator defines them (a main effect averages over the other
    factor's levels; an interaction is a ratio of ratios)."""
    cell = {c: MU[a] for a, c in CELLS.items()}
    out = {}
    for i in (1, 2):
        lv = ("16", "64")[i - 1]
        out[("main", (lv,))] = math.exp(np.mean([cell[(i, j)] - cell[(0, j)] for j in range(2)]))
        out[("interaction", (lv, "2"))] = math.exp(cell[(i, 1)] - cell[(i, 0)] - cell[(0, 1)] + cell[(0, 0)])
    out[("main", ("2",))] = math.exp(np.mean([cell[(i, 1)] - cell[(i, 0)] for i in range(3)]))
    return out


def lstsq_contrast(data: dict[int, dict[str, float]], w: dict[str, float], confidence: float,
                   ) -> tuple[float, float, float]:
    """An independent computation: ordinary least squares of ln C on block and arm dummies (A's
    dropped), the contrast's estimate and its t interval from (X'X)^-1 and the residuals."""
    obs = [(b, a, y) for b, row in data.items() for a, y in row.items()]
    blocks = sorted(data)
    others = sorted({a for _, a, _ in obs} - {"A"})
    x = np.zeros((len(obs), len(blocks) + len(others)))
    for i, (b, a, _) in enumerate(obs):
        x[i, blocks.index(b)] = 1.0
        if a != "A":
            x[i, len(blocks) + others.index(a)] = 1.0
    y = np.array([o[2] for o in obs])
    coef, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    df = len(obs) - rank
    s2 = float(np.sum((y - x @ coef) ** 2)) / df
    c = np.zeros(x.shape[1])
    for a, wk in w.items():
        if a != "A":
            c[len(blocks) + others.index(a)] = wk
    est = float(c @ coef)
    half = float(sps.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(s2 * float(c @ np.linalg.inv(x.T @ x) @ c))
    return math.exp(est), math.exp(est - half), math.exp(est + half)


def test_the_fit_is_ordinary_least_squares_with_block_and_arm_dummies() -> None:
    data = ln_capacities(10, 0.1, np.random.default_rng(3))
    del data[2]["F"], data[8]["C"]  # runs without a point capacity: the blocks keep the rest
    fit = intrablock_fit("A", data)
    assert fit.blocks == 10 and fit.df == 28 - 10 - 5
    effects = {(e.kind, e.levels): e for e in intrablock_effects(FACTORS, CELLS, data, "standard", 0.9, True)}
    weights = {  # the contrasts by hand: + the level's cells, - the first level's, each group averaged
        ("main", ("16",)): {"C": 0.5, "D": 0.5, "A": -0.5, "B": -0.5},
        ("main", ("2",)): {"B": 1 / 3, "D": 1 / 3, "F": 1 / 3, "A": -1 / 3, "C": -1 / 3, "E": -1 / 3},
        ("interaction", ("64", "2")): {"F": 1.0, "A": 1.0, "E": -1.0, "B": -1.0},
    }
    for key, w in weights.items():
        ratio, lo, hi = lstsq_contrast(data, w, 0.9)
        e = effects[key]
        assert e.ratio == pytest.approx(ratio, rel=1e-9)
        assert e.lower == pytest.approx(lo, rel=1e-9) and e.upper == pytest.approx(hi, rel=1e-9)


def test_without_noise_every_effect_is_the_models_whatever_the_block_effects() -> None:
    data = ln_capacities(10, 0.0, np.random.default_rng(1))
    got = {(e.kind, e.levels): e for e in intrablock_effects(FACTORS, CELLS, data, "standard", 0.95, True)}
    assert set(got) == set(truth())
    for key, ratio in truth().items():
        e = got[key]
        assert e.ratio == pytest.approx(ratio, rel=1e-9)
        # Identical within-block differences are not certainty: sigma is floored, the interval has width.
        assert e.lower is not None and e.upper is not None and e.lower < e.ratio < e.upper
    assert got[("main", ("2",))].label == "replicas 2 vs 1"


def test_the_intervals_cover_the_models_effects_at_their_confidence() -> None:
    rng = np.random.default_rng(11)
    want = truth()
    trials, covered = 400, dict.fromkeys(want, 0)
    for _ in range(trials):
        for e in intrablock_effects(FACTORS, CELLS, ln_capacities(10, 0.08, rng), "standard", 0.9, True):
            assert e.lower is not None and e.upper is not None
            covered[(e.kind, e.levels)] += e.lower <= want[(e.kind, e.levels)] <= e.upper
    for key, n in covered.items():  # 90% two-sided; binomial sd over 400 trials is 1.5 points
        assert 0.85 <= n / trials <= 0.95, (key, n / trials)


def test_an_arm_never_measured_is_left_out_and_no_error_estimate_gives_no_interval() -> None:
    data = ln_capacities(10, 0.05, np.random.default_rng(2))
    for row in data.values():
        row.pop("F", None)
    effects = intrablock_effects(FACTORS, CELLS, data, "standard", 0.9, True)
    # Every contrast holding F is gone; those without it remain.
    assert {(e.kind, e.levels) for e in effects} == {("main", ("16",)), ("interaction", ("16", "2"))}
    # Two arms per block over one unit: as many runs against A as arms, no residual.
    thin = ln_capacities(5, 0.05, np.random.default_rng(2), per_block=2)
    assert intrablock_fit("A", thin).df == 0
    assert all(e.lower is None and e.upper is None for e in intrablock_effects(FACTORS, CELLS, thin, "standard",
                                                                                0.9, True))
    # Blocks without the baseline add nothing.
    assert intrablock_effects(FACTORS, CELLS, {0: {"B": 1.0, "C": 2.0}}, "standard", 0.9, True) == []
