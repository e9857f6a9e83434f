"""Over-saturation early stop (issue 20 item 5): the pure decision on synthetic records."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.analysis.metrics import point_metrics
from orchestrator.analysis.saturation import MIN_FRACTION, certain_miss, past_capacity
from orchestrator.plan.catalog import ServiceClass
from orchestrator.records import RequestRecord

STRICT = ServiceClass(name="interactive", ttft_ms=300, tpot_ms=10)
LOOSE = ServiceClass(name="batch", ttft_ms=60_000, tpot_ms=1_000)
WINDOW_START, WINDOW = 10.0, 60.0


def _fifo(rate: float, service_s: float, tokens: int = 8) -> list[tuple[float, float, float]]:
    """A one-at-a-time server (capacity 1/service_s req/s) fed ``rate`` req/s for warm-up + window:
    (scheduled, first token, last token) of each request."""
    out, free = [], 0.0
    for t in np.arange(0.0, WINDOW_START + WINDOW, 1.0 / rate):
        start = max(float(t), free)
        free = start + service_s
        out.append((float(t), start + 0.01, start + 0.01 + 0.005 * (tokens - 1)))
    return out


def _as_of(events: list[tuple[float, float, float]], now: float, tokens: int = 8) -> list[RequestRecord]:
    """The records as the point loop sees them at ``now``."""
    recs = []
    for i, (sched, first, last) in enumerate(events):
        if sched > now:
            break
        r = RequestRecord(request_id=i, conversation_id=i, turn=0, scheduled_s=sched, sent_s=sched,
                          phase="measure" if sched >= WINDOW_START else "warmup", output_tokens_asked=tokens)
        if first <= now:
            r.first_token_s = first
        if last <= now:
            r.last_token_s, r.output_tokens, r.status = last, tokens, "ok"
        recs.append(r)
    return recs


def _n_window(events: list[tuple[float, float, float]]) -> int:
    return sum(1 for e in events if e[0] >= WINDOW_START)


def _ask(events, now, classes=(STRICT,), attainment=0.9):
    return past_capacity(_as_of(events, now), classes, attainment, WINDOW_START, WINDOW, _n_window(events), now)


def _times():
    return np.arange(WINDOW_START, WINDOW_START + WINDOW + 0.01, 0.25)


def test_fires_past_the_knee_soon_after_the_minimum():
    events = _fifo(rate=20.0, service_s=0.1)  # twice the server's capacity: the queue grows
    fired = [t for t in _times() if _ask(events, t) is not None]
    assert fired, "a point at twice capacity must stop early"
    first = fired[0]
    assert first >= WINDOW_START + MIN_FRACTION * WINDOW
    assert first < WINDOW_START + 0.5 * WINDOW  # well before the window's end: the saving
    stop = _ask(events, first)
    assert stop is not None and stop.at_s == pytest.approx(first - WINDOW_START)
    assert "past capacity" in stop.reason and "interactive" in stop.reason


def test_never_fires_below_the_knee():
    events = _fifo(rate=5.0, service_s=0.1)  # half capacity: every request met
    assert all(_ask(events, t) is None for t in _times())


def test_never_before_the_minimum_fraction():
    events = _fifo(rate=100.0, service_s=0.5)  # hopeless: almost everything misses at once
    early = [t for t in _times() if t < WINDOW_START + MIN_FRACTION * WINDOW]
    assert early and all(_ask(events, t) is None for t in early)
    assert _ask(events, WINDOW_START + MIN_FRACTION * WINDOW) is not None


def test_needs_every_class_to_fail():
    events = _fifo(rate=20.0, service_s=0.1)
    # the loose class still meets everything within its minute-long TTFT limit
    assert all(_ask(events, t, classes=(STRICT, LOOSE)) is None for t in _times())


def test_cannot_fire_on_a_point_that_passes():
    """Random final outcomes at or above the bar, checked at every moment: never a stop (the
    rule counts only misses already certain, against the whole window's count)."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        n = int(rng.integers(20, 200))
        sched = np.sort(rng.uniform(WINDOW_START, WINDOW_START + WINDOW, n))
        miss = rng.random(n) < 0.1 * rng.random()  # attainment in (0.9, 1] mostly
        waits = np.where(miss, rng.uniform(0.31, 5.0, n), rng.uniform(0.0, 0.29, n))
        events = [(float(s), float(s + w), float(s + w + 0.035)) for s, w in zip(sched, waits, strict=True)]
        final = _as_of(events, 1e9)
        att = point_metrics(final, [STRICT], window_s=WINDOW, n_scheduled=n).per_class["interactive"].attainment
        if att < 0.9:
            continue
        assert all(_ask(events, t) is None for t in _times())


def test_a_stopped_point_is_below_the_bar_over_what_it_judged():
    events = _fifo(rate=20.0, service_s=0.1)
    t = next(t for t in _times() if _ask(events, t) is not None)
    judged = [r for r in _as_of(events, t) if r.phase == "measure"]
    for r in judged:  # in flight at the stop: cancelled, a miss
        if r.status == "unsent":
            r.status = "cancelled"
    att = point_metrics(judged, [STRICT], n_scheduled=len(judged)).per_class["interactive"].attainment
    assert att < 0.9


def test_certain_miss_is_only_what_cannot_recover():
    r = RequestRecord(request_id=0, conversation_id=0, turn=0, phase="measure", scheduled_s=0.0, sent_s=0.0,
                      output_tokens_asked=4)
    assert not certain_miss(r, STRICT, 0.29)  # could still get its first token in time
    assert certain_miss(r, STRICT, 0.31)  # past the TTFT limit with no token
    r.first_token_s = 0.1
    assert not certain_miss(r, STRICT, 5.0)  # streaming, TTFT met: TPOT unknown yet
    r.status = "timeout"
    assert certain_miss(r, STRICT, 0.2)


def _bench():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "search_bench.py"
    spec = importlib.util.spec_from_file_location("search_bench", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_early_stop_saves_points_on_a_curve_past_its_knee():
    """Issue 20's Done-when: the same search (virtual time) on a range reaching far past the
    knee costs fewer point-seconds with the early stop, and finds the same capacity."""
    bench = _bench()
    windows = bench.Windows(5.0, 20.0, 1.0)
    cluster = bench.cluster_of()
    full, s_full, _ = bench.search(cluster, 64.0, 1, False, windows)
    early, s_early, log = bench.search(cluster, 64.0, 1, True, windows)
    assert any("stopped early" in line for line in log)
    assert s_early < s_full
    assert early.capacity == pytest.approx(full.capacity) and early.at_rate == full.at_rate
    assert [p.passed for p in early.points] == [p.passed for p in full.points]


def test_the_incremental_watch_answers_like_the_fresh_question():
    """The point loop's SaturationWatch (asked every tick over records updated in place) says
    what past_capacity says from scratch, at every moment."""
    from orchestrator.analysis.saturation import SaturationWatch

    for rate in (5.0, 11.0, 20.0):
        events = _fifo(rate=rate, service_s=0.1)
        live = _as_of(events, 1e9)  # one object per request, rewound and replayed in place
        final = [(r.first_token_s, r.last_token_s, r.output_tokens, r.status) for r in live]
        watch = SaturationWatch([STRICT], 0.9, WINDOW_START, WINDOW, _n_window(events))
        for t in _times():
            for r, (first, last, toks, status) in zip(live, final, strict=True):
                done = last is not None and last <= t
                r.first_token_s = first if first is not None and first <= t else None
                r.last_token_s, r.output_tokens, r.status = (last, toks, status) if done else (None, None, "unsent")
            fresh, kept = _ask(events, t), watch(live, t)
            assert (fresh is None) == (kept is None), (rate, t)


def test_the_setting_keeps_earlier_plans_hashes():
    from orchestrator.plan import canonical_json, plan_from_canonical, plan_hash
    from tests.e2e.helpers import BASE, small_plan

    default = small_plan()
    assert default.search.early_stop is False  # opt-in: a stop cancels streams a stall guard reads
    assert "early_stop" not in canonical_json(default)  # left out at its default: hashes unchanged
    assert plan_hash(small_plan(search={**BASE["search"], "early_stop": False})) == plan_hash(default)
    on = small_plan(search={**BASE["search"], "early_stop": True})
    assert '"early_stop":true' in canonical_json(on) and plan_hash(on) != plan_hash(default)
    assert plan_from_canonical(canonical_json(on)).search.early_stop is True
