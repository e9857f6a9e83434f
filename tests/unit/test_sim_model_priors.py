"""The search priors are the median of a few seeds' virtual searches: one short virtual search
near a knee moves 2x from seed to seed."""

from __future__ import annotations

from types import SimpleNamespace

from orchestrator.control import dryrun
from orchestrator.plan import load_plan_file
from tests.unit.test_sim_model_profiles import ROOT


def test_priors_are_the_median_of_prior_seeds_searches(monkeypatch) -> None:
    plan = load_plan_file(ROOT / "tests" / "e2e" / "plans" / "two-vs-one.yaml")
    seeds: list[int] = []
    by_seed = iter([2.4, 6.2, 5.7, 10.0, 11.0, 9.0])  # A's three searches, then B's

    class Fake:
        def __init__(self, plan, arm, windows, seed, efficiency=1.0, profile=None):
            seeds.append(seed)

        def search_all(self, priors=None):
            return {"standard": SimpleNamespace(at_rate=next(by_seed), bracket=(None, None))}

    monkeypatch.setattr(dryrun, "ArmSimulator", Fake)
    assert dryrun.predicted_capacity_rates(plan) == {"A": {"standard": 5.7}, "B": {"standard": 10.0}}
    assert len(seeds) == 2 * dryrun.PRIOR_SEEDS and seeds[0] == plan.design.seed and len(set(seeds[:3])) == 3
