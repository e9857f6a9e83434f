"""Sweeps in incomplete blocks (issue 32: at most a stated number of arms per block, the baseline
in every block): which arms each block runs, their order, the plan's validation, the bars'
blocks and the effects from a real (fake-store) judgement."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path

import pytest
import yaml

from orchestrator.analysis.balance import order_balance
from orchestrator.control.design import design_warnings, look_step, plan_order
from orchestrator.control.effects import experiment_effects
from orchestrator.control.verdicts import judge_experiment
from orchestrator.errors import PlanError
from orchestrator.plan import load_plan_file, plan_hash, plan_warnings, validate_plan
from orchestrator.plan.incomplete import (
    balance_unit,
    block_arms,
    blocks_problem,
    runs_per_arm,
    shared_blocks,
)
from tests.support.capacity_store import CapacityStore

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "examples" / "sweep.yaml"
LETTERS = "ABCDEFGHIJKLMNOP"


def incomplete(blocks: int = 10, per_block: int = 3, **design: object) -> dict:
    """examples/sweep.yaml (6 arms) with at most ``per_block`` arms per block."""
    data = yaml.safe_load(SWEEP.read_text())
    data["sweep"]["max_arms_per_block"] = per_block
    data["design"] = {**data["design"], "blocks": blocks, **design}
    return data


def problems_of(data: dict) -> list[str]:
    with pytest.raises(PlanError) as e:
        validate_plan(data)
    return [str(p) for p in e.value.plan_problems]


# --- which arms each block runs --------------------------------------------------------------------


@pytest.mark.parametrize(("n", "k"), [(n, k) for n in range(3, 17) for k in range(2, n)])
def test_every_block_holds_the_baseline_and_every_other_arm_runs_equally_often(n: int, k: int) -> None:
    arms = LETTERS[:n]
    unit = balance_unit(n, k)
    assert unit * (k - 1) % (n - 1) == 0  # a unit's slots are a whole number of rounds of the arms
    for blocks in (unit, 2 * unit, 3 * unit):
        held = block_arms(arms, k, blocks)
        assert len(held) == blocks
        assert all(h[0] == "A" and len(h) == k and len(set(h)) == k for h in held)
        counts = Counter(a for h in held for a in h[1:])
        assert set(counts) == set(arms[1:]) and len(set(counts.values())) == 1, counts
        assert counts["B"] == blocks * (k - 1) // (n - 1)
        assert runs_per_arm(arms, k, blocks) == {"A": blocks} | dict(counts)
    # No smaller count of blocks balances them: the unit is the least.
    assert all(blocks_problem(n, k, b) is not None for b in range(1, unit))


def test_the_blocks_follow_from_the_arms_and_their_number_alone() -> None:
    assert block_arms("ABCDEF", 3, 10) == block_arms("ABCDEF", 3, 10)
    assert block_arms("ABCDEF", 3, 10)[:5] == [("A", "B", "C"), ("A", "D", "E"), ("A", "F", "B"), ("A", "C", "D"),
                                              ("A", "E", "F")]
    # A pair of units holds the same blocks (so the second can run them in reverse) ...
    assert block_arms("ABCDEF", 3, 10)[5:] == block_arms("ABCDEF", 3, 10)[:5]
    # ... and the next pair reads the arms with another stride: over 20 blocks every two of the
    # five non-baseline arms share exactly two blocks.
    together = Counter(frozenset(p) for h in block_arms("ABCDEF", 3, 20) for p in itertools.combinations(h[1:], 2))
    assert len(together) == 10 and set(together.values()) == {2}
    # Complete blocks: every arm, in the plan's order.
    assert block_arms("ABC", None, 2) == block_arms("ABC", 3, 2) == [("A", "B", "C")] * 2


def test_abba_over_a_pair_of_units_runs_every_arm_as_often_before_each_other_as_after() -> None:
    plan = validate_plan(incomplete(blocks=10))
    orders = [o for _, o in plan_order(plan)]
    assert [sorted(o) for o in orders] == [sorted(h) for h in plan.block_arms()]
    assert orders[5] == orders[0][::-1]  # the second unit: each block reversed
    for x, y in itertools.permutations(plan.arms, 2):
        assert order_balance(orders, arms=(x, y)).balanced, (x, y)
    assert design_warnings(plan.design, tuple(plan.arms), plan.per_block) == []
    # One unit alone does not cancel a drift: the warning says which way and the remedy.
    one = validate_plan(incomplete(blocks=5))
    (warning,) = design_warnings(one.design, tuple(one.arms), one.per_block)
    assert warning.startswith("design.blocks: the 5 incomplete blocks run ") and "use an even number of balance " \
        "units (10, 20, ... blocks" in warning


def test_a_randomized_order_permutes_each_blocks_own_arms_from_the_seed() -> None:
    a = plan_order(validate_plan(incomplete(order="randomized", seed=3)))
    assert a == plan_order(validate_plan(incomplete(order="randomized", seed=3)))
    assert a != plan_order(validate_plan(incomplete(order="randomized", seed=4)))
    assert [sorted(o) for _, o in a] == [sorted(h) for h in block_arms("ABCDEF", 3, 10)]


# --- the plan ------------------------------------------------------------------------------------


def test_a_number_of_blocks_that_cannot_balance_the_arms_is_one_line_naming_those_that_can() -> None:
    assert problems_of(incomplete(blocks=6)) == [
        "design.blocks: 6 blocks cannot hold the 5 non-baseline arms equally often at 2 per block "
        "(sweep.max_arms_per_block 3: A and 2 others): use a multiple of 5 blocks (5, 10, 15, ...)"]
    assert problems_of(incomplete(blocks=6, per_block=4)) == [
        "design.blocks: 6 blocks cannot hold the 5 non-baseline arms equally often at 3 per block "
        "(sweep.max_arms_per_block 4: A and 3 others): use a multiple of 5 blocks (5, 10, 15, ...)"]
    assert any(p.startswith("sweep.max_arms_per_block:") for p in problems_of(incomplete(per_block=1)))
    validate_plan(incomplete(blocks=15))


def test_a_bar_between_arms_that_never_share_a_block_is_refused_with_its_path() -> None:
    data = incomplete()
    data["bars"].append({**data["bars"][0], "id": "d-over-b", "compare": "D/B"})
    (line,) = problems_of(data)
    assert line.startswith("bars.1.compare: compare D/B: arms D and B never run in the same block (incomplete "
                           "blocks: 3 arms of 6 per block, baseline in every block)"), line
    assert not shared_blocks("ABCDEF", 3, 10, ("D", "B")) and shared_blocks("ABCDEF", 3, 10, ("F", "E")) == [4, 9]
    # Over 20 blocks (the next pair of units) D and B share blocks: the same bar is fine.
    data["design"]["blocks"] = 20
    validate_plan(data)


def test_a_complete_sweep_keeps_its_hash_and_an_incomplete_one_hashes_apart() -> None:
    plan = load_plan_file(SWEEP)
    data = yaml.safe_load(SWEEP.read_text())
    data["sweep"]["max_arms_per_block"] = 6  # every arm: complete blocks, as without it
    same = validate_plan(data)
    assert same.per_block is None and same.block_arms() == plan.block_arms()
    assert plan.planned_runs == 36 and plan.per_block is None
    cut = validate_plan(incomplete())
    assert cut.per_block == 3 and cut.planned_runs == 30
    assert plan_hash(cut) != plan_hash(plan) != plan_hash(same)


def test_too_few_incomplete_blocks_for_an_error_estimate_is_warned() -> None:
    # Two arms per block over one unit: each of the five arms once against A, nothing left over.
    data = incomplete(blocks=5, per_block=2)
    data["bars"][0]["compare"] = "F/A"  # two arms a block: every bar is against A
    warned = [w for w in plan_warnings(validate_plan(data)) if "no degrees of freedom" in w]
    assert warned and warned[0].startswith("design.blocks: 5 incomplete blocks of 2 arms leave no degrees")
    data["design"]["blocks"] = 10
    assert not [w for w in plan_warnings(validate_plan(data)) if "no degrees of freedom" in w]


def test_sequential_looks_step_by_a_balance_unit() -> None:
    plan = validate_plan(incomplete(blocks=20, sequential={"min_blocks": 4}))
    assert look_step(plan) == 5
    assert look_step(load_plan_file(SWEEP)) == 6  # complete: a Williams design of 6 arms


# --- bars and effects from the stored runs ---------------------------------------------------------


# ln effect of each arm against A: mns 4/16/64 x replicas 1/2 (A..F), with an interaction.
TRUTH = {"A": 0.0, "B": 0.7, "C": 0.4, "D": 1.0, "E": 0.2, "F": 0.8}


def _caps(plan, drop: tuple[tuple[int, str], ...] = ()) -> dict[tuple[int, str], float]:
    """Every planned run's capacity: the block's level (large, different per block) times the arm's."""
    out = {(b, a): 300.0 * (1 + 0.3 * b) * math.exp(TRUTH[a]) for b, held in enumerate(plan.block_arms())
           for a in held}
    for key in drop:
        del out[key]
    return out


