"""Comparable history (issue 20, item 1): capacities are grouped by configuration *and* workload
signature, class limits, backend and simulated-or-measured; never pooled across them; migration
0007 back-fills the keys of a database made by 0006."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml

from orchestrator.plan import Plan, validate_plan
from orchestrator.plan.signature import workload_signature
from orchestrator.store import Store
from orchestrator.store.database import create_engine, downgrade, upgrade

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


def _plan(name: str, backend: str = "sim", output_tokens: int = 64, classes: list[Any] | None = None) -> Plan:
    data = yaml.safe_load(QUICKSTART.read_text())
    data["name"], data["backend"] = name, backend
    data["workload"]["output_tokens"] = output_tokens
    if classes is not None:
        data["classes"] = classes
        data["bars"] = []
    return validate_plan(data)


def _runs(store: Store, plan: Plan, caps: list[float], engine: str = "v0.11.0") -> int:
    """Arm A of ``plan`` measured once per capacity (valid, done); returns its config id."""
    exp = store.create_experiment(store.register_plan(plan).id)
    cfg = store.deployment_config(plan, "A")
    for block, cap in enumerate(caps):
        run = store.start_run(exp, "A", block, 0, 0, cfg)
        store.record_capacity(run, "interactive", cap, 3.0, 0.91, 6)
        store.finish_run(run, "done", valid=True,
                         fingerprint={"engine_version": engine, "gpu_products": ["NVIDIA H200"]})
    return cfg


def _groups(frame: Any) -> list[tuple[Any, ...]]:
    return sorted((bool(r["simulated"]), r["backend"], r["ttft_ms"], r["workload"], r["runs"], r["median"])
                  for r in frame.to_dict("records"))


@pytest.fixture
def store(db_url: str):
    with Store.open(db_url) as s:
        yield s


def test_simulated_and_measured_runs_of_one_arm_stay_apart(store: Store) -> None:
    cfg = _runs(store, _plan("sim"), [1000.0, 1200.0], engine="sim-0.1")
    assert _runs(store, _plan("real", backend="local"), [600.0, 700.0, 800.0]) == cfg  # the same arm
    # simulated engines behind a non-sim backend (the emulated cluster): simulated by the fingerprint
    _runs(store, _plan("kube-sim", backend="kubernetes"), [5000.0], engine="sim-0.1")
    for since in (None, 30.0):  # the summaries and the live aggregate agree
        frame = store.capacity_by_config(service_class="interactive", since_days=since)
        assert set(frame["config_id"]) == {cfg}
        wl = "in 3000±900 / out 64 / prefix 0.2 / poisson"
        assert _groups(frame) == [(False, "local", 300.0, wl, 3, 700.0),
                                  (True, "kubernetes", 300.0, wl, 1, 5000.0), (True, "sim", 300.0, wl, 2, 1100.0)]
        measured = store.capacity_by_config(simulated=False, since_days=since)
        assert measured[["runs", "median"]].values.tolist() == [[3, 700.0]]
    assert store.capacity_by_config(observed_engine="sim-0.1")["runs"].sum() == 3
    assert store.capacity_by_config(observed_gpu="H200", simulated=False)["median"].tolist() == [700.0]
    assert store.capacity_by_config(observed_gpu="B200").empty


def test_two_workloads_of_one_arm_stay_apart(store: Store) -> None:
    short, long = _plan("short", backend="local"), _plan("long", backend="local", output_tokens=256)
    cfg = _runs(store, short, [600.0, 700.0])
    assert _runs(store, long, [2000.0]) == cfg
    frame = store.capacity_by_config(service_class="interactive")
    assert sorted(zip(frame["output_tokens"], frame["runs"], frame["median"], strict=True)) == [
        (64.0, 2, 650.0), (256.0, 1, 2000.0)]
    sig = workload_signature(long.workload).sha256
    assert set(frame["workload_sha256"]) == {workload_signature(short.workload).sha256, sig}
    assert store.capacity_by_config(workload=sig[:8])["median"].tolist() == [2000.0]
    assert store.capacity_by_config(output_tokens=(100, None))["median"].tolist() == [2000.0]
    assert store.capacity_by_config(input_tokens=(2000, 4000), output_tokens=(0, 64))["median"].tolist() == [650.0]
    assert store.capacity_by_config(input_tokens=(4000, None)).empty


def test_a_redefined_class_stays_apart(store: Store) -> None:
    builtin = _plan("builtin", backend="local")
    redefined = _plan("redefined", backend="local", classes=[{"name": "interactive", "ttft_ms": 500, "tpot_ms": 20}])
    _runs(store, builtin, [600.0])
    _runs(store, redefined, [900.0, 1000.0])
    frame = store.capacity_by_config(service_class="interactive")
    assert sorted(zip(frame["ttft_ms"], frame["tpot_ms"], frame["runs"], frame["median"], strict=True)) == [
        (300.0, 10.0, 1, 600.0), (500.0, 20.0, 2, 950.0)]
    assert store.capacity_by_config(ttft_ms=500.0)["median"].tolist() == [950.0]


def test_0007_back_fills_a_database_made_by_0006(db_url: str) -> None:
    engine = create_engine(db_url)
    upgrade(engine, "0006")
    store = Store(engine)  # at 0006: runs and capacities written with plain SQL, as 0006's store did
    plans = {"sim": _plan("sim"), "real": _plan("real", backend="local"),
             "slow": _plan("slow", backend="local", classes=[{"name": "interactive", "ttft_ms": 500, "tpot_ms": 20}])}
    caps = {"sim": [1000.0, 1200.0], "real": [600.0, 700.0, 800.0], "slow": [900.0]}
    made = {key: (store.create_experiment(store.register_plan(plan).id), store.deployment_config(plan, "A"))
            for key, plan in plans.items()}
    cfg = made["real"][1]
    with engine.begin() as conn:
        for key, (exp, config_id) in made.items():
            fp = json.dumps({"engine_version": "sim-0.1" if key == "sim" else "v0.11.0", "gpu_products": ["NVIDIA H200"]})
            for block, cap in enumerate(caps[key]):
                run = conn.execute(sa.text(
                    "insert into runs (experiment_id, config_id, arm, block, position, attempt, status, valid, "
                    "engine_version, fingerprint, started_at, finished_at) values (:e, :c, 'A', :b, 0, 0, 'done', "
                    "true, :v, :fp, :t, :t) returning id"),
                    {"e": exp, "c": config_id, "b": block, "v": json.loads(fp)["engine_version"], "fp": fp,
                     "t": f"2026-11-0{block + 1} 10:00:00"}).scalar_one()
                conn.execute(sa.text("insert into capacities (run_id, class_name, capacity, points_used) "
                                     "values (:r, 'interactive', :cap, 5)"), {"r": run, "cap": cap})
    upgrade(engine)
    sig = workload_signature(plans["real"].workload)
    with engine.connect() as conn:
        keys = conn.execute(sa.text(
            "select workload_sha256, ttft_ms, tpot_ms, backend, simulated, observed_gpu, observed_engine "
            "from capacities order by id")).all()
        summary = conn.execute(sa.text("select summary, output_tokens from workload_signatures")).one()
    assert [(k[0], k[1], k[2], k[3], bool(k[4]), k[5], k[6]) for k in keys] == (
        [(sig.sha256, 300.0, 10.0, "sim", True, "NVIDIA H200", "sim-0.1")] * 2
        + [(sig.sha256, 300.0, 10.0, "local", False, "NVIDIA H200", "v0.11.0")] * 3
        + [(sig.sha256, 500.0, 20.0, "local", False, "NVIDIA H200", "v0.11.0")])
    assert tuple(summary) == ("in 3000±900 / out 64 / prefix 0.2 / poisson", 64.0)
    store = Store(engine)
    frame = store.capacity_by_config()
    assert sorted(zip(frame["simulated"], frame["ttft_ms"], frame["runs"], frame["median"], strict=True)) == [
        (False, 300.0, 3, 700.0), (False, 500.0, 1, 900.0), (True, 300.0, 2, 1100.0)]
    # a run recorded after the migration joins its back-filled group (same keys at run time)
    _runs(store, plans["real"], [900.0])
    real = store.capacity_by_config(simulated=False, ttft_ms=300.0)
    assert (real.loc[0, "config_id"], real.loc[0, "runs"], real.loc[0, "median"]) == (cfg, 4, 750.0)
    downgrade(engine, "0006")  # pooled again, as 0006 kept it
    with engine.connect() as conn:
        assert conn.execute(sa.text("select runs from capacity_summaries")).scalars().all() == [7]
    engine.dispose()
