"""A censored or unconverged capacity is a bound, never a point in a history median (DESIGN
section 7): history, its summaries and a run's trend leave it out, on both databases."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.plan import validate_plan
from orchestrator.store import Store

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


def test_history_counts_point_estimates_only(db_url: str) -> None:
    data = yaml.safe_load(QUICKSTART.read_text())
    data["name"] = "censored-history"
    plan = validate_plan(data)
    with Store.open(db_url) as store:
        exp = store.create_experiment(store.register_plan(plan).id)
        cfg = store.deployment_config(plan, "A")
        kinds = [(100.0, None, True), (300.0, None, True), (9000.0, "at_ceiling", True),
                 (1.0, "below_min", True), (5000.0, None, False)]
        for block, (cap, censored, converged) in enumerate(kinds):
            run = store.start_run(exp, "A", block, 0, 0, cfg)
            store.record_capacity(run, "interactive", cap, 2.0, 0.95, 5, censored=censored,
                                  converged=converged, upper=None if censored else cap)
            store.finish_run(run, "done", True, None, {"backend": "sim"})
        (row,) = store.capacity_by_config(model="qwen3-8b", service_class="interactive").to_dict("records")
        assert row["runs"] == 2 and row["median"] == 200.0 and row["max"] == 300.0
        # Live aggregate over a time range (no summaries) agrees.
        (live,) = store.capacity_by_config(model="qwen3-8b", service_class="interactive",
                                           since_days=30).to_dict("records")
        assert live["runs"] == 2 and live["median"] == 200.0
        trend = store.config_trend(cfg, "interactive")
        assert sorted(trend["capacity"]) == [100.0, 300.0]
        # Rebuilt from scratch, the summaries say the same.
        store.rebuild_capacity_summaries()
        (again,) = store.capacity_by_config(model="qwen3-8b", service_class="interactive").to_dict("records")
        assert again["runs"] == 2 and again["median"] == 200.0
