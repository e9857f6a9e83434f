"""Arrival schedules: seeded, absolute, the right process and rate."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from orchestrator.loadgen.schedules import (
    derive_seed,
    open_loop_offsets,
    phase_at,
    point_phases,
    split_shards,
)
from orchestrator.plan import OpenLoop


def test_poisson_offsets_are_seeded_sorted_and_bounded():
    a = open_loop_offsets(OpenLoop(), 50.0, 40.0, seed=1)
    b = open_loop_offsets(OpenLoop(), 50.0, 40.0, seed=1)
    c = open_loop_offsets(OpenLoop(), 50.0, 40.0, seed=2)
    assert np.array_equal(a, b)
    assert not np.array_equal(a[:10], c[:10])
    assert np.all(np.diff(a) >= 0)
    assert a[0] >= 0 and a[-1] < 40.0


def test_poisson_gaps_are_exponential_at_the_rate():
    rate = 200.0
    offsets = open_loop_offsets(OpenLoop(process="poisson"), rate, 50.0, seed=3)
    assert abs(len(offsets) / 50.0 - rate) / rate < 0.03
    gaps = np.diff(offsets)
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 0.01


def test_gamma_burstiness_raises_the_spread_not_the_rate():
    rate = 100.0
    smooth = np.diff(open_loop_offsets(OpenLoop(process="gamma", burstiness=4.0), rate, 100.0, seed=4))
    bursty = np.diff(open_loop_offsets(OpenLoop(process="gamma", burstiness=0.25), rate, 100.0, seed=4))
    for gaps in (smooth, bursty):
        assert abs(gaps.mean() - 1 / rate) / (1 / rate) < 0.1
    # coefficient of variation of gamma gaps = 1/sqrt(shape)
    assert smooth.std() / smooth.mean() == pytest.approx(0.5, rel=0.1)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.15)


def test_constant_is_evenly_spaced_from_zero():
    offsets = open_loop_offsets(OpenLoop(process="constant"), 4.0, 2.0, seed=0)
    assert np.allclose(offsets, [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75])


def test_bad_rate_is_refused():
    with pytest.raises(ValueError):
        open_loop_offsets(OpenLoop(), 0.0, 1.0, seed=0)


def test_phases_cover_warmup_measure_cooldown():
    phases = point_phases([0.0, 0.9, 1.0, 2.5, 3.0, 3.5], warmup_s=1.0, measure_s=2.0)
    assert phases == ["warmup", "warmup", "measure", "measure", "cooldown", "cooldown"]
    assert phase_at(2.99, 1.0, 2.0) == "measure"


def test_derive_seed_is_stable_and_distinct_per_block():
    assert derive_seed(7, "block", 0) == derive_seed(7, "block", 0)
    assert derive_seed(7, "block", 0) != derive_seed(7, "block", 1)
    assert 0 <= derive_seed(7, "x") < 2**63


def test_shards_split_every_request_once():
    parts = split_shards(10, 3)
    assert sorted(i for p in parts for i in p) == list(range(10))
    assert parts[0] == [0, 3, 6, 9]
