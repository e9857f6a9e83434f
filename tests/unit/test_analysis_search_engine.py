"""Issue #6's target held against the virtual-time engine (not a synthetic curve): the capacity
search finds the engine's capacity within 2% in <= 8 points without a prior and <= 5 with a
good one. Figures print with ``pytest -s``."""

from __future__ import annotations

import functools

import pytest

from orchestrator.analysis.metrics import point_metrics
from orchestrator.analysis.search import CapacitySearch
from orchestrator.loadgen.schedules import open_loop_offsets
from orchestrator.loadgen.workloads import build_requests
from orchestrator.plan import MODELS, SERVICE_CLASSES, EngineConfig, OpenLoop, Workload, gpu
from orchestrator.sim.engine import ClusterSpec, Windows, simulate_open_loop
from orchestrator.sim.model import WorkerModel

WORKLOAD = Workload.model_validate({"prompts": {"input_tokens": {"mean": 400}, "conversations": 1000},
                                    "output_tokens": 32})
CLUSTER = ClusterSpec(workers=(WorkerModel.from_engine(
    gpu("H200"), MODELS["qwen3-8b"], 1, EngineConfig(max_num_seqs=64, max_num_batched_tokens=2048)),))
STANDARD = SERVICE_CLASSES["standard"]
WINDOWS = Windows(warmup_s=2.0, measure_s=10.0, cooldown_s=1.0)
RATE_MIN, RATE_MAX = 1.0, 256.0


@functools.cache
def measure(rate: float) -> tuple[float, float]:
    """(attainment, goodput) of one virtual point; the same seed at every rate, so the
    engine's attainment is a fixed function of the rate."""
    offsets = open_loop_offsets(OpenLoop(), rate, WINDOWS.total_s, seed=5)
    requests = build_requests(WORKLOAD, len(offsets), seed=5)
    res = simulate_open_loop(CLUSTER, requests, offsets, WINDOWS, drain_s=10.0, seed=5)
    n = sum(1 for t in offsets if WINDOWS.warmup_s <= t < WINDOWS.warmup_s + WINDOWS.measure_s)
    c = point_metrics(res.records, [STANDARD], window_s=WINDOWS.measure_s, n_scheduled=n).per_class["standard"]
    return c.attainment, c.goodput_tok_s


def run(search: CapacitySearch) -> CapacitySearch:
    while (rate := search.next_rate()) is not None:
        search.observe(rate, *measure(rate))
    return search


@pytest.fixture(scope="module")
def truth():
    """The engine's capacity, from a search 10x finer with many points."""
    res = run(CapacitySearch(RATE_MIN, RATE_MAX, precision=0.002, max_points=40)).result()
    assert res.converged and res.capacity > 0
    return res


def test_without_prior_within_2pct_in_at_most_8_points(truth) -> None:
    res = run(CapacitySearch(RATE_MIN, RATE_MAX, precision=0.02, max_points=12)).result()
    err = abs(res.capacity / truth.capacity - 1)
    print(f"\nengine capacity {truth.capacity:.0f} tok/s at {truth.at_rate:.2f} req/s; "
          f"no prior: {res.capacity:.0f} tok/s ({err:.2%}) in {res.points_used} points")
    assert err <= 0.02
    assert res.points_used <= 8


def test_good_prior_within_2pct_in_at_most_5_points(truth) -> None:
    for off in (0.97, 1.0, 1.04):
        prior = truth.at_rate * off
        res = run(CapacitySearch(RATE_MIN, RATE_MAX, precision=0.02, max_points=12, prior=prior)).result()
        err = abs(res.capacity / truth.capacity - 1)
        print(f"prior {prior:.2f} req/s: {res.capacity:.0f} tok/s ({err:.2%}) in {res.points_used} points")
        assert err <= 0.02
        assert res.points_used <= 5
