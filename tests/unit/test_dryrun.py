"""The dry run (orchestrator.control.dryrun): capacities from virtual-time capacity searches,
predicted verdicts over the plan's blocks, power and GPU-hours."""

from __future__ import annotations

import json
import math

import pytest

from orchestrator.control.dryrun import (
    DEPLOY_S,
    DRY_RUN_NOISE,
    predicted_capacity_rates,
    simulate_plan,
)
from orchestrator.plan import Plan


def small_plan(replicas_a: int = 1, replicas_b: int = 2, noise: float = 0.0, at_least: float = 1.5) -> Plan:
    engine = {"max_num_seqs": 64, "max_num_batched_tokens": 2048}
    return Plan.model_validate({
        "name": "dryrun-test",
        "model": "qwen3-8b",
        "arms": {
            "A": {"gpu": "H200", "layout": "colocated", "replicas": replicas_a, "tp": 1, "engine": engine},
            "B": {"gpu": "H200", "layout": "colocated", "replicas": replicas_b, "tp": 1, "engine": engine},
        },
        "workload": {"prompts": {"input_tokens": {"mean": 400}, "conversations": 500},
                     "output_tokens": 32},
        "classes": ["standard"],
        "search": {"rate": {"min": 1, "max": 256}, "precision": 0.05, "point_s": 5, "warmup_s": 1,
                   "cooldown_s": 1, "max_points": 8},
        "design": {"blocks": 3, "seed": 3},
        "bars": [{"id": "standard-capacity", "class": "standard", "at_least": at_least}],
        "sim": {"noise": noise},
    })


@pytest.fixture(scope="module")
def result():
    return simulate_plan(small_plan(), replications=50)


def test_predicted_rates_are_positive_reproducible_and_grow_with_replicas() -> None:
    plan = small_plan()
    rates = predicted_capacity_rates(plan)
    assert set(rates) == {"A", "B"} and set(rates["A"]) == {"standard"}
    assert all(r > 0 for arm in rates.values() for r in arm.values())
    assert predicted_capacity_rates(plan) == rates
    assert rates["B"]["standard"] > 1.5 * rates["A"]["standard"]


def test_capacities_positive_and_two_replicas_above_one(result) -> None:
    a = result.arms["A"].classes["standard"]
    b = result.arms["B"].classes["standard"]
    assert a.capacity_tok_s > 0 and a.at_rate is not None
    assert b.capacity_tok_s > 1.5 * a.capacity_tok_s
    assert result.arms["A"].gpus == 1 and result.arms["B"].gpus == 2


def test_same_seed_same_result_other_seed_other_draws() -> None:
    plan = small_plan()
    one = simulate_plan(plan, replications=20, seed=11).to_dict()
    two = simulate_plan(plan, replications=20, seed=11).to_dict()
    one.pop("elapsed_s"), two.pop("elapsed_s")
    assert one == two
    other = simulate_plan(plan, replications=20, seed=12).to_dict()
    assert other["bars"][0]["block_ratios"] != one["bars"][0]["block_ratios"]


def test_verdict_fields_power_and_default_noise_note(result) -> None:
    doc = result.to_dict()
    (bar,) = doc["bars"]
    for key in ("verdict", "estimate", "lower", "upper", "blocks", "power", "noise_free_ratio", "block_ratios"):
        assert key in bar
    assert bar["verdict"] in ("ACCEPT", "REJECT", "INCONCLUSIVE")
    assert bar["blocks"] == 3 and len(bar["block_ratios"]) == 3
    assert bar["lower"] <= bar["estimate"] <= bar["upper"]
    # Two replicas against one clear a 1.5x bar: the design has power, and the predicted run
    # over 3 blocks accepts.
    assert bar["noise_free_ratio"] > 1.5
    assert bar["power"] > 0.5 and bar["verdict"] == "ACCEPT"
    assert doc["noise"] == {"sigma": DRY_RUN_NOISE, "source": "dry-run default"}
    assert any("sim.noise is 0" in n for n in doc["notes"])