def test_a_bar_rests_on_the_blocks_that_run_both_its_arms_and_names_the_design() -> None:
    plan = validate_plan(incomplete())
    (o,) = judge_experiment(CapacityStore(_caps(plan, drop=((9, "E"),))), 1, plan)
    assert o.bar.compare == "F/E" and o.blocks == [4]  # E and F share blocks 4 and 9; 9 lost its E
    assert o.dropped == {9: "arm E not run yet"}  # the blocks without the pair are never "dropped"
    assert o.judgement.estimate == pytest.approx(math.exp(TRUTH["F"] - TRUTH["E"]))
    assert ("incomplete blocks: 3 arms of 6 per block, baseline in every block: F and E run together in 2 of 10 "
            "blocks") in o.judgement.note


def test_effects_of_incomplete_blocks_cancel_the_block_effect_and_keep_what_each_block_measured() -> None:
    plan = validate_plan(incomplete())
    clean = experiment_effects(CapacityStore(_caps(plan)), 1, plan)
    assert clean is not None and clean.design == "incomplete blocks: 3 arms of 6 per block, baseline in every block"
    got = {(e.kind, e.levels): e for e in clean.effects}
    assert got[("main", ("2",))].ratio == pytest.approx(math.exp(((0.7 - 0) + (1.0 - 0.4) + (0.8 - 0.2)) / 3))
    assert got[("interaction", ("64", "2"))].ratio == pytest.approx(math.exp(0.8 - 0.2 - 0.7))
    assert all(e.blocks == 10 and e.lower is not None and e.lower < e.ratio < (e.upper or 0) for e in clean.effects)
    doc = clean.to_dict()
    assert doc["design"] == clean.design and doc["method"].startswith("intrablock least squares")
    # A block whose C has no point capacity keeps its A and B; one without A's is left out.
    holes = experiment_effects(CapacityStore(_caps(plan, drop=((0, "C"), (1, "A")))), 1, plan)
    assert holes is not None and {e.blocks for e in holes.effects} == {9}
    assert holes.left_out == {"standard": {
        0: "no point capacity of C: left out of this block (the rest kept)",
        1: "no point capacity of A: no arm of it measured against A"}}
    # A complete sweep stores what it always has (no design, no method).
    assert "design" not in experiment_effects(CapacityStore(_caps(load_plan_file(SWEEP))), 1, load_plan_file(SWEEP)).to_dict()


def test_a_sequential_incomplete_design_looks_after_whole_units_of_the_blocks_run() -> None:
    data = incomplete(blocks=20, sequential={"min_blocks": 4})
    data["bars"] = [{**data["bars"][0], "compare": "F/A"}]
    plan = validate_plan(data)
    run = {k: v for k, v in _caps(plan).items() if k[0] < 7}  # 7 blocks run: one whole unit and a part
    (o,) = judge_experiment(CapacityStore(run), 1, plan)
    assert o.look is not None and (o.look.looks, o.look.planned) == (4, 20)  # at 5, 10, 15 and 20 blocks
    assert o.look.blocks == 5 and o.blocks == [2, 4]  # the first look: F and A share blocks 2 and 4 of it
