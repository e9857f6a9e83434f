"""History's fast paths (issue 20 speed; migration 0010) answer exactly what a direct
computation over the stored runs answers, on both databases: capacity_by_config (the summaries,
the live aggregate by group number, with every kind of filter), capacity_per_gpu (numpy) and
load_points (the TPOT median read by the server), on a seeded history with ties, censored and
unconverged capacities, invalid and unfinished runs, simulated and measured runs of two
workloads (0010's back-fill: test_store_migrations). Speed is measured by
benchmarks/store_bench.py, never asserted here."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy.orm import Session

from orchestrator.plan import validate_plan
from orchestrator.store import Store, history, history_frame
from orchestrator.store.appendonly import maintenance
from orchestrator.store.database import create_engine
from orchestrator.store.models import (
    Capacity,
    DeploymentConfig,
    Experiment,
    LoadPoint,
    Run,
    WorkloadSignatureRow,
)
from orchestrator.store.summaries import quantile
from orchestrator.store.types import utcnow

pytestmark = pytest.mark.integration

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
KEYS = ("workload_sha256", "ttft_ms", "tpot_ms", "backend", "simulated")
UNKNOWN: dict[str, Any] = {"workload_sha256": "", "ttft_ms": 0.0, "tpot_ms": 0.0, "backend": "", "simulated": False}
# TPOT medians as a point's percentiles may hold them: a number, an integer, +inf (stored as
# "Infinity"), and what is never a TPOT (a non-positive number, -inf, NaN, true, text, absent)
TPOTS: list[Any] = [0.012, 0.02, 1, math.inf, 0.0, -0.5, -math.inf, math.nan, True, "fast", None]


def _registrations(store: Store) -> list[int]:
    base = yaml.safe_load(QUICKSTART.read_text())
    out = []
    for i, (inp, outp) in enumerate(((3000, 64), (800, 256))):
        for backend in ("sim", "local"):
            data = {**base, "name": f"seed-{i}-{backend}", "backend": backend,
                    "workload": {**base["workload"], "output_tokens": outp,
                                 "prompts": {**base["workload"]["prompts"],
                                             "input_tokens": {"mean": inp, "dist": "lognormal", "sigma": 0.3}}}}
            out.append(store.register_plan(validate_plan(data)).id)
    return out


def _capacity(rng: random.Random, mixed: bool) -> dict[str, Any]:
    """A capacity's value and censoring; ``mixed``: every kind, censored below (with the bound
    the search found) and unconverged brackets too (report.capacity_history's test)."""
    # few distinct values: equal medians across groups (the order's tie-breaks)
    cap = float(rng.choice((100, 150, 200, 250, 400, 1000))) * rng.choice((1, 1, 1.5))
    if not mixed:
        return dict(capacity=cap, censored=rng.choice((None,) * 9 + ("above_max",)), converged=rng.random() > 0.05)
    kind = rng.random()
    if kind < 0.7:
        return dict(capacity=cap, censored=None, converged=True)
    if kind < 0.85:
        return dict(capacity=cap, censored=rng.choice(("above_max", "at_ceiling")), converged=True)
    if kind < 0.92:
        return dict(capacity=0.0, censored="below_min", converged=True, upper=cap / 2)
    return dict(capacity=cap, censored=None, converged=False, upper=rng.choice((cap * 1.5, None)))


def seed(store: Store, runs: int = 500, seed_: int = 7, mixed: bool = False) -> None:
    """A history written in bulk (as benchmarks/store_bench.py writes one), then its derived
    columns, groups and summaries rebuilt by the Store (``mixed``: see _capacity)."""
    rng = random.Random(seed_)
    regs = _registrations(store)
    now = utcnow()
    configs = [
        dict(config_sha256=f"{i:064x}", label=f"{g} {layout} {i}", model=m, gpu=g, layout=layout, gpus=rng.choice((1, 2, 4)),
             tp=1, kv_cache_dtype=rng.choice(("auto", "fp8")), quantization="none", max_num_seqs=128,
             max_num_batched_tokens=8192, prefix_caching=True, router_policy="round_robin",
             engine_version="v0.11.0", config={"i": i}, created_at=now)
        for i, (m, g, layout) in enumerate((m, g, layout) for m in ("qwen3-8b", "llama-3.1-70b")
                                           for g in ("H100-SXM", "H200") for layout in ("colocated", "disaggregated"))
    ]
    # points of finished runs written afterwards: the owner's escape (0011 refuses it otherwise)
    with Session(store.engine) as s, s.begin(), maintenance(s):
        s.execute(sa.insert(DeploymentConfig), configs)
        config_ids = s.scalars(sa.select(DeploymentConfig.id).order_by(DeploymentConfig.id)).all()
        s.execute(sa.insert(Experiment), [dict(name=f"seed-{e}", registration_id=regs[e % len(regs)], status="done",
                                               created_at=now) for e in range(-(-runs // 25))])
        exp_ids = s.scalars(sa.select(Experiment.id).order_by(Experiment.id)).all()
        s.execute(sa.insert(Run), [
            dict(experiment_id=exp_ids[i // 25], config_id=rng.choice(config_ids), arm="AB"[i % 2], block=i % 25,
                 position=i % 2, attempt=0, status="done" if rng.random() > 0.05 else "running",
                 valid=rng.random() > 0.1, started_at=now - timedelta(days=400),
                 finished_at=now - timedelta(days=rng.random() * 400, microseconds=rng.randrange(10**6)),
                 engine_version=rng.choice(("v0.10.2", "v0.11.0", "sim-0.1")), gpu_type="H200",
                 fingerprint={"gpu_products": [rng.choice(("NVIDIA H200", "NVIDIA H100 80GB HBM3"))]})
            for i in range(runs)])
        run_ids = s.scalars(sa.select(Run.id).order_by(Run.id)).all()
        s.execute(sa.insert(Capacity), [
            dict(run_id=r, class_name=c, at_rate=4.0, attainment=0.92, points_used=6, **_capacity(rng, mixed))
            for r in run_ids for c in ("interactive", "standard", "agent") if rng.random() > 0.2])
        s.execute(sa.insert(LoadPoint), [
            dict(run_id=r, seq=k, offered_rate=rng.choice((2.0, 8.0, None)), window_start_s=0.0, window_end_s=60.0,
                 throughput_tok_s=rng.choice((500.0, 900.0, None)), per_class={},
                 percentiles={"tpot_s": {"p50": rng.choice(TPOTS)}} if rng.random() > 0.1 else {},
                 valid=rng.random() > 0.1, created_at=now)
            for r in run_ids[: runs // 2] for k in range(rng.randrange(3))])
    store.rebuild_capacity_summaries()


@pytest.fixture
def seeded(request: pytest.FixtureRequest):
    """A seeded history on the database ``request.param`` names (a fixture)."""
    url = request.getfixturevalue(request.param)
    store = Store.open(url)
    seed(store)
    yield store
    store.close()


def _direct(store: Store, since_days: float | None = None, observed_engine: str | None = None,
            observed_gpu: str | None = None, **filters: Any) -> list[dict[str, Any]]:
    """capacity_by_config computed straight from the runs, in Python: valid finished runs'
    point estimates grouped by configuration, class and the keys (unknown keys as ''/0/False),
    linear-interpolation quartiles, the documented order."""
    dc, ws = DeploymentConfig, WorkloadSignatureRow
    with store.engine.connect() as conn:
        configs = {r.id: r._mapping for r in conn.execute(sa.select(dc))}
        workloads = {r.sha256: r._mapping for r in conn.execute(sa.select(ws))}
        rows = conn.execute(
            sa.select(Run.config_id, Run.finished_at, Capacity.class_name, Capacity.capacity, Capacity.observed_gpu,
                      Capacity.observed_engine, *(getattr(Capacity, k) for k in KEYS))
            .join(Run, Run.id == Capacity.run_id)
            .where(Run.valid.is_(True), Run.status == "done", Capacity.censored.is_(None), Capacity.converged.is_(True))
        ).all()
    since = utcnow() - timedelta(days=since_days) if since_days is not None else None
    groups: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for r in rows:
        keys = {k: UNKNOWN[k] if getattr(r, k) is None else getattr(r, k) for k in KEYS}
        cfg, wl = configs[r.config_id], workloads.get(keys["workload_sha256"])
        wanted = {**{k: cfg[k] for k in ("model", "gpu", "layout")}, "service_class": r.class_name, **keys,
                  "workload": keys["workload_sha256"][:8]}
        if any(wanted[k] != v for k, v in filters.items() if k != "input_tokens"):
            continue
        if "input_tokens" in filters:
            lo, hi = filters["input_tokens"]
            if wl is None or not lo <= wl["input_mean"] <= hi:
                continue
        if since is not None and r.finished_at < since:
            continue
        if observed_engine is not None and r.observed_engine != observed_engine:
            continue
        if observed_gpu is not None and observed_gpu not in (r.observed_gpu or ""):
            continue
        groups[(r.config_id, r.class_name, *(keys[k] for k in KEYS))].append((r.capacity, r.finished_at))
    out = []
    for (config_id, cls, *key), found in groups.items():
        values = sorted(v for v, _ in found)
        keys = dict(zip(KEYS, key, strict=True))
        cfg, wl = configs[config_id], workloads.get(keys["workload_sha256"])
        median, p25, p75 = (quantile(values, q) for q in (0.5, 0.25, 0.75))
        out.append({
            "config_id": config_id, **{c: cfg[c] for c in history.CONFIG_COLUMNS}, "class": cls, **keys,
            "workload": wl["summary"] if wl else None, "input_mean": wl["input_mean"] if wl else None,
            "output_tokens": wl["output_tokens"] if wl else None, "runs": len(values), "median": median, "p25": p25,
            "p75": p75, "min": values[0], "max": values[-1], "spread": (p75 - p25) / median if median else None,
            "last_measured": max(t for _, t in found),
        })
    out.sort(key=lambda r: (r["class"], -r["median"], r["config_id"], *(r[k] for k in KEYS)))
    return out


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in frame.to_dict("records")]


CASES: list[dict[str, Any]] = [
    {}, {"service_class": "standard"}, {"model": "qwen3-8b", "gpu": "H200"}, {"layout": "disaggregated"},
    {"simulated": False}, {"backend": "sim", "ttft_ms": 300.0}, {"input_tokens": (2000, 4000)},
    {"since_days": 90}, {"since_days": 200, "model": "llama-3.1-70b", "service_class": "agent"},
    {"observed_engine": "v0.11.0"}, {"observed_engine": "sim-0.1", "service_class": "interactive"},
    {"observed_gpu": "H100", "layout": "colocated"}, {"observed_gpu": "H200", "since_days": 120, "simulated": True},
    {"model": "no-such-model"}, {"observed_engine": "no-such-engine"},
]


@pytest.mark.parametrize("seeded", ["sqlite_url", "pg_url"], indirect=True)
def test_capacity_by_config_equals_the_direct_computation(seeded: Store) -> None:
    for case in CASES:
        frame = seeded.capacity_by_config(**case)
        assert list(frame.columns) == list(history.BY_CONFIG_COLUMNS)
        assert _records(frame) == _direct(seeded, **case), case
        if not frame.empty:
            assert frame["simulated"].dtype == bool and str(frame["last_measured"].dt.tz) == "UTC"
            assert frame["config_id"].dtype == "int64" and frame["runs"].dtype == "int64"
    assert len(seeded.capacity_by_config()) > 100  # a history with many groups
    sig = seeded.workload_signatures()[0]["sha256"]
    whole = seeded.capacity_by_config(since_days=10_000)
    got = seeded.capacity_by_config(workload=sig[:8], since_days=10_000)
    assert got.to_dict("records") == whole[whole["workload_sha256"] == sig].reset_index(drop=True).to_dict("records")


@pytest.mark.parametrize("seeded", ["sqlite_url", "pg_url"], indirect=True)
def test_capacity_per_gpu_equals_pandas(seeded: Store) -> None:
    columns = ["gpu", "model", "class", "workload_sha256", "workload", "simulated", "configs", "runs", "best_per_gpu",
               "best_config_id", "best_label", "median_per_gpu", "last_measured"]
    for case in ({}, {"service_class": "standard"}, {"since_days": 100}, {"observed_engine": "v0.10.2"}):
        got = seeded.capacity_per_gpu(**case)
        want = history_frame.per_gpu_pandas(seeded.capacity_by_config(**case), columns)
        pd.testing.assert_frame_equal(got, want, check_exact=True)
        assert len(got) > 4


def _direct_points(store: Store, **filters: Any) -> list[tuple[Any, ...]]:
    """load_points straight from the documents: the run's keys from any of its capacities."""
    with store.engine.connect() as conn:
        keys: dict[int, tuple[str | None, int | None]] = {}
        for run_id, sha, sim in conn.execute(sa.select(Capacity.run_id, Capacity.workload_sha256, Capacity.simulated)):
            old = keys.get(run_id, (None, None))
            keys[run_id] = (max(filter(None, (old[0], sha)), default=None),
                            max((x for x in (old[1], None if sim is None else int(sim)) if x is not None), default=None))
        out = []
        stmt = (sa.select(LoadPoint, Run, DeploymentConfig).join(Run, Run.id == LoadPoint.run_id)
                .join(DeploymentConfig, DeploymentConfig.id == Run.config_id))
        with Session(store.engine) as s:
            for p, run, dc in s.execute(stmt).tuples():
                sha, sim = keys.get(run.id, (None, None))
                tpot = ((p.percentiles or {}).get("tpot_s") or {}).get("p50")
                if not (run.valid and run.status == "done" and p.valid and p.offered_rate is not None
                        and p.throughput_tok_s is not None and sha is not None):
                    continue
                if not (isinstance(tpot, int | float) and tpot > 0):
                    continue
                if filters.get("model") not in (None, dc.model) or filters.get("simulated") not in (None, bool(sim)):
                    continue
                out.append((dc.id, dc.label, dc.model, dc.gpu, dc.gpus, sha, bool(sim), run.id, p.id, p.offered_rate,
                            p.throughput_tok_s, float(tpot)))
    return sorted(out, key=repr)


@pytest.mark.parametrize("seeded", ["sqlite_url", "pg_url"], indirect=True)
def test_load_points_equal_the_direct_computation(seeded: Store) -> None:
    for case in ({}, {"model": "qwen3-8b"}, {"simulated": True}):
        frame = seeded.load_points(**case)
        got = sorted((tuple(r[:-1]) for r in frame.itertuples(index=False)), key=repr)
        assert got == _direct_points(seeded, **case), case
        assert math.inf in set(frame["tpot_p50_s"]) or case  # "Infinity" counts as a TPOT, as before
        assert frame["simulated"].dtype == bool and frame["run_id"].dtype == "int64" == frame["point_id"].dtype
        assert frame["tpot_p50_s"].dtype == "float64" and (frame["tpot_p50_s"] > 0).all()


def test_columnar_fetch_falls_back_on_a_null_or_a_separator(pg_url: str) -> None:
    """history_frame.fetch_columns (PostgreSQL) reads numbers and text exactly, and says None
    (the caller then fetches rows) when a number is NULL or a text holds its separator."""

    engine = create_engine(pg_url)
    try:
        with engine.connect() as conn:
            def fetch(rows: str) -> Any:
                src = sa.text(f"select * from (values {rows}) as v(i, x, t)").columns(
                    sa.column("i", sa.BigInteger), sa.column("x", sa.Double), sa.column("t", sa.Text)).subquery()
                return history_frame.fetch_columns(conn, src, [(src.c.i, "int8"), (src.c.x, "float8"), (src.c.t, "text")])

            got = fetch("(1::bigint, 0.1::float8, 'a'::text), (2, 1e300, ''), (3, -0.0, 'é b')")
            assert got is not None
            assert got[0].tolist() == [1, 2, 3] and got[1].tolist() == [0.1, 1e300, -0.0] and got[2] == ["a", "", "é b"]
            assert fetch("(1::bigint, null::float8, 'a'::text), (2, 1.0, 'b')") is None
            assert fetch("(1::bigint, 1.0::float8, 'a' || chr(31) || 'b')") is None
            assert fetch("(1::bigint, 1.0::float8, 'a'::text)") is not None
    finally:
        engine.dispose()
