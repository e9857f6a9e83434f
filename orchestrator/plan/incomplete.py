"""Incomplete blocks: which arms each block of a sweep runs when a block holds fewer than all of
them (``sweep.max_arms_per_block``). Pure.

A sweep of n arms with at most k per block (2 <= k < n) runs, in every block, the baseline A and
k - 1 of the other m = n - 1 arms. Balance: every non-baseline arm runs in the same number of
blocks, so every one is measured against A equally often. b blocks hold b (k - 1) slots, which
m arms fill equally only when m divides b (k - 1): the unit of balance is
u = m / gcd(m, k - 1) blocks, in which every non-baseline arm runs (k - 1) / gcd(m, k - 1) times,
and the plan's blocks must be a multiple of u (refused at validation otherwise).

The slots of a unit are filled by cutting a cyclic sequence of the m arms into chunks of k - 1
consecutive entries (never an arm twice in one block: k - 1 < m). Units come in pairs holding the
same blocks, so that the second can run each block in the reverse order of the first (ABBA over
a pair of units: every arm's position against every other's cancels, and a linear drift with
it; ``control.design``). Pair p reads the arms with stride s_p (the units of Z_m up to m/2 in
turn: 1, 2, ...) from offset p // (number of strides), so later pairs put other arms together
in a block (6 arms, 3 per block: the first two pairs, 20 blocks, put every two non-baseline arms
in the same block twice). Nothing is drawn at random: the arms of every block follow from n, k
and the block's index; the plan's seed only draws a randomized order within a block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def balance_unit(n_arms: int, per_block: int) -> int:
    """Blocks of one balanced unit: u = m / gcd(m, k - 1) (m = n - 1), 1 when blocks are complete."""
    if per_block >= n_arms:
        return 1
    m, s = n_arms - 1, per_block - 1
    return m // math.gcd(m, s)


def _strides(m: int) -> list[int]:
    """The strides that read all m arms once each, up to m/2 (s and m - s pair the same arms)."""
    return [s for s in range(1, max(1, m // 2) + 1) if math.gcd(s, m) == 1] or [1]


def block_arms(arms: Sequence[str], per_block: int | None, blocks: int) -> list[tuple[str, ...]]:
    """The arms of each block, the baseline (``arms[0]``) first, then the others in the order
    their chunk holds them. Complete blocks (``per_block`` None or >= the arms): every arm, in
    the plan's order. ``blocks`` need not be a whole number of units here (validation says so);
    the last unit is then cut short."""
    arms = list(arms)
    if per_block is None or per_block >= len(arms):
        return [tuple(arms) for _ in range(blocks)]
    if per_block < 2:
        raise ValueError(f"a block holds the baseline and at least one other arm (got {per_block} per block)")
    base, others = arms[0], arms[1:]
    m, s = len(others), per_block - 1
    unit = balance_unit(len(arms), per_block)
    strides = _strides(m)
    out: list[tuple[str, ...]] = []
    for b in range(blocks):
        c, j = divmod(b, unit)
        stride, offset = strides[(c // 2) % len(strides)], (c // 2) // len(strides)
        seq = [others[(offset + stride * i) % m] for i in range(m)]
        out.append((base, *(seq[(j * s + t) % m] for t in range(s))))
    return out


def runs_per_arm(arms: Sequence[str], per_block: int | None, blocks: int) -> dict[str, int]:
    """How many blocks run each arm (every block for complete blocks)."""
    counts = dict.fromkeys(arms, 0)
    for held in block_arms(arms, per_block, blocks):
        for a in held:
            counts[a] += 1
    return counts


def shared_blocks(arms: Sequence[str], per_block: int | None, blocks: int, pair: tuple[str, str]) -> list[int]:
    """The blocks that run both arms of ``pair``."""
    return [b for b, held in enumerate(block_arms(arms, per_block, blocks)) if pair[0] in held and pair[1] in held]


def blocks_problem(n_arms: int, per_block: int, blocks: int) -> str | None:
    """Why ``blocks`` cannot hold the arms balanced (None when they can): a multiple of the
    balance unit, with the counts that work."""
    unit = balance_unit(n_arms, per_block)
    if per_block >= n_arms or blocks % unit == 0:
        return None
    m, s = n_arms - 1, per_block - 1
    works = ", ".join(str(unit * i) for i in range(1, 4))
    return (f"{blocks} blocks cannot hold the {m} non-baseline arms equally often at {s} per block "
            f"(sweep.max_arms_per_block {per_block}: A and {s} other{'s' if s > 1 else ''}): use a multiple of "
            f"{unit} blocks ({works}, ...)")


def describe_blocks(n_arms: int, per_block: int | None) -> str:
    """The block design in words: ``incomplete blocks: 3 arms of 6 per block, baseline in every
    block`` (or ``complete blocks: all 6 arms in every block``)."""
    if per_block is None or per_block >= n_arms:
        return f"complete blocks: all {n_arms} arms in every block"
    return f"incomplete blocks: {per_block} arms of {n_arms} per block, baseline in every block"
