"""The order runs happen in, and the seeds they draw from (recorded, reproducible)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from orchestrator.analysis.balance import order_balance
from orchestrator.analysis.williams import rows_for, williams_orders, williams_rows
from orchestrator.loadgen.schedules import derive_seed
from orchestrator.plan import Design, Plan
from orchestrator.plan.incomplete import balance_unit, block_arms


def plan_order(plan: Plan) -> list[tuple[int, list[str]]]:
    """``block_order`` of the plan's design, arms and blocks (incomplete ones included)."""
    return block_order(plan.design, tuple(plan.arms), plan.per_block)


def look_step(plan: Plan) -> int:
    """Blocks of one whole design, the step between a sequential design's looks: a Williams
    design's rows (2 for two arms); incomplete blocks: one balance unit (every other arm run
    equally often against A)."""
    if plan.per_block is not None:
        return balance_unit(len(plan.arms), plan.per_block)
    return rows_for(len(plan.arms))


def block_order(design: Design, arms: Sequence[str] = ("A", "B"),
                per_block: int | None = None) -> list[tuple[int, list[str]]]:
    """Arms of each block in run order, every arm once per block. Two arms: ABBA alternates
    who goes first; randomized draws it from the plan's seed (so the order is fixed by the
    registration, not by the run). More arms: ABBA means the counterbalanced order of a
    Williams design (``analysis.williams``; for two arms it is AB, BA: the same thing), its
    rows in turn; randomized draws a permutation per block from the plan's seed.

    Incomplete blocks (``per_block`` below the arms; ``plan.incomplete`` says which arms each
    holds): randomized permutes each block's arms as above; ABBA runs block j of a balance
    unit in row j of the Williams design of ``per_block`` arms, and the second unit of each
    pair (the same blocks) every block in reverse, so over a pair of units every arm runs as
    often after another arm as before it."""
    arms = list(arms)
    out: list[tuple[int, list[str]]] = []
    rng = np.random.default_rng(derive_seed(design.seed, "order"))
    if per_block is not None and per_block < len(arms):
        unit, rows = balance_unit(len(arms), per_block), williams_rows(per_block)
        for b, held in enumerate(block_arms(arms, per_block, design.blocks)):
            if design.order == "randomized":
                out.append((b, [held[int(i)] for i in rng.permutation(len(held))]))
                continue
            c, j = divmod(b, unit)
            order = [held[i] for i in rows[j % len(rows)]]
            out.append((b, order[::-1] if c % 2 else order))
        return out
    if len(arms) == 2:  # exactly as before N arms: registered 2-arm designs keep their orders
        first, second = arms
        for b in range(design.blocks):
            if design.order == "ABBA":
                pair = [first, second] if b % 2 == 0 else [second, first]
            else:
                pair = [first, second] if rng.random() < 0.5 else [second, first]
            out.append((b, pair))
        return out
    if design.order == "ABBA":
        return [(b, list(o)) for b, o in enumerate(williams_orders(arms, design.blocks))]
    return [(b, [arms[int(i)] for i in rng.permutation(len(arms))]) for b in range(design.blocks)]


def design_warnings(design: Design, arms: Sequence[str] = ("A", "B"), per_block: int | None = None) -> list[str]:
    """`orch plan validate` and the dry run: ABBA over an odd number of blocks runs one arm
    first more often, so a linear drift in time is not cancelled (analysis.balance.order_balance
    says by how much). More arms: a number of blocks that is not a whole Williams design
    leaves positions and neighbours unequal. Incomplete blocks: an odd number of balance units
    (each arm against A)."""
    arms = list(arms)
    if per_block is not None and per_block < len(arms):
        return incomplete_warnings(design, arms, per_block)
    if design.order == "randomized":
        return randomized_warnings(design, arms)
    if len(arms) == 2:
        balance = order_balance([pair for _, pair in block_order(design, arms)], arms=(arms[0], arms[1]))
        return [] if balance.balanced else [f"design.blocks: {balance.warning}"]
    rows = rows_for(len(arms))
    if design.blocks % rows == 0:
        return []
    whole = rows * max(1, round(design.blocks / rows))
    return [f"design.blocks: {design.blocks} blocks do not make whole Williams designs of {len(arms)} arms "
            f"({rows} rows each: every arm at every position, and right after every other arm, equally "
            f"often), so the order is not balanced against drift and carry-over; use a multiple of "
            f"{rows} blocks (e.g. {whole})"]


