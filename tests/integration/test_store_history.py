"""History queries: filters return what was stored, invalid and unfinished runs never count,
and PostgreSQL (aggregates in SQL) and SQLite (aggregates in pandas) give the same figures."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from orchestrator.plan import validate_plan
from orchestrator.store import Store
from orchestrator.store.appendonly import maintenance
from orchestrator.store.types import utcnow

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


def _plan(name: str, **arm_a: object):
    data = yaml.safe_load(QUICKSTART.read_text())
    data["name"] = name
    engine = arm_a.pop("engine", {})
    data["arms"]["A"].update(arm_a)
    data["arms"]["A"]["engine"].update(engine)
    return validate_plan(data)


def _seed(store: Store) -> dict[str, int]:
    """Arm A of three plans (H200 colocated auto-KV, H200 fp8-KV, H100 colocated) and arm B
    (H200 disaggregated). Capacities are chosen so medians and quartiles are known."""
    plans = {
        "h200": _plan("h200"),
        "h200-fp8": _plan("h200-fp8", engine={"kv_cache_dtype": "fp8"}),
        "h100": _plan("h100", gpu="H100"),
    }
    configs: dict[str, int] = {}
    for key, plan in plans.items():
        reg = store.register_plan(plan)
        exp = store.create_experiment(reg.id)
        configs[key] = store.deployment_config(plan, "A")
        configs["disagg"] = store.deployment_config(plan, "B")
        base = {"h200": 100.0, "h200-fp8": 1000.0, "h100": 10.0}[key]
        for block, mult in enumerate((1, 2, 4, 8)):
            for arm in ("A", "B"):
                cfg = configs[key] if arm == "A" else configs["disagg"]
                run = store.start_run(exp, arm, block, 0 if arm == "A" else 1, 0, cfg)
                cap = base * mult if arm == "A" else 5000.0 + block
                store.record_capacity(run, "interactive", cap, 2.0, 0.92, 5)
                store.record_capacity(run, "standard", 3 * cap, 6.0, 0.95, 5)
                store.finish_run(run, "done", valid=True)
        # evidence that must never count: an invalid run with a huge capacity, and one unfinished
        bad = store.start_run(exp, "A", 0, 0, 1, configs[key])
        store.record_capacity(bad, "interactive", 1e9, 2.0, 0.99, 5)
        store.finish_run(bad, "done", valid=False, invalid_reason="generator_lag")
        open_run = store.start_run(exp, "A", 0, 0, 2, configs[key])
        store.record_capacity(open_run, "interactive", 2e9, 2.0, 0.99, 5)
    return configs


@pytest.fixture
def seeded(db_url: str):
    store = Store.open(db_url)
    configs = _seed(store)
    yield store, configs
    store.close()


def test_capacity_by_config_counts_only_valid_finished_runs(seeded) -> None:
    store, configs = seeded
    frame = store.capacity_by_config(service_class="interactive")
    assert set(frame["config_id"]) == set(configs.values())
    assert frame["max"].max() < 1e6  # neither the invalid nor the unfinished run counted
    h200 = frame[frame["config_id"] == configs["h200"]].iloc[0]
    # capacities 100, 200, 400, 800: median 300, quartiles (linear) 175 and 500
    assert (h200["runs"], h200["median"], h200["p25"], h200["p75"]) == (4, 300.0, 175.0, 500.0)
    assert (h200["min"], h200["max"]) == (100.0, 800.0)
    assert h200["spread"] == pytest.approx((500 - 175) / 300)
    assert h200["last_measured"] is not None
    disagg = frame[frame["config_id"] == configs["disagg"]].iloc[0]
    assert disagg["runs"] == 12 and disagg["layout"] == "disaggregated"
    assert list(frame["median"]) == sorted(frame["median"], reverse=True)  # best first


def test_filters_return_exactly_what_was_stored(seeded) -> None:
    store, configs = seeded
    by_gpu = store.capacity_by_config(gpu="H100-SXM")
    assert set(by_gpu["config_id"]) == {configs["h100"]}
    assert sorted(by_gpu["class"]) == ["interactive", "standard"]
    assert by_gpu.set_index("class").loc["standard", "median"] == 3 * 30.0
    coloc = store.capacity_by_config(layout="colocated", gpu="H200", service_class="interactive")
    assert set(coloc["config_id"]) == {configs["h200"], configs["h200-fp8"]}
    fp8 = store.capacity_by_config(kv_cache_dtype="fp8")
    assert set(fp8["config_id"]) == {configs["h200-fp8"]}
    assert store.capacity_by_config(model="llama-3.1-70b").empty
    assert store.capacity_by_config(router_policy="round_robin", max_num_seqs=64, tp=1)["runs"].sum() == 2 * (4 * 3 + 12)
    assert store.capacity_by_config(engine_version="v0.12.0").empty


def test_all_time_summaries_equal_the_live_aggregate(seeded) -> None:
    store, configs = seeded
    summary = store.capacity_by_config()  # read from the summaries kept by the repository
    live = store.capacity_by_config(since_days=10_000)  # aggregated from every run
    assert len(summary) == 8
    assert summary.to_dict("records") == live.to_dict("records")
    # a running run's capacity re-recorded (a resumed search), the run finishing valid, an
    # experiment deleted: summaries follow (a finished run cannot change: migration 0006)
    open_run = next(r for r in store.runs(store.get_experiment("h100-1").id) if r.status == "running")
    store.record_capacity(open_run.id, "interactive", 50.0, 1.0, 0.9, 4)
    store.finish_run(open_run.id, "done", valid=True)
    store.delete_experiment(store.get_experiment("h200-fp8-1").id)
    after = store.capacity_by_config()
    assert after.to_dict("records") == store.capacity_by_config(since_days=10_000).to_dict("records")
    assert configs["h200-fp8"] not in set(after["config_id"])
    h100 = after[(after["config_id"] == configs["h100"]) & (after["class"] == "interactive")].iloc[0]
    assert (h100["runs"], h100["min"]) == (5, 10.0) and h100["median"] == 40.0


def test_summaries_can_be_rebuilt_after_edits_outside_the_store(seeded) -> None:
    store, configs = seeded
    before = store.capacity_by_config().to_dict("records")
    with store.engine.begin() as conn, maintenance(conn):  # finished runs are append-only (0006)
        conn.execute(sa.text("update runs set valid = false where config_id = :c"), {"c": configs["h100"]})
    assert store.capacity_by_config().to_dict("records") == before  # stale until rebuilt
    assert store.rebuild_capacity_summaries() == 6
    assert configs["h100"] not in set(store.capacity_by_config()["config_id"])


def test_since_keeps_only_recent_runs(seeded) -> None:
    store, configs = seeded
    with store.engine.begin() as conn, maintenance(conn):  # two of h200's blocks were measured 100 days ago
        ids = conn.execute(sa.text(
            "select id from runs where config_id = :c and valid and block in (2, 3)"), {"c": configs["h200"]}
        ).scalars().all()
        old = utcnow() - timedelta(days=100)
        for run_id in ids:
            conn.execute(sa.text("update runs set finished_at = :t where id = :id"),
                         {"t": old if store.engine.dialect.name != "sqlite" else old.replace(tzinfo=None),
                          "id": run_id})
    # an edit made outside the Store reaches history once the derived columns are rebuilt
    assert store.capacity_by_config(service_class="interactive", since_days=30).set_index(
        "config_id").loc[configs["h200"], "runs"] == 4
    store.rebuild_capacity_summaries()
    recent = store.capacity_by_config(service_class="interactive", since_days=30)
    h200 = recent[recent["config_id"] == configs["h200"]].iloc[0]
    assert (h200["runs"], h200["median"]) == (2, 150.0)
    everything = store.capacity_by_config(service_class="interactive", since_days=365)
    assert everything[everything["config_id"] == configs["h200"]].iloc[0]["runs"] == 4


def test_capacity_per_gpu_and_best_configuration(seeded) -> None:
    store, configs = seeded
    per_gpu = store.capacity_per_gpu(service_class="interactive").set_index("gpu")
    assert set(per_gpu.index) == {"H200", "H100-SXM"}
    # H200: disaggregated (2 GPUs, median 5001.5) beats fp8 colocated (2 GPUs, median 3000) per GPU
    assert per_gpu.loc["H200", "best_config_id"] == configs["disagg"]
    assert per_gpu.loc["H200", "best_per_gpu"] == pytest.approx(5001.5 / 2)
    assert per_gpu.loc["H200", "configs"] == 3
    assert per_gpu.loc["H100-SXM", "best_per_gpu"] == pytest.approx(30.0 / 2)
    best = store.best_config("interactive", gpu="H200", layout="colocated")
    assert best.loc[0, "config_id"] == configs["h200-fp8"] and len(best) == 1
    top = store.best_config("standard", top=5)
    assert list(top["config_id"])[:2] == [configs["disagg"], configs["h200-fp8"]]
    assert store.best_config("interactive", min_runs=5)["config_id"].tolist() == [configs["disagg"]]


def test_trend_lists_valid_runs_in_time_order(seeded) -> None:
    store, configs = seeded
    trend = store.config_trend(configs["h200"], "interactive")
    assert trend["capacity"].tolist() == [100.0, 200.0, 400.0, 800.0]
    assert list(trend["measured_at"]) == sorted(trend["measured_at"])
    assert set(trend["experiment"]) == {"h200-1"}
    both = store.config_trend(configs["h200"])
    assert sorted(set(both["class"])) == ["interactive", "standard"] and len(both) == 8