def test_a_bar_out_of_reach_has_no_power() -> None:
    res = simulate_plan(small_plan(at_least=4.0, noise=0.02), replications=30)
    (bar,) = res.bars
    assert res.noise == 0.02 and res.noise_source == "plan"
    assert bar.power == 0.0 and bar.judgement.verdict != "ACCEPT"
    assert bar.blocks_for_power is None and "does not clear" in bar.blocks_note


def test_gpu_hours_count_gpus_points_and_deploys(result) -> None:
    plan = small_plan()
    s = plan.search
    per_point = s.warmup_s + s.point_s + s.cooldown_s
    for name, arm in result.arms.items():
        assert arm.points_per_run >= 2
        # deploy + each point's warm-up, window and cool-down (+ a drain of at most 60 s)
        low = DEPLOY_S + arm.points_per_run * per_point
        assert low <= arm.run_wall_s <= low + 60 * arm.points_per_run
        assert result.gpu_hours_per_arm[name] == pytest.approx(arm.gpus * arm.run_wall_s * 3 / 3600)
    assert result.gpu_hours == pytest.approx(sum(result.gpu_hours_per_arm.values()))
    assert math.isfinite(result.wall_hours) and result.wall_hours > 0


def test_closed_loop_plan_is_refused() -> None:
    doc = small_plan().model_dump(by_alias=True)
    doc["workload"]["arrival"] = None
    doc["workload"]["closed"] = {"users": 8}
    doc["bars"] = []
    plan = Plan.model_validate(doc)
    assert predicted_capacity_rates(plan) == {}
    with pytest.raises(ValueError, match="open-loop"):
        simulate_plan(plan)


def test_an_odd_abba_design_is_warned_about_in_the_dry_run_and_plan_validate(result, tmp_path, capsys) -> None:
    """Issue 17: ABBA over an odd number of blocks leaves a linear drift in the mean log ratio
    (analysis.balance.order_balance); the dry run's notes and `orch plan validate` say so."""
    from orchestrator.cli.main import main

    assert any("2 run A first and 1 the other way" in n and "even number of blocks" in n for n in result.notes)
    odd = tmp_path / "odd.yaml"
    even = tmp_path / "even.yaml"
    doc = small_plan().model_dump(mode="json", by_alias=True)
    odd.write_text(json.dumps(doc))
    doc["design"]["blocks"] = 4
    even.write_text(json.dumps(doc))
    assert main(["plan", "validate", str(odd)]) == 0
    err = capsys.readouterr().err
    assert "warning: design.blocks: 3 blocks used: 2 run A first" in err and "+0.333 d" in err
    assert main(["plan", "validate", str(even), "--json"]) == 0
    out = capsys.readouterr()
    assert "design.blocks" not in out.err and not any("design.blocks" in w for w in json.loads(out.out)["plans"][0]["warnings"])
    doc["design"] = {"blocks": 3, "order": "randomized", "seed": 3}
    odd.write_text(json.dumps(doc))
    assert main(["plan", "validate", str(odd)]) == 0
    assert "design.blocks: 3 blocks used" not in capsys.readouterr().err  # ABBA only


def test_both_arms_at_zero_are_no_ratio_in_the_dry_run() -> None:
    """0/0 is not ln 1: a block where neither arm has any capacity gives no ratio, and the
    predicted verdict cannot accept on it."""
    from orchestrator.analysis.blocks import BlockRatio
    from orchestrator.analysis.stats import judge
    from orchestrator.control.dryrun import _log_ratio, _ratio

    r = _log_ratio(0.0, 0.0, 2)
    assert isinstance(r, BlockRatio) and r.block == 2 and r.interval == (-math.inf, math.inf)
    assert math.isnan(_ratio(r)) and _ratio(_log_ratio(0.0, 5.0)) == 0.0
    assert _log_ratio(6.0, 3.0) == pytest.approx(math.log(2))
    j = judge([_log_ratio(0.0, 0.0, k) for k in range(4)], 0.97, 0.95)
    assert j.verdict == "INCONCLUSIVE" and "0/0 is not 1" in j.note
