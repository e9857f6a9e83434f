"""Point metrics and validity guards: each guard fails on the fault it exists for and passes
on clean records."""

from __future__ import annotations

import dataclasses
import math

import pytest

from orchestrator.analysis.guards import (
    PointContext,
    RunEnvironment,
    back_to_back,
    censored_tails,
    frozen_randomness,
    generator_ceiling,
    generator_lag,
    generator_rate,
    output_limit,
    prefix_hit_rate,
    repeated_prompts,
    run_guards,
    stalls,
    steady_state,
)
from orchestrator.analysis.metrics import point_metrics
from orchestrator.plan import SERVICE_CLASSES, GuardThresholds
from orchestrator.records import RequestRecord

TH = GuardThresholds()
STD = SERVICE_CLASSES["standard"]  # 1 s TTFT, 50 ms TPOT
INTER = SERVICE_CLASSES["interactive"]  # 300 ms, 10 ms


def rec(i: int, ttft: float = 0.2, tpot: float = 0.02, out: int = 100, rate: float = 10.0,
        **kw: object) -> RequestRecord:
    """A clean finished request scheduled at i / rate."""
    t = i / rate
    base = dict(
        request_id=i, conversation_id=i, turn=0, phase="measure", scheduled_s=t, sent_s=t + 0.001,
        first_token_s=t + ttft, last_token_s=t + ttft + tpot * (out - 1), prompt_tokens=500,
        output_tokens_asked=out, output_tokens=out, cached_tokens=250, chunks=out, max_gap_s=tpot * 2,
        status="ok", prompt_hash=f"p{i}", output_hash=f"o{i}",
    )
    base.update(kw)
    return RequestRecord(**base)  # type: ignore[arg-type]


def clean(n: int = 100) -> list[RequestRecord]:
    return [rec(i) for i in range(n)]


# --- metrics --------------------------------------------------------------------------------


def test_point_metrics_clean() -> None:
    m = point_metrics(clean(), [STD, INTER], window_s=10.0)
    assert m.n_scheduled == 100 and m.offered_rate == pytest.approx(10.0)
    assert m.per_class["standard"].attainment == 1.0
    assert m.per_class["standard"].goodput_tok_s == pytest.approx(100 * 100 / 10.0)
    assert m.per_class["interactive"].attainment == 0.0  # TPOT 20 ms > 10 ms
    assert m.per_class["interactive"].misses["tpot"] == 100
    assert m.throughput_tok_s == pytest.approx(1000.0)
    assert m.ttft_s[50] == pytest.approx(0.2)
    assert m.achieved_rate == pytest.approx(10.0)


def test_misses_by_cause_sum_and_warmup_is_ignored() -> None:
    recs = clean(10)
    recs[0] = rec(0, status="http_error", last_token_s=None, first_token_s=None)
    recs[1] = rec(1, status="timeout", last_token_s=None)
    recs[2] = rec(2, output_tokens=90)
    recs[3] = rec(3, ttft=2.0)
    recs[4] = rec(4, tpot=0.08)
    recs.append(rec(99, phase="warmup", ttft=50.0))
    m = point_metrics(recs, [STD], window_s=1.0, n_scheduled=11)  # one scheduled, never recorded
    c = m.per_class["standard"]
    assert c.misses == {"error": 1, "unfinished": 2, "wrong_tokens": 1, "ttft": 1, "tpot": 1}
    assert c.kept == 5 and c.attainment == pytest.approx(5 / 11)
    assert sum(c.misses.values()) == m.n_scheduled - c.kept


def test_unfinished_count_as_infinite_latency() -> None:
    recs = clean(10)
    for i in range(2):  # 20% never finish
        recs[i] = rec(i, status="timeout", first_token_s=None, last_token_s=None)
    m = point_metrics(recs, [STD], window_s=1.0)
    assert math.isinf(m.ttft_s[90]) and math.isinf(m.e2e_s[90]) and math.isinf(m.tpot_s[99])
    assert m.ttft_s[50] == pytest.approx(0.2)
    assert m.to_dict()["ttft_s"]["p99"] is None  # type: ignore[index]


# --- guards: pass on clean, fail on their fault --------------------------------------------


def test_clean_records_pass_every_guard() -> None:
    ctx = PointContext(n_scheduled=100, window_s=10.0, expected_prefix_hit_rate=0.5,
                       server_prefix_hit_rate=0.55, generator_ceiling_rate=50.0, service_class=STD)
    results = run_guards(clean(), TH, ctx)
    assert all(g.passed for g in results), [g for g in results if not g.passed]
    assert len({g.name for g in results}) == 12


