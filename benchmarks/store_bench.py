"""Store benchmark: a synthetic history of >= 10 million request rows and 50,000 runs in
PostgreSQL; ingest rows/s by COPY against ORM inserts; p50/p95 latency of every history query
behind `orch capacity` (its filters, --since, --plot's trend, the table of every valid run),
`orch capacity plan` (the signature look-up and ranking, its fallback) and `orch capacity
--pareto` (the load points), and the Store's per-GPU and best-configuration answers.

    .venv/bin/python benchmarks/store_bench.py [--requests 10000000] [--runs 50000] [--settings both]

Servers (--settings): ``durable`` is PostgreSQL's defaults (fsync, synchronous_commit and
full_page_writes on: what a production database runs, the headline figure); ``fast`` is what
the tests use (all three off: a commit is not on disk when it returns); ``both`` (the default)
measures one after the other, each on a fresh private cluster in a temporary folder
(shared_buffers 1 GB), removed after, and prints them side by side. With ORCH_BENCH_DATABASE_URL
(an empty PostgreSQL database) it measures that server only, under whatever it is set to.
Not part of `make test`; it prints figures (targets: ingest >= 200,000 rows/s; issue 20: every
history query p95 < 20 ms over 50,000 runs / 10 M requests).

`orch capacity` over every valid run (issue 32) is timed on its summary path (migration 0014)
side by side with the point-only capacity_by_config (the peer) and its live path, in one
interleaved loop, medians and ratios printed. ``--censored`` (default 0.05) is the share of
capacities seeded censored or unconverged; ``--requests 0`` skips the request rows and ingest
(history queries do not read them); ``--queries censored`` times only that comparison:

    .venv/bin/python benchmarks/store_bench.py --requests 0 --settings durable --queries censored
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TypedDict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from orchestrator.records import RequestRecord  # noqa: E402
from orchestrator.store import Store  # noqa: E402
from orchestrator.store.appendonly import maintenance  # noqa: E402
from orchestrator.store.models import (  # noqa: E402
    Capacity,
    DeploymentConfig,
    Experiment,
    LoadPoint,
    Request,
    Run,
)
from orchestrator.store.types import utcnow  # noqa: E402

CLASSES = ("interactive", "standard", "agent")
MODELS = ("qwen3-8b", "llama-3.1-70b", "qwen3-30b-a3b")
GPUS = ("H100-PCIe", "H100-SXM", "H200")
RATES = (2.0, 4.0, 8.0, 16.0, 24.0, 32.0)


def point_records(n: int, seed: int) -> list[RequestRecord]:
    """One point's worth of realistic records (reused for every point: ids repeat per point)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        sched = 1.7e9 + i / 16 + rng.random() * 1e-3
        ok = rng.random() > 0.02
        first = sched + 0.05 + rng.random() * 0.3 if ok else None
        out.append(RequestRecord(
            request_id=i, conversation_id=rng.randrange(2000), turn=rng.randrange(4), phase="measure",
            scheduled_s=sched, sent_s=sched + rng.random() * 1e-3, first_token_s=first,
            last_token_s=first + 2.5 if first else None, prompt_tokens=rng.randrange(500, 6000),
            output_tokens_asked=256, output_tokens=256 if ok else None, cached_tokens=rng.randrange(3000),
            chunks=256 if ok else 0, max_gap_s=0.02 if ok else None, status="ok" if ok else "timeout",
            http_status=200 if ok else None, error=None if ok else "timeout after 30 s",
            prompt_hash=f"{rng.getrandbits(128):032x}", output_hash=f"{rng.getrandbits(64):016x}",
        ))
    return out


def registrations(store: Store) -> list[int]:
    """Plans of four workloads (prompt and reply lengths) on the simulator and on a measured
    backend: eight registrations, so history holds comparable groups to keep apart."""
    import yaml

    from orchestrator.plan import validate_plan

    base = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    out = []
    for i, (inp, outp) in enumerate(((3000, 64), (1000, 256), (8000, 128), (500, 512))):
        for backend in ("sim", "local"):
            data = {**base, "name": f"bench-{i}-{backend}", "backend": backend,
                    "workload": {**base["workload"], "output_tokens": outp,
                                 "prompts": {**base["workload"]["prompts"],
                                             "input_tokens": {"mean": inp, "dist": "lognormal", "sigma": 0.3}}}}
            out.append(store.register_plan(validate_plan(data)).id)
    return out


