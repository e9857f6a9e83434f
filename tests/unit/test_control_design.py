"""Run order and seeds: ABBA alternates, randomized follows the plan's seed, paired schedules
within a block, fresh prompts for a re-measure or a retried run."""

from __future__ import annotations

from orchestrator.control.design import block_order, point_seed
from orchestrator.plan import Design


def test_abba_alternates_who_goes_first() -> None:
    order = block_order(Design(blocks=4, order="ABBA"))
    assert [arms for _, arms in order] == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]


def test_randomized_order_is_fixed_by_the_seed() -> None:
    a = block_order(Design(blocks=12, order="randomized", seed=3))
    assert a == block_order(Design(blocks=12, order="randomized", seed=3))
    assert a != block_order(Design(blocks=12, order="randomized", seed=4))
    assert all(sorted(arms) == ["A", "B"] for _, arms in a)


def test_point_seeds_pair_arms_and_never_repeat_prompts_on_one_server() -> None:
    base = point_seed(7, block=0, rate=4.0)
    assert base == point_seed(7, 0, 4.0)  # both arms of a block: the same schedule
    assert base != point_seed(7, 1, 4.0)  # another block
    assert base != point_seed(7, 0, 4.0, repeat=1)  # the same rate measured again
    assert base != point_seed(7, 0, 4.0, attempt=1)  # a retried run (servers may persist)