def test_generator_lag_fails_when_late() -> None:
    assert generator_lag(clean(), TH).passed
    late = [rec(i, sent_s=i / 10 + 0.02) for i in range(100)]  # 20 ms late
    g = generator_lag(late, TH)
    assert not g.passed and g.value == pytest.approx(20.0)


def test_generator_rate_fails_on_shortfall() -> None:
    assert generator_rate(clean(), TH, 10.0).passed
    slow = [rec(i, sent_s=i / 10 * 1.5) for i in range(100)]  # the seed's 1.5x distortion
    g = generator_rate(slow, TH, 10.0)
    assert not g.passed and g.value == pytest.approx(1 / 3, abs=0.02)


def test_generator_ceiling() -> None:
    assert generator_ceiling(10.0, 50.0).passed
    assert not generator_ceiling(60.0, 50.0).passed


def test_repeated_prompts_fail_on_duplicates() -> None:
    assert repeated_prompts(clean(), TH).passed
    dup = [rec(i, prompt_hash=f"p{i % 17}") for i in range(100)]
    g = repeated_prompts(dup, TH)
    assert not g.passed and g.value == 83


def test_prefix_hit_rate_fails_above_expectation() -> None:
    assert prefix_hit_rate(clean(), TH, expected=0.5, server=0.6).passed
    g = prefix_hit_rate(clean(), TH, expected=0.5, server=0.9)  # repeats flatter the cache
    assert not g.passed and g.threshold == pytest.approx(0.65)
    from_records = prefix_hit_rate([rec(i, cached_tokens=480) for i in range(10)], TH, 0.5, None)
    assert not from_records.passed and from_records.value == pytest.approx(0.96)


def test_output_limit_fails_on_ignored_max_tokens() -> None:
    assert output_limit(clean(), TH).passed
    g = output_limit([rec(i, output_tokens=400) for i in range(10)], TH)  # the seed's 4x
    assert not g.passed and g.value == 1.0


def test_censored_tails_fail_when_records_are_missing() -> None:
    assert censored_tails(clean(), 100).passed
    g = censored_tails(clean(90), 100)
    assert not g.passed and g.value == 10


def test_frozen_randomness_fails_on_identical_outputs() -> None:
    assert frozen_randomness(clean(), TH).passed
    g = frozen_randomness([rec(i, output_hash="same") for i in range(10)], TH)
    assert not g.passed and g.value == 1.0


def test_stalls_fail_on_long_gaps() -> None:
    assert stalls(clean(), TH).passed
    recs = [rec(i, max_gap_s=0.8 if i % 10 == 0 else 0.04) for i in range(100)]
    g = stalls(recs, TH)
    assert not g.passed and g.value == pytest.approx(0.1)


def test_steady_state_fails_on_warmup_contamination() -> None:
    assert steady_state(clean(), TH, STD, 10.0).passed
    # The first third slow (cold caches, warm-up not excluded), later requests fine.
    recs = [rec(i, ttft=1.5 if i < 33 else 0.2) for i in range(100)]
    g = steady_state(recs, TH, STD, 10.0)
    assert not g.passed and g.value is not None and g.value > 0.9


def test_steady_state_ignores_poisson_unevenness_of_arrivals() -> None:
    # 20 arrivals in the first third, 10 in the last, every request served within its class:
    # raw tokens/s differ by half, the server's behaviour does not.
    times = [i * (10 / 3) / 20 for i in range(20)] + [5.0] + [20 / 3 + i * (10 / 3) / 10 for i in range(10)]
    recs = [rec(i, scheduled_s=t, sent_s=t, first_token_s=t + 0.2, last_token_s=t + 0.2 + 0.02 * 99)
            for i, t in enumerate(times)]
    g = steady_state(recs, TH, STD, 10.0)
    assert g.passed, g.detail


def test_steady_state_allows_sampling_noise_of_a_short_point() -> None:
    # Thirds of four requests each; one slow request in the first third is noise, not drift.
    recs = [rec(i, rate=1.2, ttft=2.0 if i == 0 else 0.2) for i in range(12)]
    g = steady_state(recs, TH, STD, 10.0)
    assert g.passed, g.detail