def censoring(rng: random.Random, share: float, capacity: float) -> dict[str, object]:
    """A capacity's censoring: a point, or with probability ``share`` a censored or unconverged
    one (3/5 censored above the search's range, 1/5 below its lowest rate with the bound it
    found, 1/5 an unconverged bracket), drawn from its own generator (``share`` 0 draws
    nothing: the history of the benchmark before issue 32)."""
    if not share or (u := rng.random()) >= share:
        return {}
    u /= share
    if u < 0.6:
        return {"censored": "above_max"}
    if u < 0.8:
        return {"capacity": 0.0, "censored": "below_min", "upper": capacity / 2}
    return {"converged": False, "upper": capacity * 1.3}


def seed_history(store: Store, runs: int, points: int,
                 censored: float = 0.0) -> tuple[list[int], list[dict[str, object]]]:
    """Configurations, experiments (over eight registrations), runs (5% invalid), three
    capacities per run (a ``censored`` share of them censored or unconverged: censoring()),
    load points. The runs are seeded running (no point or record may be added to a finished
    run: migration 0011); ``finish_runs`` ends them, with the returned end times, once the
    records are in."""
    rng = random.Random(1)
    crng = random.Random(4)
    regs = registrations(store)
    now = utcnow()
    configs = []
    for m in MODELS:
        for g in GPUS:
            for layout in ("colocated", "disaggregated"):
                for kv in ("auto", "fp8"):
                    for seqs in (64, 128, 256, 512):
                        for router in ("round_robin", "cache_aware"):
                            configs.append(dict(
                                config_sha256=f"{len(configs):064x}", label=f"{g} {layout} kv={kv} seqs={seqs} {router}",
                                model=m, gpu=g, layout=layout, gpus=4, tp=1, replicas=4 if layout == "colocated" else None,
                                kv_cache_dtype=kv, quantization="none", max_num_seqs=seqs, max_num_batched_tokens=8192,
                                prefix_caching=True, router_policy=router, engine_version=rng.choice(("v0.10.2", "v0.11.0")),
                                config={"synthetic": True}, created_at=now,
                            ))
    per_exp = 100
    with Session(store.engine) as s, s.begin():
        s.execute(sa.insert(DeploymentConfig), configs)
        config_ids = s.scalars(sa.select(DeploymentConfig.id).order_by(DeploymentConfig.id)).all()
        s.execute(sa.insert(Experiment), [
            dict(name=f"bench-{e}", registration_id=regs[e % len(regs)], status="done", created_at=now)
            for e in range(runs // per_exp)])
        exp_ids = s.scalars(sa.select(Experiment.id).order_by(Experiment.id)).all()
        run_rows, ends = [], []
        for i in range(runs):
            finished = now - timedelta(days=rng.random() * 365)
            run_rows.append(dict(
                experiment_id=exp_ids[i // per_exp], config_id=rng.choice(config_ids), arm="AB"[i % 2],
                block=(i % per_exp) // 2, position=i % 2, attempt=0, status="running",
                valid=rng.random() > 0.05, started_at=finished - timedelta(minutes=20),
                engine_version=rng.choice(("v0.10.2", "v0.11.0")), gpu_type="H200",
                fingerprint={"gpu_products": ["NVIDIA H200"]},
            ))
            ends.append({"finished": finished})
        s.execute(sa.insert(Run), run_rows)
        run_ids = s.scalars(sa.select(Run.id).order_by(Run.id)).all()
        s.execute(sa.insert(Capacity), [
            {"run_id": r, "class_name": c, "capacity": cap, "at_rate": 4.0, "attainment": 0.92, "points_used": 6,
             "censored": None, "converged": True, "upper": None, **censoring(crng, censored, cap)}
            for r in run_ids for c in CLASSES for cap in (rng.lognormvariate(8, 0.5),)])
        # six points per run (a search's ladder of rates), each with a throughput and a median
        # TPOT: what `orch capacity --pareto` reads
        s.execute(sa.insert(LoadPoint), [
            dict(run_id=run_ids[(i // 6) % len(run_ids)], seq=i % 6, offered_rate=RATES[i % 6], window_start_s=0.0,
                 window_end_s=120.0, per_class={}, throughput_tok_s=RATES[i % 6] * 256 * rng.uniform(0.8, 1.0),
                 percentiles={"tpot_s": {"p50": 0.008 + 0.002 * (i % 6) + rng.random() * 0.004}},
                 valid=True, created_at=now)
            for i in range(points)])
        point_ids = s.scalars(sa.select(LoadPoint.id).order_by(LoadPoint.id)).all()
    return list(point_ids), [{"run_id": r, **e} for r, e in zip(run_ids, ends, strict=True)]


def finish_runs(store: Store, ends: list[dict[str, object]]) -> None:
    """Every seeded run done at its end time (a running run may move forward to done)."""
    with store.engine.begin() as conn:
        conn.execute(sa.update(Run).where(Run.id == sa.bindparam("run_id"))
                     .values(status="done", finished_at=sa.bindparam("finished")), ends)


def bench_copy(store: Store, point_ids: list[int], records: list[RequestRecord], total: int) -> float:
    done, elapsed, last_report = 0, 0.0, time.perf_counter()
    for pid in point_ids:
        if done >= total:
            break
        t0 = time.perf_counter()
        done += store.ingest_requests(pid, records)
        elapsed += time.perf_counter() - t0
        if time.perf_counter() - last_report > 15:
            print(f"  ... {done:,} rows, {done / elapsed:,.0f} rows/s", flush=True)
            last_report = time.perf_counter()
    print(f"  COPY: {done:,} rows in {elapsed:.1f} s", flush=True)
    return done / elapsed


def bench_copy_parallel(store: Store, point_ids: list[int], records: list[RequestRecord], total: int,
                        writers: int) -> float:
    """Several writers at once (as Ray shards' sinks are), each its own connection and points."""
    from concurrent.futures import ThreadPoolExecutor

    calls = point_ids[: -(-total // len(records))]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(writers) as pool:
        done = sum(pool.map(lambda pid: store.ingest_requests(pid, records), calls))
    elapsed = time.perf_counter() - t0
    print(f"  COPY x{writers} writers: {done:,} rows in {elapsed:.1f} s", flush=True)
    return done / elapsed


def bench_orm(store: Store, point_id: int, records: list[RequestRecord]) -> tuple[float, float]:
    """ORM unit-of-work inserts, and SQLAlchemy Core executemany, of the same records."""
    t0 = time.perf_counter()
    with Session(store.engine) as s, s.begin():
        s.add_all(Request(point_id=point_id, **r.to_dict()) for r in records)
    orm = len(records) / (time.perf_counter() - t0)
    with store.engine.begin() as conn, maintenance(conn):  # requests are append-only (0006)
        conn.execute(sa.delete(Request).where(Request.point_id == point_id))
    t0 = time.perf_counter()
    with store.engine.begin() as conn:
        conn.execute(sa.insert(Request), [dict(point_id=point_id, **r.to_dict()) for r in records])
    core = len(records) / (time.perf_counter() - t0)
    return orm, core


def latency(fn: Callable[[], object], repeat: int) -> tuple[float, float, int]:
    fn()  # warm the plan cache and the buffer cache
    times, rows = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1000)
        rows = len(out)  # type: ignore[arg-type]
    times.sort()
    return statistics.median(times), times[max(0, int(round(0.95 * len(times))) - 1)], rows


SETTINGS = {
    # what the tests run: nothing waits for the disk
    "fast": {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"},
    # PostgreSQL's defaults: a committed transaction is on disk, torn pages are repaired
    "durable": {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"},
}


def history_queries(store: Store) -> dict[str, Callable[[], object]]:
    """Every history question behind `orch capacity` (its filters, --since, --plot's trends),
    `orch capacity plan` (the signature look-up, the ranking, the fallback when nothing
    matches) and `orch capacity --pareto` (the load points), and the Store's other history
    answers (per GPU, best configuration)."""
    from orchestrator.report.capacity_history import capacity_history
    from orchestrator.report.history import DEFAULT_GPU_PRICES, size_configurations

    some_config = int(store.capacity_by_config(model="qwen3-8b", gpu="H200", service_class="agent").iloc[0]["config_id"])
    sig = store.workload_signatures()[0]

    def sizing() -> object:
        """`orch capacity plan --model M --class interactive --workload SIG --rate 40`: the look-up,
        the history of that model, class, limits and workload (measured), the shapes, the ranking."""
        found = store.workload_signatures(sig["sha256"][:8])
        frame = capacity_history(store, model="qwen3-8b", service_class="interactive", workload=found[0]["sha256"],
                                 ttft_ms=300.0, tpot_ms=10.0, simulated=False)
        details = store.config_details([int(c) for c in frame["config_id"]])
        return size_configurations(frame, details, rate=40.0, output_tokens=float(found[0]["output_tokens"]),
                                   prices=DEFAULT_GPU_PRICES)

    return {
        # orch capacity [filters]
        "capacity (no filter)": lambda: store.capacity_by_config(),
        "capacity model+gpu+class": lambda: store.capacity_by_config(model="qwen3-8b", gpu="H200", service_class="interactive"),
        "capacity kv+seqs+class": lambda: store.capacity_by_config(kv_cache_dtype="fp8", max_num_seqs=256, service_class="agent"),
        "capacity workload+measured": lambda: store.capacity_by_config(workload=sig["sha256"][:8], simulated=False),
        "capacity in/out ranges": lambda: store.capacity_by_config(input_tokens=(2000, 4000), output_tokens=(0, 100)),
        "capacity layout --since 90": lambda: store.capacity_by_config(layout="disaggregated", since_days=90),
        "capacity model+class --since 30": lambda: store.capacity_by_config(model="qwen3-8b", service_class="standard",
                                                                            since_days=30),
        "capacity observed engine+class": lambda: store.capacity_by_config(observed_engine="v0.11.0", service_class="standard"),
        "capacity observed gpu+model": lambda: store.capacity_by_config(observed_gpu="H200", model="llama-3.1-70b"),
        # orch capacity's table since issue 32: every valid run, censored ones too (capacity_history)
        "capacity every run (no filter)": lambda: capacity_history(store),
        "capacity every run model+gpu+class": lambda: capacity_history(store, model="qwen3-8b", gpu="H200",
                                                                       service_class="interactive"),
        "capacity every run layout --since 90": lambda: capacity_history(store, layout="disaggregated", since_days=90),
        "capacity --plot trend (config+class)": lambda: store.config_trend(some_config, "agent", every_run=True),
        # orch capacity plan
        "capacity plan ranking (sizing)": sizing,
        "capacity plan fallback (model+class)": lambda: store.capacity_by_config(model="qwen3-8b", service_class="interactive"),
        # orch capacity --pareto
        "capacity --pareto (no filter)": lambda: store.load_points(),
        "capacity --pareto model+workload": lambda: store.load_points(model="qwen3-8b", workload=sig["sha256"][:8]),
        # the Store's other history answers
        "capacity_per_gpu class": lambda: store.capacity_per_gpu(service_class="standard"),
        "best_config class+gpu": lambda: store.best_config("interactive", gpu="H100-SXM", top=3),
    }


class Measured(TypedDict):
    """One server's figures (``measure``), printed side by side."""

    settings: dict[str, str]  # the server's fsync, synchronous_commit, full_page_writes
    requests: int
    runs: int
    copy: float
    parallel: float
    orm: float
    core: float
    latencies: dict[str, tuple[float, float]]  # query -> (p50, p95) ms
    worst: float
    censored: dict[str, dict[str, float]]  # case -> path -> median ms


def measure(url: str, args: argparse.Namespace) -> Measured:
    """Seed, ingest and query one server; returns its figures."""
    store = Store.open(url)
    with store.engine.connect() as conn:
        settings = {k: conn.execute(sa.text(f"show {k}")).scalar_one() for k in SETTINGS["durable"]}
    print(f"server settings: {settings}", flush=True)
    points = -(-args.requests // args.per_point) + 1
    t0 = time.perf_counter()
    point_ids, ends = seed_history(store, args.runs, points, args.censored)
    print(f"seeded {args.runs:,} runs, {3 * args.runs:,} capacities ({args.censored:.0%} censored or unconverged), "
          f"{points:,} points in {time.perf_counter() - t0:.1f} s", flush=True)
    copy_rate = parallel_rate = orm_rate = core_rate = 0.0
    if args.requests:
        records = point_records(args.per_point, seed=2)
        single = min(args.single, args.requests)
        copy_rate = bench_copy(store, point_ids[1:], records, single)
        used = 1 + -(-single // len(records))
        parallel_rate = bench_copy_parallel(store, point_ids[used:], records, args.requests - single,
                                            args.writers) if args.requests > single else 0.0
        orm_rate, core_rate = bench_orm(store, point_ids[0], records[: args.orm_rows] if args.orm_rows <= len(records)
                                        else point_records(args.orm_rows, seed=3))
    t0 = time.perf_counter()  # the records are in: the runs finish, and the derived keys and summaries are rebuilt
    finish_runs(store, ends)
    groups = store.rebuild_capacity_summaries()
    print(f"finished the runs and rebuilt {groups} capacity summaries in {time.perf_counter() - t0:.1f} s", flush=True)
    with store.engine.connect() as conn:
        n_req = conn.execute(sa.text("select count(*) from requests")).scalar_one()
        n_runs = conn.execute(sa.text("select count(*) from runs")).scalar_one()
        conn.commit()
    # what autovacuum would do after a bulk load, done now so it does not run during the
    # latency measurement on this small machine
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        t0 = time.perf_counter()
        conn.execute(sa.text("vacuum (analyze)"))
        print(f"vacuum (analyze) after the load: {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"\nhistory: {n_req:,} request rows, {n_runs:,} runs")
    if args.requests:
        print("\ningest, rows/s (same records)")
        print(f"  COPY (store.ingest_requests, {args.per_point}/call): {copy_rate:>12,.0f}   target >= 200,000")
        if parallel_rate:
            print(f"  COPY, {args.writers} writers at once:              {parallel_rate:>12,.0f}")
        print(f"  ORM add_all + commit:                    {orm_rate:>12,.0f}   ({copy_rate / orm_rate:.0f}x slower)")
        print(f"  Core executemany (insertmanyvalues):      {core_rate:>12,.0f}   ({copy_rate / core_rate:.1f}x slower)")
    latencies: dict[str, tuple[float, float]] = {}
    if args.queries == "all":
        print(f"\nhistory queries, ms over {args.repeat} repeats (target p95 < 20)")
        print(f"  {'query':<40} {'p50':>8} {'p95':>8} {'rows':>6}")
        for name, fn in history_queries(store).items():
            p50, p95, rows = latency(fn, args.repeat)
            latencies[name] = (p50, p95)
            print(f"  {name:<40} {p50:>8.1f} {p95:>8.1f} {rows:>6}", flush=True)
    censored = censored_history(store, args.repeat)
    worst = max((p95 for _, p95 in latencies.values()), default=float("nan"))
    if latencies or args.requests:
        print(f"\nworst p95 {worst:.1f} ms; ingest {copy_rate:,.0f} rows/s (one writer), "
              f"{parallel_rate:,.0f} rows/s ({args.writers} writers)", flush=True)
    store.close()
    return {"settings": settings, "requests": n_req, "runs": n_runs, "copy": copy_rate, "parallel": parallel_rate,
            "orm": orm_rate, "core": core_rate, "latencies": latencies, "worst": worst, "censored": censored}


def censored_history(store: Store, repeat: int) -> dict[str, dict[str, float]]:
    """`orch capacity`'s table from every valid run (report.capacity_history) on its summary path
    (all time: one summary row per group, migration 0014) side by side with the point-only
    capacity_by_config it replaced there (the named peer), and the live path it takes otherwise
    (every capacity of the groups: what it read for all time before 0014), interleaved in one
    loop (each repeat runs the three in a rotated order, so load from other work falls on all of
    them alike); medians in ms and the ratios. Checks first that the summaries answer each query
    and equal the live path there."""
    import pandas as pd

    from orchestrator.report.capacity_history import capacity_history, capacity_history_live

    sig = store.workload_signatures()[0]["sha256"]
    cases: dict[str, dict[str, object]] = {
        "unfiltered": {}, "model+gpu+class": {"model": "qwen3-8b", "gpu": "H200", "service_class": "interactive"},
        "workload+measured": {"workload": sig[:8], "simulated": False},
    }
    print(f"\n`orch capacity` over every valid run (issue 32), ms, median of {repeat} interleaved repeats")
    print(f"  {'filters':<20} {'summaries':>10} {'by_config':>10} {'ratio':>7} {'live':>9} {'live/summ':>9} {'rows':>6}")
    out: dict[str, dict[str, float]] = {}
    for name, filters in cases.items():
        if store.summarised_history(**filters) is None:
            raise SystemExit(f"{name}: the summaries do not answer it")
        pd.testing.assert_frame_equal(capacity_history(store, **filters), capacity_history_live(store, **filters))
        fns: dict[str, Callable[[], pd.DataFrame]] = {
            "summaries": functools.partial(capacity_history, store, **filters),
            "by_config": functools.partial(store.capacity_by_config, **filters),
            "live": functools.partial(capacity_history_live, store, **filters),
        }
        times: dict[str, list[float]] = {k: [] for k in fns}
        rows = len(fns["summaries"]())
        for k in fns:  # warm the plan cache and the buffer cache
            fns[k]()
        order = list(fns)
        for i in range(repeat):
            for k in order[i % 3:] + order[:i % 3]:
                t0 = time.perf_counter()
                fns[k]()
                times[k].append((time.perf_counter() - t0) * 1000)
        med = {k: statistics.median(v) for k, v in times.items()}
        out[name] = med
        print(f"  {name:<20} {med['summaries']:>10.1f} {med['by_config']:>10.1f} "
              f"{med['summaries'] / med['by_config']:>6.2f}x {med['live']:>9.1f} "
              f"{med['live'] / med['summaries']:>8.1f}x {rows:>6}", flush=True)
    return out


def side_by_side(results: dict[str, Measured], writers: int) -> None:
    names = list(results)
    print("\n" + "=" * 80)
    print("summary: " + "  vs  ".join(f"{n} ({results[n]['settings']})" for n in names))
    print(f"  {'figure':<44}" + "".join(f"{n:>14}" for n in names))
    rates: dict[str, dict[str, float]] = {n: {"copy": r["copy"], "parallel": r["parallel"], "orm": r["orm"],
                                              "core": r["core"]} for n, r in results.items()}
    for key, label in (("copy", "COPY rows/s, one writer"), ("parallel", f"COPY rows/s, {writers} writers"),
                       ("orm", "ORM rows/s"), ("core", "Core executemany rows/s")):
        if not any(rates[n][key] for n in names):  # --requests 0: no ingest measured
            continue
        print(f"  {label:<44}" + "".join(f"{float(rates[n][key]):>14,.0f}" for n in names))
    first = results[names[0]]["latencies"]
    for q in first:
        print(f"  {'p95 ms ' + q:<44}" + "".join(f"{results[n]['latencies'][q][1]:>14.1f}" for n in names))
    for case in results[names[0]]["censored"]:
        for path in ("summaries", "by_config", "live"):
            label = f"p50 ms every run {case}, {path}"
            print(f"  {label:<44}" + "".join(f"{results[n]['censored'][case][path]:>14.1f}" for n in names))
    if first:
        print(f"  {'worst p95 ms':<44}" + "".join(f"{results[n]['worst']:>14.1f}" for n in names))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=50_000)
    ap.add_argument("--per-point", type=int, default=2000, help="records per ingest call (one point)")
    ap.add_argument("--orm-rows", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--single", type=int, default=3_000_000, help="rows ingested by one writer first")
    ap.add_argument("--writers", type=int, default=2, help="concurrent writers for the remaining rows")
    ap.add_argument("--settings", choices=("both", "durable", "fast"), default="both",
                    help="private servers to measure: PostgreSQL's durable defaults, the tests' fast settings, or both")
    ap.add_argument("--censored", type=float, default=0.05,
                    help="share of capacities censored or unconverged (0: the history before issue 32)")
    ap.add_argument("--queries", choices=("all", "censored"), default="all",
                    help="every history query, or only `orch capacity` over every run against capacity_by_config")
    args = ap.parse_args()

    url = os.environ.get("ORCH_BENCH_DATABASE_URL")
    if url:
        measure(url, args)
        return 0
    from tests.support import postgres

    bindir = postgres.find_bindir()
    if bindir is None:
        print("PostgreSQL server binaries not found; set ORCH_BENCH_DATABASE_URL", file=sys.stderr)
        return 2
    results: dict[str, Measured] = {}
    for name in (("durable", "fast") if args.settings == "both" else (args.settings,)):
        print(f"\n### {name} server", flush=True)
        # a server sized for a 10-million-row history: its primary-key index stays in memory
        pg = postgres.start(bindir, {"shared_buffers": "1GB", **SETTINGS[name]})
        try:
            results[name] = measure(pg.url(pg.create_database()), args)
        finally:
            pg.stop()
    if len(results) > 1:
        side_by_side(results, args.writers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
