"""Sweeps in the plan language (issue 32, item 10): factors and levels over arm A's fields
expanded into the plan's arms; the canonical form and hash; one problem a line with its path."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import PlanError
from orchestrator.plan import (
    canonical_json,
    load_plan_file,
    plan_from_canonical,
    plan_hash,
    plan_warnings,
    validate_plan,
)
from orchestrator.plan.sweep import Sweep, arm_names, cells

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "examples" / "sweep.yaml"


def raw() -> dict:
    return yaml.safe_load(SWEEP.read_text())


def problems_of(data: dict) -> list[str]:
    with pytest.raises(PlanError) as e:
        validate_plan(data)
    return [str(p) for p in e.value.plan_problems]


def test_a_3x2_sweep_expands_to_six_arms_with_the_baseline_first() -> None:
    plan = load_plan_file(SWEEP)
    levels = {(a.engine.max_num_seqs, a.replicas) for a in plan.arms.values()}
    assert list(plan.arms) == list("ABCDEF")
    assert levels == {(m, r) for m in (4, 16, 64) for r in (1, 2)}  # every combination once
    assert (plan.arms["A"].engine.max_num_seqs, plan.arms["A"].replicas) == (4, 1)  # the first levels
    # What the sweep leaves alone is the base arm's in every arm.
    assert {a.engine.max_num_batched_tokens for a in plan.arms.values()} == {2048}
    assert plan.sweep is not None
    assert arm_names(plan.sweep, "ABCDEF") == {
        "A": "mns4-replicas1", "B": "mns4-replicas2", "C": "mns16-replicas1", "D": "mns16-replicas2",
        "E": "mns64-replicas1", "F": "mns64-replicas2"}
    # Judged by its effects, not by bars: no "no bar compares it" warning for a swept arm.
    assert not [w for w in plan_warnings(plan) if "no bar compares it" in w]


def test_the_expansion_is_stored_and_hashed_with_the_sweep_whatever_the_key_order() -> None:
    plan = load_plan_file(SWEEP)
    canonical = canonical_json(plan)
    assert '"sweep":{' in canonical and '"F":{' in canonical  # the declaration and the expanded arms
    assert plan_hash(plan_from_canonical(canonical)) == plan_hash(plan)
    data = raw()
    data["sweep"]["factors"] = dict(reversed(list(data["sweep"]["factors"].items())))
    again = validate_plan(data)
    assert plan_hash(again) == plan_hash(plan) and again.arms == plan.arms
    data["sweep"]["factors"]["replicas"] = [1, 4]  # another level: another plan
    assert plan_hash(validate_plan(data)) != plan_hash(plan)


def test_a_router_factor_starts_from_the_plans_router() -> None:
    data = raw()
    data["router"] = {"policy": "round_robin", "cache_threshold": 0.3}
    data["sweep"]["factors"] = {"router.policy": ["round_robin", "cache_aware"], "replicas": [1, 2]}
    data["bars"][0]["compare"] = "D/C"
    plan = validate_plan(data)
    # Factors in path order (replicas, router.policy), the last varying fastest.
    assert [(a.replicas, a.router.policy, a.router.cache_threshold) for a in plan.arms.values() if a.router] == [
        (1, "round_robin", 0.3), (1, "cache_aware", 0.3), (2, "round_robin", 0.3), (2, "cache_aware", 0.3)]
    assert plan.sweep is not None and arm_names(plan.sweep, "ABCD")["D"] == "replicas2-cache_aware"


def test_a_fractional_design_is_the_half_fraction_that_holds_the_baseline() -> None:
    sweep = Sweep(factors={"engine.prefix_caching": [False, True], "replicas": [1, 2], "engine.max_num_seqs": [8, 32]},
                  design="fractional")
    design = cells(sweep)
    assert len(design) == 4 and design[0] == (0, 0, 0)
    for f in range(3):  # every level of every factor twice; every pair of factors' levels once (resolution III)
        assert sorted(c[f] for c in design) == [0, 0, 1, 1]
        for g in range(f + 1, 3):
            assert sorted((c[f], c[g]) for c in design) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    data = raw()
    data["sweep"] = {"factors": {"engine.prefix_caching": [False, True], "replicas": [1, 2],
                                 "engine.max_num_seqs": [8, 32]}, "design": "fractional"}
    data["bars"][0]["compare"] = "B/A"
    assert len(validate_plan(data).arms) == 4


def test_every_problem_of_a_sweep_is_one_line_with_its_field_path() -> None:
    data = raw()
    data["sweep"]["factors"] = {"engine.max_num_sequences": [4, 8], "engine": [1, 2], "replicas": [1, 0]}
    got = problems_of(data)
    assert any(p.startswith("sweep.factors.engine.max_num_sequences: 'max_num_sequences' is not a field of arm "
                            "field engine") for p in got), got
    assert any(p.startswith("sweep.factors.engine: arm field engine is a section") for p in got), got
    assert all("\n" not in p for p in got)

    data = raw()
    data["sweep"]["factors"]["replicas"] = [1, 0]
    assert problems_of(data) == ["sweep.factors.replicas.1: level 0: Input should be greater than or equal to 1"]

    data = raw()
    data["sweep"]["factors"]["tp"] = [1, 2]
    data["sweep"]["factors"]["engine.max_num_batched_tokens"] = [1024, 2048]
    (line,) = problems_of(data)
    assert line.startswith("sweep.factors: the full design of 2 x 3 x 2 x 2 levels makes 24 arms; a plan holds at most 16")

    data = raw()
    data["sweep"]["design"] = "fractional"
    got = problems_of(data)
    assert "sweep.factors.engine.max_num_seqs: a fractional design takes 2-level factors; this one has 3" in got
    assert any(p.startswith("sweep.design: a half fraction of 2 factors confounds") for p in got), got


def test_a_sweep_plan_writes_its_own_arms_and_needs_a_bar() -> None:
    data = raw()
    data["arms"]["B"] = copy.deepcopy(data["arms"]["A"])
    (line,) = problems_of(data)
    assert line.startswith("arms: a sweep plan gives one arm, A") and "remove arms B" in line
    data = raw()
    data["bars"] = []
    assert problems_of(data) == [
        "bars: a sweep's effects are stored with the verdicts of its bars: register at least one bar (e.g. the "
        "arm of every factor's last level over A)"]


def test_a_sweep_writes_up_to_16_arms_and_a_hand_written_plan_8() -> None:
    data = raw()
    data["sweep"]["factors"] = {"engine.max_num_seqs": [4, 8, 16, 32], "tp": [1, 2], "engine.prefix_caching": [True, False]}
    plan = validate_plan(data)
    assert list(plan.arms) == list("ABCDEFGHIJKLMNOP")
    data["sweep"]["factors"]["engine.max_num_seqs"].append(64)
    assert problems_of(data) == [
        "sweep.factors: the full design of 5 x 2 x 2 levels makes 20 arms; a plan holds at most 16 (A to P): drop a "
        "level or a factor, or use design: fractional"]
    by_hand = raw()
    del by_hand["sweep"]
    by_hand["arms"] = {k: copy.deepcopy(by_hand["arms"]["A"]) for k in "ABCDEFGHI"}
    assert problems_of(by_hand) == [
        "arms: at most 8 arms written by hand (A to H); a sweep (`sweep:`) writes up to 16 (A to P) from arm A"]
