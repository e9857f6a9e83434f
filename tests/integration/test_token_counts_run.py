"""A load point measured by the controller (control/points.py) judges and stores the
prompt-length guard: the simulated server reports usage.prompt_tokens, the records keep it, and
the guard row carries the plan's tolerance. One arm, one point (no warm-up, no search). Only the
prompt-length guard is asserted: it depends on the server's counts, not on timing (the point's
other guards may fail on a loaded machine, and are right to)."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.backends.base import RunKey
from orchestrator.backends.sim import SimBackend
from orchestrator.control.points import PointRunner
from orchestrator.plan import validate_plan
from orchestrator.store import Store

ROOT = Path(__file__).resolve().parents[2]


def test_a_measured_point_stores_the_prompt_length_guard(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "examples" / "open-vs-closed.yaml").read_text())
    data["name"] = "token-counts"
    data["workload"] = {"arrival": {"process": "poisson"}, "output_tokens": 8,
                        "prompts": {"input_tokens": {"mean": 300, "dist": "uniform", "sigma": 0.5},
                                    "conversations": 100000}}
    data["bars"] = [{"id": "cap", "metric": "capacity", "class": "standard", "at_least": 1.1}]
    data["search"] = {"rate": {"min": 0.5, "max": 8}, "point_s": 1.5, "warmup_s": 0.3, "cooldown_s": 0}
    # The guard under test, tighter than its default (0.05); every other bound is the default.
    data["guards"] = {"prompt_length_tolerance": 0.02}
    plan = validate_plan(data)
    backend = SimBackend(tmp_path / "sim")
    with Store.open(f"sqlite:///{tmp_path / 'orch.sqlite'}") as store:
        reg = store.register_plan(plan)
        exp = store.create_experiment(reg.id)
        run = store.start_run(exp, "A", 0, 0, 0, store.deployment_config(plan, "A"))
        dep = backend.deploy(plan, "A", RunKey("token-counts", "A", 0))
        try:
            backend.ready(dep, 120)
            runner = PointRunner(store, backend, plan, tmp_path / "spool", None)
            out = runner.measure(dep, run, "A", 0, 0, 6.0, "standard")
        finally:
            backend.teardown(dep)
        (g,) = [g for g in store.guard_results(run) if g.name == "prompt_length"]
        assert g.point_id == out.point_id and g.passed and g.value == 0.0 and g.threshold == 0.02, g
        assert any(x.name == "prompt_length" for x in out.guards)
        recs = [r for r in store.requests(out.point_id) if r.phase == "measure" and r.finished]
        assert recs and all(r.server_prompt_tokens == r.prompt_tokens for r in recs)
