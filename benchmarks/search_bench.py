"""Capacity-search cost with and without the over-saturation early stop (issue 20 item 5).

Virtual time (the simulated engine, orchestrator/sim/engine): one H200 replica of qwen3-8b,
2,000-token prompts and 256-token replies, the standard class, a plan's default point (30 s
warm-up, 120 s window, 5 s cool-down). The same capacity search (bracket then bisect) runs
twice over a rate range that reaches far past the knee:

- full points: every point runs to its end (plus the drain of the requests still in flight,
  capped at the plan's drain);
- early stop: each point is replayed as the point loop sees it, every 0.25 s of its clock
  (records as of that moment: tokens not yet arrived are not known), asking
  orchestrator.analysis.saturation.past_capacity; on a stop, nothing more is sent, the requests
  in flight run on to their end (at most the plan's drain: as the point loop lets them, so the
  guards judge their streams) and are judged as they end, the unsent ones are not judged, and
  the point costs the seconds up to the stop plus that drain. The in-flight requests' ends are
  taken from the full point (where later sends still compete with them): an upper bound.

Printed: points, point-seconds (GPU time the search holds the arm) each way, the ratio, and both
capacities (they must agree: a stopped point is a failing point either way).

Run: .venv/bin/python benchmarks/search_bench.py [--max-rate 64] [--seed 1]

Measured on the build machine (defaults): full points 7 points, 1185 point-seconds; early stop
the same 7 points (3 of them stopped, their in-flight requests drained: 103, 89 and 77 s instead
of ~157), 898 point-seconds: ratio 0.758 (24.2 % saved); the same capacity, 3298.1 tok/s at
12.88 req/s. (Cancelling in-flight requests at the stop saved 30.2 %, and hid a stalling
server from the stalls guard.)
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from orchestrator.analysis.metrics import point_metrics
from orchestrator.analysis.saturation import past_capacity
from orchestrator.analysis.search import CapacityResult, CapacitySearch
from orchestrator.loadgen.schedules import open_loop_offsets
from orchestrator.loadgen.workloads import build_requests
from orchestrator.plan import MODELS, SERVICE_CLASSES, EngineConfig, OpenLoop, Workload, gpu
from orchestrator.records import RequestRecord
from orchestrator.sim.engine import ClusterSpec, Windows, simulate_open_loop
from orchestrator.sim.model import WorkerModel

WORKLOAD = Workload.model_validate({"prompts": {"input_tokens": {"mean": 2000}, "conversations": 100000},
                                    "output_tokens": 256})
STANDARD = SERVICE_CLASSES["standard"]
WINDOWS = Windows(30.0, 120.0, 5.0)
ATTAINMENT = 0.90
DRAIN_S = 60.0
CHECK_S = 0.25


def as_of(records: list[RequestRecord], now: float) -> list[RequestRecord]:
    """The records as the point loop sees them at ``now`` (later events not yet known)."""
    out = []
    for r in records:
        if r.scheduled_s > now:
            continue
        seen = dataclasses.replace(r)
        if r.sent_s is not None and r.sent_s > now:
            seen.sent_s = None
        if r.first_token_s is not None and r.first_token_s > now:
            seen.first_token_s = None
        end = r.last_token_s if r.last_token_s is not None else r.first_token_s
        if end is None or end > now:  # not over yet: still in flight (an error is known when it ends)
            seen.last_token_s, seen.output_tokens, seen.status = None, None, "unsent"
        out.append(seen)
    return out


def cost_and_attainment(records: list[RequestRecord], t0: float, early: bool,
                        windows: Windows = WINDOWS) -> tuple[float, float, float, bool]:
    """(point-seconds, attainment, goodput, stopped) of one point, with or without early stop."""
    n_window = sum(1 for r in records if r.phase == "measure")
    start = t0 + windows.warmup_s
    if early:
        for now in np.arange(t0 + CHECK_S, t0 + windows.total_s, CHECK_S):
            seen = as_of(records, float(now))
            if past_capacity(seen, [STANDARD], ATTAINMENT, start, windows.measure_s, n_window, float(now)):
                judged = [r for r in records if r.scheduled_s <= now]  # as they end: in flight runs on
                ends = [r.last_token_s or r.first_token_s or float(now) for r in judged]
                drained = min(max(float(now), max(ends, default=float(now))), float(now) + DRAIN_S)
                for r, end in zip(judged, ends, strict=True):
                    if end > drained:
                        r.status = "cancelled"  # still in flight after the drain: cancelled, a miss
                window = min(windows.measure_s, float(now) - start)
                n = sum(1 for r in judged if r.phase == "measure")
                m = point_metrics(judged, [STANDARD], window_s=window, n_scheduled=n).per_class["standard"]
                return drained - t0, m.attainment, m.goodput_tok_s, True
    ends = [r.last_token_s or r.first_token_s or r.scheduled_s for r in records]
    tail = min(DRAIN_S, max(0.0, max(ends, default=t0) - (t0 + windows.total_s)))
    m = point_metrics(records, [STANDARD], window_s=windows.measure_s, n_scheduled=n_window).per_class["standard"]
    return windows.total_s + tail, m.attainment, m.goodput_tok_s, False


def search(cluster: ClusterSpec, max_rate: float, seed: int, early: bool,
           windows: Windows = WINDOWS) -> tuple[CapacityResult, float, list[str]]:
    """One capacity search: (result, point-seconds spent, a line per point)."""
    s = CapacitySearch(0.5, max_rate, precision=0.05, attainment=ATTAINMENT, max_points=12)
    spent, log = 0.0, []
    while (rate := s.next_rate()) is not None:
        offsets = open_loop_offsets(OpenLoop(), rate, windows.total_s, seed)
        requests = build_requests(WORKLOAD, len(offsets), seed)
        res = simulate_open_loop(cluster, requests, offsets, windows, drain_s=DRAIN_S, seed=seed)
        secs, att, good, stopped = cost_and_attainment(list(res.records), 0.0, early, windows)
        spent += secs
        s.observe(rate, att, good)
        log.append(f"{rate:8.3f} req/s  attainment {att:5.3f}  {secs:6.1f} s" + ("  (stopped early)" if stopped else ""))
    return s.result(), spent, log


def cluster_of(replicas: int = 1) -> ClusterSpec:
    w = WorkerModel.from_engine(gpu("H200"), MODELS["qwen3-8b"], 1, EngineConfig())
    return ClusterSpec(workers=(w,) * replicas, policy="round_robin")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-rate", type=float, default=64.0, help="search.rate.max (far past the knee)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    cluster = cluster_of()
    out = {}
    for early in (False, True):
        t = time.perf_counter()
        res, spent, log = search(cluster, args.max_rate, args.seed, early)
        out[early] = (res, spent)
        print(f"== {'early stop' if early else 'full points'} ({time.perf_counter() - t:.1f} s wall)")
        print("\n".join(log))
        print(f"   capacity {res.capacity:.1f} tok/s at {res.at_rate} req/s, {res.points_used} points, "
              f"{spent:.0f} point-seconds")
    (full, s_full), (early_res, s_early) = out[False], out[True]
    print(f"point-seconds: full {s_full:.0f}, early stop {s_early:.0f}; ratio {s_early / s_full:.3f} "
          f"(saves {1 - s_early / s_full:.1%}); capacity full {full.capacity:.1f} vs early {early_res.capacity:.1f} tok/s")


if __name__ == "__main__":
    main()