def incomplete_warnings(design: Design, arms: Sequence[str], per_block: int) -> list[str]:
    """Incomplete blocks: for each arm against the baseline, the drift its blocks' orders leave
    (one line for all of them), and the remedy."""
    orders = [o for _, o in block_order(design, arms, per_block)]
    left = {x: b for x in arms[1:] if not (b := order_balance(orders, arms=(arms[0], x))).balanced}
    if not left:
        return []
    unit = balance_unit(len(arms), per_block)
    fix = (f"use an even number of balance units ({2 * unit}, {4 * unit}, ... blocks: the second unit of each pair "
           "runs every block in reverse)" if design.order == "ABBA" else "ABBA balances it, or try another design.seed")
    worst = max(left.items(), key=lambda kv: abs(kv[1].drift_weight))
    return [f"design.{'order' if design.order == 'randomized' else 'blocks'}: the {design.blocks} incomplete blocks "
            f"run {len(left)} of the {len(arms) - 1} other arms more often on one side of {arms[0]} than the other, so "
            f"a linear drift of d per run shifts their ratios to {arms[0]} (most: ln({worst[0]}/{arms[0]}) by "
            f"{worst[1].drift_weight:+.3g} d; not cancelled); {fix}"]


def randomized_warnings(design: Design, arms: Sequence[str]) -> list[str]:
    """A randomized order is drawn from the plan's seed, and a draw is seldom balanced (two arms,
    4 blocks: 5 draws in 8 run one arm first more often): for each arm against the first (the
    pairs bars compare by default), the drift the drawn order leaves, and the remedy."""
    orders = [o for _, o in block_order(design, arms)]
    out = []
    for other in arms[1:]:
        b = order_balance(orders, arms=(arms[0], other))
        if b.balanced:
            continue
        out.append(f"design.order: randomized with seed {design.seed} drew {arms[0]} before {other} in {b.a_first} "
                   f"of {b.a_first + b.b_first} blocks, so a linear drift of d per run shifts ln({other}/{arms[0]}) "
                   f"by {b.drift_weight:+.3g} d (not cancelled; the verdict notes it); ABBA balances it, or try "
                   "another design.seed")
    return out


def point_seed(base: int, block: int, rate: float, repeat: int = 0, attempt: int = 0) -> int:
    """Seed of one load point: a different block gets a different seed, and both arms of a
    block at the same rate get the same schedule and prompts (paired comparison). A rate
    measured again in the same run (``repeat`` > 0), or by a retried run (``attempt`` > 0),
    gets fresh prompts: repeating them on a server that keeps its cache (an external
    endpoint lives across runs) would turn the prefix cache into an answer cache."""
    return derive_seed(base, "point", block, f"{rate:.6g}", repeat, attempt)


def lead_in_runs(plan: Plan) -> dict[str, int]:
    """Arm -> the lead-in runs a plan's design brings when nothing is retried
    (``design.carryover.lead_in_s``): one before each block's first run, and one of the first
    arm before each run from the third on (the second follows the first arm's own run)."""
    out: dict[str, int] = {}
    if plan.design.carryover.lead_in_s <= 0:
        return out
    for _, arms in plan_order(plan):
        if arms:
            out[arms[0]] = out.get(arms[0], 0) + 1 + max(0, len(arms) - 2)
    return out


def carryover_warnings(plan: Plan) -> list[str]:
    """`orch plan validate` and the dry run: a bar at a fixed rate (goodput, attainment) has no
    search resolution to absorb the bias a carry-over only one arm leaves, and the order-effect
    rule sees a 3% one through 2% noise only part of the time (README, Carry-over); lead-in runs
    cancel a first-order one."""
    if plan.design.carryover.lead_in_s > 0 or len(plan.arms) < 2:
        return []
    at_rate = [bar.id for bar in plan.bars if bar.metric != "capacity"]
    if not at_rate:
        return []
    return [f"design.carryover.lead_in_s: bar(s) {', '.join(at_rate)} are judged at a fixed rate, with no search "
            "resolution to absorb a carry-over only one arm leaves (3% after B at block sd 0.02: false accepts "
            "0.18 at 10 blocks); lead-in runs (e.g. lead_in_s: 60) make every run of a block follow the same arm "
            "and cancel a first-order carry-over"]
