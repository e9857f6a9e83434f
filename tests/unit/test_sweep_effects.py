"""The arithmetic of a sweep's effects (analysis.effects): contrasts within blocks, so a block
effect cancels; main effects and interactions recovered from a known model; intervals that
cover at their confidence."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from orchestrator.analysis.effects import contrast_interval, intrablock_effects, sweep_effects

FACTORS = {"engine.max_num_seqs": ["4", "16", "64"], "replicas": ["1", "2"]}
CELLS = dict(zip("ABCDEF", itertools.product(range(3), range(2)), strict=True))
MAIN_F = [0.0, 0.5, 0.2]  # ln effect of each level of the first factor
MAIN_G = [0.0, 0.7]
INTER = {(1, 1): 0.1, (2, 1): -0.2}  # ln interaction of (F level, G level); 0 elsewhere


def ln_capacities(blocks: int, sigma: float, rng: np.random.Generator) -> dict[int, dict[str, float]]:
    """ln C_bk = block effect + the cell's effects + noise: the model the contrasts assume."""
    out = {}
    for b in range(blocks):
        beta = rng.normal(6.0, 1.0)  # a large block effect: it must cancel
        out[b] = {arm: beta + MAIN_F[i] + MAIN_G[j] + INTER.get((i, j), 0.0) + rng.normal(0, sigma)
                  for arm, (i, j) in CELLS.items()}
    return out


def _truth() -> dict[tuple[str, tuple[str, ...]], float]:
    """The model's effects as the estimator defines them: a main effect averages the cells of a
    level over the other factor's levels; an interaction is a ratio of ratios."""
    cell = {(i, j): MAIN_F[i] + MAIN_G[j] + INTER.get((i, j), 0.0) for i in range(3) for j in range(2)}
    out = {}
    for i in (1, 2):
        out[("main", ("16", "64")[i - 1:i])] = math.exp(np.mean([cell[(i, j)] - cell[(0, j)] for j in range(2)]))
        out[("interaction", (("16", "64")[i - 1], "2"))] = math.exp(cell[(i, 1)] - cell[(i, 0)] - cell[(0, 1)] + cell[(0, 0)])
    out[("main", ("2",))] = math.exp(np.mean([cell[(i, 1)] - cell[(i, 0)] for i in range(3)]))
    return out


def test_without_noise_every_effect_is_the_models_and_the_block_effect_cancels() -> None:
    effects = sweep_effects(FACTORS, CELLS, ln_capacities(4, 0.0, np.random.default_rng(1)), "standard", 0.95,
                            interactions=True)
    got = {(e.kind, e.levels): e for e in effects}
    truth = _truth()
    assert set(got) == set(truth)
    for key, ratio in truth.items():
        e = got[key]
        assert e.ratio == pytest.approx(ratio, rel=1e-9)
        # Identical blocks are not certainty: the spread is floored, so the interval has width.
        assert e.lower is not None and e.upper is not None and e.lower < e.ratio < e.upper
        assert e.blocks == 4 and e.reference == tuple(FACTORS[f][0] for f in e.factors)
    assert got[("main", ("2",))].label == "replicas 2 vs 1"
    assert got[("interaction", ("64", "2"))].label == "engine.max_num_seqs 64 vs 4 x replicas 2 vs 1"


def test_a_block_missing_an_arm_is_left_out_and_a_fraction_has_no_interactions() -> None:
    data = ln_capacities(3, 0.0, np.random.default_rng(2))
    del data[1]["D"]
    effects = sweep_effects(FACTORS, CELLS, data, "standard", 0.9, interactions=False)
    assert {e.kind for e in effects} == {"main"} and {e.blocks for e in effects} == {2}
    one = sweep_effects(FACTORS, CELLS, {0: data[0]}, "standard", 0.9, interactions=False)
    assert all(e.lower is None and e.upper is None for e in one)  # one block: no interval
    assert one[0].to_dict()["lower"] is None and one[0].to_dict()["blocks"] == 1


def test_the_intervals_cover_the_models_effects_at_their_confidence() -> None:
    rng = np.random.default_rng(7)
    truth = _truth()
    trials, covered = 400, dict.fromkeys(truth, 0)
    for _ in range(trials):
        for e in sweep_effects(FACTORS, CELLS, ln_capacities(5, 0.08, rng), "standard", 0.9, interactions=True):
            assert e.lower is not None and e.upper is not None
            covered[(e.kind, e.levels)] += e.lower <= truth[(e.kind, e.levels)] <= e.upper
    for key, n in covered.items():  # 90% two-sided; binomial sd over 400 trials is 1.5 points
        assert 0.85 <= n / trials <= 0.95, (key, n / trials)


def test_a_contrast_interval_is_students_t_over_blocks() -> None:
    d = [0.1, 0.3, 0.2, 0.4]
    ratio, lo, hi = contrast_interval(d, 0.95)
    half = 3.182446305284263 * float(np.std(d, ddof=1)) / 2  # t(0.975, 3) x sd / sqrt(4)
    assert ratio == pytest.approx(math.exp(0.25)) and lo == pytest.approx(math.exp(0.25 - half))
    assert hi == pytest.approx(math.exp(0.25 + half))


@pytest.mark.parametrize("estimate", [sweep_effects, intrablock_effects])
def test_a_cells_search_error_does_not_average_away_and_the_resolution_covers_it(estimate) -> None:
    """Each cell of replicas 1 found 2% low in every block (a search's bracket is 2% wide, and
    the same curve bends the same way each time): 20 quiet blocks make the interval narrower than
    that error, so without the resolution it misses the truth; with ln(1.02) on each end (once
    for a main effect, twice for an interaction) it covers every effect."""
    rng = np.random.default_rng(11)
    r = math.log(1.02)
    data = {b: {arm: v - (r if CELLS[arm][1] == 0 else 0.0) for arm, v in row.items()}
            for b, row in ln_capacities(20, 0.002, rng).items()}
    truth = _truth()
    bare = {(e.kind, e.levels): e for e in estimate(FACTORS, CELLS, data, "standard", 0.9, interactions=True)}
    main = bare[("main", ("2",))]
    assert main.lower is not None and main.lower > truth[("main", ("2",))]  # the error decides it
    wide = estimate(FACTORS, CELLS, data, "standard", 0.9, interactions=True, resolution=r)
    for e in wide:
        assert e.lower is not None and e.upper is not None
        assert e.lower <= truth[(e.kind, e.levels)] <= e.upper, e
        k = 1 if e.kind == "main" else 2
        b = bare[(e.kind, e.levels)]
        assert b.lower is not None and b.upper is not None
        assert math.log(b.lower / e.lower) == pytest.approx(k * r) and math.log(e.upper / b.upper) == pytest.approx(k * r)
