"""Plans of more than two arms: names and `compare` validated, a Williams order per block
(balanced for n = 2..8), each bar judged from its own pair, Holm over every bar, a dry run of
every arm. Two arms stay exactly as before."""

from __future__ import annotations

import copy
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.analysis.balance import order_balance
from orchestrator.analysis.stats import BarEvidence, judge_bars
from orchestrator.analysis.williams import (
    is_balanced,
    neighbour_counts,
    position_counts,
    rows_for,
    williams_orders,
    williams_rows,
)
from orchestrator.control.design import block_order, design_warnings
from orchestrator.control.verdicts import judge_experiment
from orchestrator.errors import PlanError
from orchestrator.plan import Design, load_plan_file, plan_hash, plan_warnings, validate_plan
from orchestrator.plan.loading import canonical_json
from tests.support.capacity_store import CapacityStore

ROOT = Path(__file__).resolve().parents[2]
THREE = ROOT / "examples" / "three-arms.yaml"
LETTERS = "ABCDEFGH"


def three() -> dict:
    return yaml.safe_load(THREE.read_text())


def problems_of(data: dict) -> list[str]:
    with pytest.raises(PlanError) as e:
        validate_plan(data)
    return list(e.value.problems)


# --- Williams designs ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(2, 9))
def test_williams_rows_balance_positions_and_neighbours(n: int) -> None:
    rows = williams_rows(n)
    assert len(rows) == rows_for(n) == (n if n % 2 == 0 else 2 * n)
    assert all(sorted(r) == list(range(n)) for r in rows)
    orders = [tuple(LETTERS[i] for i in r) for r in rows]
    arms = LETTERS[:n]
    per_position = len(rows) // n
    assert all(position_counts(orders)[(a, p)] == per_position for a in arms for p in range(n))
    # Every arm right before every other equally often: once (even n) or twice (odd n).
    neighbours = neighbour_counts(orders)
    assert {neighbours[(x, y)] for x in arms for y in arms if x != y} == {len(rows) // n}
    assert is_balanced(orders)
    # ... and so every pair's drift cancels: a linear drift adds nothing to any ratio.
    for x, y in itertools.permutations(arms, 2):
        assert order_balance(orders, arms=(x, y)).balanced


def test_two_arms_williams_is_ab_ba() -> None:
    assert williams_orders("AB", 4) == [("A", "B"), ("B", "A"), ("A", "B"), ("B", "A")]


def test_a_latin_square_alone_is_not_a_williams_design_for_odd_n() -> None:
    square = williams_orders("ABC", 3)  # the first 3 of 6 rows
    assert not is_balanced(square)  # neighbours unequal (A->B twice, B->A once)...
    assert all(order_balance(square, arms=pair).balanced for pair in itertools.permutations("ABC", 2))


# --- the run order -------------------------------------------------------------------------------


def test_abba_with_three_arms_cycles_the_williams_rows() -> None:
    order = block_order(Design(blocks=8, order="ABBA"), ("A", "B", "C"))
    assert [b for b, _ in order] == list(range(8))
    rows = ["ABC", "BCA", "CAB", "CBA", "ACB", "BAC"]
    assert ["".join(arms) for _, arms in order] == rows + rows[:2]


def test_two_arm_orders_are_unchanged() -> None:
    assert [a for _, a in block_order(Design(blocks=3, order="ABBA"), ("A", "B"))] == [["A", "B"], ["B", "A"], ["A", "B"]]
    plain = block_order(Design(blocks=12, order="randomized", seed=3))
    assert plain == block_order(Design(blocks=12, order="randomized", seed=3), ("A", "B"))


def test_randomized_three_arms_draws_a_permutation_per_block_from_the_seed() -> None:
    a = block_order(Design(blocks=12, order="randomized", seed=3), "ABC")
    assert a == block_order(Design(blocks=12, order="randomized", seed=3), "ABC")
    assert a != block_order(Design(blocks=12, order="randomized", seed=4), "ABC")
    assert all(sorted(arms) == ["A", "B", "C"] for _, arms in a)
    assert len({tuple(arms) for _, arms in a}) > 1


def test_design_warnings_name_the_blocks_a_balanced_order_needs() -> None:
    assert design_warnings(Design(blocks=6), "ABC") == []
    assert design_warnings(Design(blocks=12), "ABC") == []
    assert design_warnings(Design(blocks=4), "ABCD") == []
    (w,) = design_warnings(Design(blocks=4), "ABC")
    assert w.startswith("design.blocks: 4 blocks") and "multiple of 6 blocks" in w
    # randomized: the draw's own balance, pair by pair against A (issue 31; test_control_design)
    drawn = [o for _, o in block_order(Design(blocks=4, order="randomized"), "ABC")]
    shifts = {x: sum(o.index(x) - o.index("A") for o in drawn) for x in "BC"}
    warned = design_warnings(Design(blocks=4, order="randomized"), "ABC")
    for x in "BC":
        assert sum(f"ln({x}/A)" in w for w in warned) == (1 if shifts[x] else 0), (x, shifts, warned)
    assert design_warnings(Design(blocks=3)) and not design_warnings(Design(blocks=4))  # two arms: as before


def test_order_balance_of_a_pair_is_the_drift_it_leaves() -> None:
    d = 0.02
    for blocks, dropped in ((6, ()), (4, ()), (6, (1,)), (5, ())):
        orders = williams_orders("ABC", blocks)
        for x, y in itertools.permutations("ABC", 2):
            # A linear drift: the later run gains d per position; ln(y/x) gains d * (pos y - pos x).
            shift = [d * (o.index(y) - o.index(x)) for b, o in enumerate(orders) if b not in dropped]
            bal = order_balance(orders, dropped, arms=(x, y))
            assert np.mean(shift) == pytest.approx(bal.drift_weight * d)
            assert bal.balanced == (abs(sum(shift)) < 1e-12)
    odd = order_balance(williams_orders("ABC", 2), arms=("A", "C"))
    assert not odd.balanced and "ln(C/A)" in odd.warning and "multiple of 6 blocks" in odd.warning


# --- the plan ------------------------------------------------------------------------------------


def test_the_three_arm_example_validates_and_two_arm_plans_keep_their_hash() -> None:
    plan = load_plan_file(THREE)
    assert list(plan.arms) == ["A", "B", "C"]
    assert [b.compare for b in plan.bars] == ["B/A", "C/A", "C/B"]
    assert [b.pair for b in plan.bars] == [("B", "A"), ("C", "A"), ("C", "B")]
    assert plan_warnings(plan) == [] and design_warnings(plan.design, tuple(plan.arms)) == []
    quick = load_plan_file(ROOT / "examples" / "quickstart.yaml")
    assert plan_hash(quick) == "f83a1591c193d0f33249600bb8b412feefe9019c2aae48ec9b074f97ee0057e9"
    assert '"compare":"B/A"' in canonical_json(quick)


@pytest.mark.parametrize(
    ("arms", "ok"),
    [("AB", True), ("ABC", True), ("ABCDEFGH", True), ("A", False), ("AC", False), ("BC", False)],
)
def test_arms_are_consecutive_letters_from_a(arms: str, ok: bool) -> None:
    data = three()
    base = data["arms"]["A"]
    data["arms"] = {n: copy.deepcopy(base) for n in arms}
    data["bars"] = [b for b in data["bars"] if set(b["compare"].split("/")) <= set(arms)] if ok else []
    if ok:
        assert list(validate_plan(data).arms) == list(arms)
    else:
        assert any(p.startswith("arms: arms must be named by consecutive letters from A") for p in problems_of(data))


def test_compare_problems_one_line_each_with_the_field_path() -> None:
    data = three()
    data["bars"][0]["compare"] = "D/A"  # no arm D
    data["bars"][1]["compare"] = "A/A"  # an arm against itself
    data["bars"][2]["compare"] = "c/a"  # not two arm names
    probs = problems_of(data)
    probs = sorted(probs)
    assert [p.split(":")[0] for p in probs] == ["bars.0.compare", "bars.1.compare", "bars.2.compare"], probs
    assert "the plan has no arm D (arms: A, B, C)" in probs[0]
    assert "an arm against itself" in probs[1]
    assert "names two arms as numerator/denominator, e.g. B/A or C/A" in probs[2] and "'c/a'" in probs[2]


def test_a_two_arm_plan_cannot_compare_a_third_arm() -> None:
    data = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    data["bars"][0]["compare"] = "C/A"
    (p,) = problems_of(data)
    assert p.startswith("bars.0.compare: compare C/A: the plan has no arm C (arms: A, B)")


def test_an_arm_no_bar_compares_is_a_warning() -> None:
    data = three()
    data["bars"] = data["bars"][:1]  # B/A only: C is run but judged by none
    warnings = plan_warnings(validate_plan(data))
    assert any(w.startswith("arms.C: no bar compares it") for w in warnings), warnings


# --- Holm over every bar --------------------------------------------------------------------------


def test_holm_covers_all_bars_whatever_pair_each_compares() -> None:
    rng = np.random.default_rng(1)
    strong = list(math.log(1.6) + rng.normal(0, 0.02, 6))
    medium = list(math.log(1.4) + rng.normal(0, 0.05, 6))
    weak = list(math.log(1.02) + rng.normal(0, 0.05, 6))
    bars = [BarEvidence(medium, 1.3, 0.9, "at_least", "B/A"), BarEvidence(strong, 1.3, 0.9, "at_least", "C/A"),
            BarEvidence(weak, 1.0, 0.9, "at_least", "C/B")]
    out = judge_bars(bars)
    # The smallest ACCEPT p-value (C/A) is tested at alpha/3, the next at alpha/2, the last at alpha.
    ranked = sorted(range(3), key=lambda i: out[i].p_value)
    assert ranked[0] == 1
    levels = [out[i].lower_level for i in ranked]
    assert levels == pytest.approx([1 - 0.1 / 3, 1 - 0.1 / 2, 1 - 0.1])
    for j, compare in zip(out, ("B/A", "C/A", "C/B"), strict=True):
        assert j.label.startswith(f"{compare} ") and "Holm-adjusted over 3 bars" in j.label


# --- verdicts from each bar's own pair ------------------------------------------------------------


def test_each_bar_takes_its_ratio_from_its_own_pair_in_each_block() -> None:
    plan = load_plan_file(THREE)
    a = [100.0, 104.0, 98.0, 101.0, 99.0, 102.0]
    caps = {}
    for blk, x in enumerate(a):
        caps[(blk, "A")] = x
        caps[(blk, "B")] = x * 2.0
        caps[(blk, "C")] = x * 2.5 * (1.01 if blk % 2 else 0.99)
    caps.pop((5, "B"))  # block 5 has no valid B: bars with B drop it, C/A keeps it
    outcomes = {o.bar.id: o for o in judge_experiment(CapacityStore(caps), 1, plan)}
    assert outcomes["two-replicas"].blocks == [0, 1, 2, 3, 4]
    assert outcomes["h200-pair"].blocks == [0, 1, 2, 3, 4, 5]
    assert outcomes["h200-vs-h100"].blocks == [0, 1, 2, 3, 4]
    assert outcomes["h200-pair"].values[1] == (104.0, pytest.approx(104.0 * 2.5 * 1.01))
    assert outcomes["two-replicas"].judgement.estimate == pytest.approx(2.0)
    assert outcomes["h200-vs-h100"].judgement.estimate == pytest.approx(1.25, rel=0.01)
    assert outcomes["two-replicas"].dropped == {5: "arm B not run yet"}
    assert outcomes["h200-pair"].evidence()["compare"] == "C/A"
    assert all("Holm-adjusted over 3 bars" in o.judgement.label for o in outcomes.values())
    # Block 5 (B A C... dropped from B's bars) leaves those pairs unbalanced: the note says so.
    assert "ln(B/A)" in outcomes["two-replicas"].judgement.note
    assert "ln(C/A)" not in outcomes["h200-pair"].judgement.note


# --- the dry run ---------------------------------------------------------------------------------


def test_dry_run_predicts_every_arm_and_sizes_every_bar_with_its_pair() -> None:
    from orchestrator.control.dryrun import simulate_plan

    plan = load_plan_file(THREE)
    r = simulate_plan(plan, replications=20)
    assert list(r.arms) == ["A", "B", "C"]
    assert set(r.gpu_hours_per_arm) == {"A", "B", "C"}
    assert r.gpu_hours == pytest.approx(sum(r.gpu_hours_per_arm.values()))
    assert r.gpu_hours_per_arm["B"] == pytest.approx(2 * r.arms["B"].run_wall_s * 6 / 3600)
    cap = {n: a.classes["standard"].capacity_tok_s for n, a in r.arms.items()}
    for b in r.bars:
        num, den = b.compare.split("/")
        assert b.noise_free_ratio == pytest.approx(cap[num] / cap[den], rel=1e-6)
        assert b.to_dict()["compare"] == b.compare
        assert b.judgement.label.startswith(f"{b.compare} ") and "over 3 bars" in b.judgement.label
    assert [b.compare for b in r.bars] == ["B/A", "C/A", "C/B"]
    assert not any("design.blocks" in n for n in r.notes)  # 6 blocks: a whole Williams design
