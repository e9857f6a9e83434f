"""Speed of the simulated engine.

1. Virtual time: simulated seconds per wall second for 1 and 4 H200 replicas of qwen3-8b (round
   robin), 2,000-token prompts and 256-token replies, at 90% of the arm's measured capacity
   (standard class, found first by a capacity search on short virtual points). Target (issue
   #27): >= 500x real time for 4 replicas, >= 2,000x for one, on one core. Medians of a few
   repeats (the prompts are built before the clock starts; their build time is printed apart).
   The engine is the compiled build `make install` makes when present (the start line says
   which; ``ORCH_SIM_COMPILED=0`` times the interpreted one).
   ``--peer PATH`` times the same points with another checkout's code (e.g. a ``git worktree``
   of the landed commit) in a subprocess, repeat for repeat alternating with this one, and
   prints both figures and their ratio; the load average is printed at start and end.
2. Real-time server ceiling: one `orch sim serve` process (H200, qwen3-8b) driven by the load
   generator (another process, same machine) on a ladder of open-loop rates with short prompts
   and 256-token streamed replies; per rate the streamed tokens/s, the p99 of |step duration -
   the model's| (orch_sim_step_time_error_seconds) and of step-end lateness
   (orch_sim_step_lateness_seconds). The ceiling is the highest tokens/s whose p99 step-time
   error stays within 1 ms. ``--spin-ms 2`` measures the server's sub-ms mode instead.

Run: .venv/bin/python benchmarks/sim_bench.py [--repeats N] [--server-rates 10,20,40] [--skip-server]
     [--peer /tmp/sim_peer]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

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


LATENESS = "orch_sim_step_lateness_seconds"
STEP_ERROR = "orch_sim_step_time_error_seconds"


def _buckets(url: str) -> dict[str, dict[float, float]]:
    from orchestrator.loadgen.scrape import parse_metrics

    text = httpx.get(url + "/metrics", timeout=10).text
    out: dict[str, dict[float, float]] = {LATENESS: {}, STEP_ERROR: {}}
    for s in parse_metrics(text):
        for name in out:
            if s.name == name + "_bucket":
                out[name][float(s.labels["le"])] = s.value
    return out


def _p99(before: dict[float, float], after: dict[float, float]) -> tuple[float, int]:
    """Upper bound of the bucket holding the 99th percentile of the steps between two scrapes."""
    delta = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = delta[-1][1]
    for le, cum in delta:
        if cum >= 0.99 * total:
            return le, int(total)
    return float("inf"), int(total)


def server_ceiling(rates: list[float], seconds: float, spin_ms: float = 0.0) -> None:
    from orchestrator.loadgen.runner import run_point
    from orchestrator.loadgen.schedules import open_loop_offsets

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    orch = Path(sys.executable).parent / "orch"
    proc = subprocess.Popen([str(orch), "sim", "serve", "--model", "qwen3-8b", "--gpu", "H200",
                             "--port", str(port), "--spin-ms", str(spin_ms)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        workload = Workload.model_validate({"prompts": {"input_tokens": {"mean": 64, "dist": "fixed"},
                                                        "conversations": 100000}, "output_tokens": 256})
        print(f"\nreal-time server (1 process, H200 qwen3-8b, spin {spin_ms:g} ms), 64-token prompts, "
              "256-token replies:")
        best = 0.0
        for rate in rates:
            offsets = open_loop_offsets(OpenLoop(), rate, seconds, seed=int(rate))
            reqs = build_requests(workload, len(offsets), seed=int(rate))
            before = _buckets(url)
            summary = asyncio.run(run_point(url, model, reqs, offsets, ["measure"] * len(offsets),
                                            keep_records=True, request_timeout_s=120))
            after = _buckets(url)
            recs = summary.records or []
            ok = [r for r in recs if r.status == "ok" and r.first_token_s and r.last_token_s]
            tokens = sum(r.output_tokens or 0 for r in ok)
            span = max(r.last_token_s for r in ok) - min(r.sent_s for r in ok) if ok else 1.0
            err99, steps = _p99(before[STEP_ERROR], after[STEP_ERROR])
            late99, _ = _p99(before[LATENESS], after[LATENESS])
            tok_s = tokens / span
            held = err99 <= 0.001
            if held:
                best = max(best, tok_s)
            print(f"  {rate:6.1f} req/s: {len(ok)}/{len(recs)} ok, {tok_s:9,.0f} streamed tok/s, "
                  f"{steps} back-to-back steps, p99 step-time error <= {err99 * 1000:g} ms, "
                  f"p99 lateness <= {late99 * 1000:g} ms {'(held)' if held else ''}", flush=True)
        print(f"  ceiling: {best:,.0f} streamed tok/s with p99 step-time error within 1 ms")
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(10)


def virtual_runs(replicas: int, seconds: float, repeats: int, rate: float | None = None,
                 first: int = 0) -> dict:
    """The virtual-time figure of one cluster: its capacity (searched unless ``rate`` is given),
    then ``repeats`` timed runs at 90% of it (seeds 10 + first, 11 + first, ...)."""
    c = cluster(replicas)
    if rate is None:
        cap = capacity_rate(c)
        rate = 0.9 * cap
    else:
        cap = rate / 0.9
    speeds, builds = [], []
    n = steps = 0
    for k in range(first, first + repeats):
        offsets = open_loop_offsets(OpenLoop(), rate, seconds, 10 + k)
        t = time.perf_counter()
        requests = build_requests(WORKLOAD, len(offsets), 10 + k)
        builds.append(time.perf_counter() - t)
        t = time.perf_counter()
        res = simulate_open_loop(c, requests, offsets, Windows(0.0, seconds, 0.0), drain_s=30.0, seed=10 + k)
        speeds.append(res.end_s / (time.perf_counter() - t))
        n, steps = len(res.records), res.steps
    return {"capacity": cap, "rate": rate, "speeds": speeds, "builds": builds, "n": n, "steps": steps}


def _peer_run(peer: str, replicas: int, seconds: float, rate: float, k: int) -> dict:
    """One timed repeat with the peer checkout's code (its own interpreter, its sources first)."""
    code = ("import json, sys; sys.path.insert(0, 'benchmarks'); import sim_bench as b; "
            f"print(json.dumps(b.virtual_runs({replicas}, {seconds!r}, 1, {rate!r}, {k})))")
    env = {**os.environ, "PYTHONPATH": peer}
    if "virtual_runs" not in Path(peer, "benchmarks", "sim_bench.py").read_text():
        # a peer from before --peer existed: the same point through its own functions
        code = ("import json, sys, time; sys.path.insert(0, 'benchmarks'); import sim_bench as b; "
                "from orchestrator.sim.engine import Windows; "
                f"res, wall = b.point(b.cluster({replicas}), {rate!r}, Windows(0.0, {seconds!r}, 0.0), seed={10 + k}); "
                "print(json.dumps({'speeds': [res.end_s / wall], 'n': len(res.records), 'steps': res.steps}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=peer, env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} CPUs)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60.0, help="virtual seconds per run")
    ap.add_argument("--server-rates", default="5,20,40,60,80,100,120")
    ap.add_argument("--server-seconds", type=float, default=10.0)
    ap.add_argument("--skip-server", action="store_true")
    ap.add_argument("--spin-ms", type=float, default=0.0, help="the server's --spin-ms")
    ap.add_argument("--peer", help="a checkout whose engine is timed on the same points (a git worktree)")
    args = ap.parse_args()
    from orchestrator.sim import native

    engine = "compiled (mypyc, orchestrator.sim.native)" if native.compiled() else "interpreted"
    print(f"start: {_load()}; engine {engine}", flush=True)
    for replicas in (1, 4):
        first = virtual_runs(replicas, args.seconds, 1)
        speeds, builds, peer_speeds = first["speeds"], first["builds"], []
        for k in range(args.repeats):
            if args.peer:
                # one of each in turn, so a change in the machine's load hits both alike
                peer_speeds += _peer_run(args.peer, replicas, args.seconds, first["rate"], k)["speeds"]
            if k:
                more = virtual_runs(replicas, args.seconds, 1, first["rate"], k)
                speeds += more["speeds"]
                builds += more["builds"]
        med = statistics.median(speeds)
        print(f"{replicas} x H200 qwen3-8b, capacity {first['capacity']:.2f} req/s, run at {first['rate']:.2f} req/s "
              f"({first['n']} requests, {first['steps']} steps): median {med:.1f}x real time "
              f"(runs: {', '.join(f'{s:.1f}' for s in speeds)}); prompts built in "
              f"{statistics.median(builds) * 1000:.0f} ms a run; {_load()}", flush=True)
        if args.peer:
            pmed = statistics.median(peer_speeds)
            print(f"  peer {args.peer}: median {pmed:.1f}x (runs: {', '.join(f'{s:.1f}' for s in peer_speeds)}); "
                  f"this checkout {med / pmed:.2f}x the peer's speed", flush=True)
    print(f"end: {_load()}", flush=True)
    if not args.skip_server:
        server_ceiling([float(x) for x in args.server_rates.split(",")], args.server_seconds, args.spin_ms)


if __name__ == "__main__":
    main()
