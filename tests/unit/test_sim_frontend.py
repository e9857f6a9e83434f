"""The server's front end in the simulator (issue 21): a latency before the engine sees a
request, and front-end work that is served one request at a time and, on a CPU build, takes
the engine's own core while it steps."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.loadgen.workloads import RequestSpec
from orchestrator.plan import EngineConfig, ModelSpec
from orchestrator.sim.engine import ClusterSpec, Windows, simulate_open_loop
from orchestrator.sim.model import DeviceProfile

pytestmark = pytest.mark.unit

TINY = ModelSpec(name="tiny-llama", params=5.0e5, layers=2, kv_heads=4, head_dim=32, hidden_size=128)
CPU = DeviceProfile(name="cpu-fit", bandwidth_bytes_s=2.0e9, flops=5.0e10, step_overhead_s=1e-3,
                    kv_cache_bytes=2**30)
ENGINE = EngineConfig(max_num_seqs=16, max_num_batched_tokens=1024)


def req(i: int, prompt: int = 100, reply: int = 32) -> RequestSpec:
    return RequestSpec(i, i, 0, " ".join(f"r{i}w{j}" for j in range(prompt)), prompt, 0, reply, f"h{i}")


def run(profile: DeviceProfile, offsets: list[float], reply: int = 32):
    cluster = ClusterSpec(workers=(profile.worker(TINY, ENGINE),))
    return simulate_open_loop(cluster, [req(i, reply=reply) for i in range(len(offsets))], offsets,
                              Windows(0, 10, 0)).records


def test_profile_carries_the_front_end_terms_and_they_default_to_nothing() -> None:
    assert CPU.worker(TINY, ENGINE).frontend_latency_s == CPU.worker(TINY, ENGINE).frontend_cpu_s == 0.0
    w = CPU.model_copy(update={"frontend_latency_s": 5e-3, "frontend_cpu_s": 2e-4}).worker(TINY, ENGINE)
    assert (w.frontend_latency_s, w.frontend_cpu_s) == (5e-3, 2e-4)


def test_front_end_latency_adds_to_ttft_only() -> None:
    (plain,) = run(CPU, [0.0])
    (slow,) = run(CPU.model_copy(update={"frontend_latency_s": 5e-3}), [0.0])
    assert slow.ttft_s == pytest.approx(plain.ttft_s + 5e-3, rel=1e-9)
    assert slow.tpot_s == pytest.approx(plain.tpot_s, rel=1e-9)
    assert slow.sent_s == plain.sent_s == 0.0  # TTFT still counts from the scheduled send


def test_front_end_serves_a_burst_one_request_at_a_time() -> None:
    c = 2e-3
    recs = run(CPU.model_copy(update={"frontend_cpu_s": c}), [0.0] * 4)
    # The k-th request of a burst reaches the engine (k + 1) x c after the send; an engine with
    # room for all starts each prefill no earlier than that.
    plain = run(CPU, [0.0])[0].ttft_s
    for k, r in enumerate(recs):
        assert r.ttft_s >= (k + 1) * c + plain - 1e-12
    assert recs[3].ttft_s - recs[0].ttft_s >= 3 * c - 1e-12


def test_front_end_work_on_the_engine_core_slows_the_running_steps() -> None:
    # One long stream, then a train of short requests arriving while it decodes: with a front
    # end sharing the engine's core each arrival takes frontend_cpu_s from the running step.
    offsets = [0.0] + [0.01 + 0.004 * k for k in range(10)]
    shared = CPU.model_copy(update={"frontend_cpu_s": 1e-3})
    apart = replace(shared.worker(TINY, ENGINE), frontend_cpu_s=0.0, frontend_latency_s=1e-3)
    long_shared = run(shared, offsets, reply=200)[0]
    cluster = ClusterSpec(workers=(apart,))
    long_apart = simulate_open_loop(cluster, [req(i, reply=200) for i in range(len(offsets))], offsets,
                                    Windows(0, 10, 0)).records[0]
    # The same arrival times at the engine (1 ms late either way); only the shared core differs:
    # ten charges of 1 ms land on the long stream's steps (and, shifting the arrivals against
    # the steps, can change which steps mix in a prefill: more, never less).
    gap = (long_shared.last_token_s - long_shared.first_token_s) - (long_apart.last_token_s - long_apart.first_token_s)
    assert 10e-3 - 1e-9 <= gap < 20e-3