def test_steady_state_accepts_a_point_overloaded_from_the_start() -> None:
    # Every request misses in both thirds, but the first third is still fully served.
    recs = [rec(i, ttft=3.0 + (0.0 if i < 50 else 0.1 * i)) for i in range(100)]
    recs = [r if i < 50 else dataclasses.replace(r, status="cancelled", last_token_s=None)
            for i, r in enumerate(recs)]
    g = steady_state(recs, TH, STD, 10.0)
    assert g.passed and "overloaded" in g.detail, g.detail


def test_steady_state_explains_a_worse_third_by_an_arrival_burst() -> None:
    # 12 arrivals crowd the first third and miss; 4 in the last third are served in time.
    times = [i * 0.25 for i in range(12)] + [7.0 + i * 0.8 for i in range(4)]
    recs = [rec(i, scheduled_s=t, sent_s=t, first_token_s=t + (2.0 if t < 3.4 else 0.2),
                last_token_s=t + (2.0 if t < 3.4 else 0.2) + 0.02 * 99) for i, t in enumerate(times)]
    g = steady_state(recs, TH, STD, 10.0)
    assert g.passed and "burst" in g.detail, g.detail
    # The same contrast with equal arrivals is drift: it fails.
    times = [i * (10 / 3) / 8 for i in range(8)] + [20 / 3 + i * (10 / 3) / 8 for i in range(8)]
    recs = [rec(i, scheduled_s=t, sent_s=t, first_token_s=t + (2.0 if t < 3.4 else 0.2),
                last_token_s=t + (2.0 if t < 3.4 else 0.2) + 0.02 * 99) for i, t in enumerate(times)]
    assert not steady_state(recs, TH, STD, 10.0).passed


def test_steady_state_accepts_an_overloaded_point_as_a_valid_fail() -> None:
    recs = [rec(i, ttft=0.2 + 0.05 * i) for i in range(100)]  # the queue grows
    g = steady_state(recs, TH, STD, 10.0)
    assert g.passed and "overloaded" in g.detail


def test_back_to_back() -> None:
    a = RunEnvironment("A", "H200", "0.9.1", "pool-1", 0.0, 3600.0, "s1")
    b = dataclasses.replace(a, arm="B", started_s=3600.0, ended_s=7200.0)
    assert back_to_back([a, b], window_h=24).passed
    g = back_to_back([a, dataclasses.replace(b, gpu_type="H100")], window_h=24)
    assert not g.passed and "gpu_type" in g.detail
    assert not back_to_back([a, dataclasses.replace(b, engine_version="0.10.0")], 24).passed
    assert not back_to_back([a, dataclasses.replace(b, node_pool="pool-2")], 24).passed
    assert not back_to_back([a, b], window_h=1.5).passed


def test_run_guards_flags_the_fault() -> None:
    recs = [rec(i, output_tokens=400) for i in range(100)]
    results = run_guards(recs, TH, PointContext(n_scheduled=100, window_s=10.0))
    failed = {g.name for g in results if not g.passed}
    assert failed == {"output_limit"}
    assert not all(g.passed for g in results)


def test_simulator_timing_fails_a_starved_simulator_and_ignores_real_engines() -> None:
    from orchestrator.analysis.guards import simulator_timing

    th = GuardThresholds()
    assert simulator_timing(0.025, th).passed
    late = simulator_timing(0.1, th)
    assert not late.passed and late.value == pytest.approx(100.0) and late.threshold == 50.0
    assert simulator_timing(None, th).passed  # a real engine exports no such histogram
    assert not simulator_timing(0.006, GuardThresholds(max_sim_lateness_p99_ms=5)).passed


def test_sim_lateness_p99_from_the_servers_histograms() -> None:
    from orchestrator.control.points import SIM_LATENESS, sim_lateness_p99
    from orchestrator.loadgen.scrape import Sample

    def hist(counts: dict[str, float], server: str) -> list[Sample]:
        return [Sample(SIM_LATENESS + "_bucket", {"le": le, "engine": server}, v) for le, v in counts.items()]

    before = hist({"0.001": 10, "0.01": 10, "+Inf": 10}, "a") + hist({"0.001": 0, "0.01": 0, "+Inf": 0}, "b")
    # over the point: 200 steps, 196 within 1 ms, 3 within 10 ms, 1 beyond
    after = hist({"0.001": 110, "0.01": 112, "+Inf": 113}, "a") + hist({"0.001": 96, "0.01": 97, "+Inf": 97}, "b")
    assert sim_lateness_p99(before, after) == 0.01
    assert sim_lateness_p99([], []) is None
