"""Virtual-time speed of the simulated engine: simulated seconds per wall second.

For 1 and 4 H200 replicas of qwen3-8b (round robin), 2,000-token prompts and 256-token replies,
at 90% of the arm's measured capacity (standard class, found first by a capacity search on
short virtual points). Target (issue #4): >= 100x real time for 4 replicas on one core.
Prints medians of a few repeats. Run: .venv/bin/python benchmarks/sim_bench.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from orchestrator.analysis.metrics import point_metrics
from orchestrator.analysis.search import CapacitySearch
from orchestrator.loadgen.schedules import open_loop_offsets
from orchestrator.loadgen.workloads import build_requests
from orchestrator.plan import MODELS, SERVICE_CLASSES, EngineConfig, OpenLoop, Workload, gpu
from orchestrator.sim.engine import ClusterSpec, Windows, simulate_open_loop
from orchestrator.sim.model import WorkerModel

WORKLOAD = Workload.model_validate({"prompts": {"input_tokens": {"mean": 2000}, "conversations": 100000},
                                    "output_tokens": 256})
STANDARD = SERVICE_CLASSES["standard"]


def cluster(replicas: int) -> ClusterSpec:
    w = WorkerModel.from_engine(gpu("H200"), MODELS["qwen3-8b"], 1, EngineConfig())
    return ClusterSpec(workers=(w,) * replicas, policy="round_robin")


def point(c: ClusterSpec, rate: float, windows: Windows, seed: int = 1):
    offsets = open_loop_offsets(OpenLoop(), rate, windows.total_s, seed)
    requests = build_requests(WORKLOAD, len(offsets), seed)
    t = time.perf_counter()
    res = simulate_open_loop(c, requests, offsets, windows, drain_s=30.0, seed=seed)
    return res, time.perf_counter() - t


def capacity_rate(c: ClusterSpec) -> float:
    w = Windows(5.0, 20.0, 0.0)
    s = CapacitySearch(0.5, 256.0, precision=0.05, max_points=10)
    while (rate := s.next_rate()) is not None:
        res, _ = point(c, rate, w)
        m = point_metrics(res.records, [STANDARD], window_s=w.measure_s).per_class["standard"]
        s.observe(rate, m.attainment, m.goodput_tok_s)
    r = s.result()
    return r.at_rate or 0.5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60.0, help="virtual seconds per run")
    args = ap.parse_args()
    for replicas in (1, 4):
        c = cluster(replicas)
        cap = capacity_rate(c)
        rate = 0.9 * cap
        speeds = []
        for k in range(args.repeats):
            res, wall = point(c, rate, Windows(0.0, args.seconds, 0.0), seed=10 + k)
            speeds.append(res.end_s / wall)
        n = len(res.records)
        print(f"{replicas} x H200 qwen3-8b, capacity {cap:.2f} req/s, run at {rate:.2f} req/s "
              f"({n} requests, {res.steps} steps): median {statistics.median(speeds):.1f}x real time "
              f"(runs: {', '.join(f'{s:.1f}' for s in speeds)})", flush=True)


if __name__ == "__main__":
    main()
