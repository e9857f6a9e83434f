"""The order runs happen in, and the seeds they draw from (recorded, reproducible)."""

from __future__ import annotations

import numpy as np

from orchestrator.analysis.balance import order_balance
from orchestrator.loadgen.schedules import derive_seed
from orchestrator.plan import Design


def block_order(design: Design, arms: tuple[str, str] = ("A", "B")) -> list[tuple[int, list[str]]]:
    """Arms of each block in run order: ABBA alternates who goes first; randomized draws it
    from the plan's seed (so the order is fixed by the registration, not by the run)."""
    first, second = arms
    out: list[tuple[int, list[str]]] = []
    rng = np.random.default_rng(derive_seed(design.seed, "order"))
    for b in range(design.blocks):
        if design.order == "ABBA":
            pair = [first, second] if b % 2 == 0 else [second, first]
        else:
            pair = [first, second] if rng.random() < 0.5 else [second, first]
        out.append((b, pair))
    return out


def design_warnings(design: Design) -> list[str]:
    """`orch plan validate` and the dry run: ABBA over an odd number of blocks runs one arm
    first more often, so a linear drift in time is not cancelled (analysis.balance.order_balance
    says by how much)."""
    if design.order != "ABBA":
        return []
    balance = order_balance([pair for _, pair in block_order(design)])
    return [] if balance.balanced else [f"design.blocks: {balance.warning}"]


def point_seed(base: int, block: int, rate: float, repeat: int = 0, attempt: int = 0) -> int:
    """Seed of one load point: a different block gets a different seed, and both arms of a
    block at the same rate get the same schedule and prompts (paired comparison). A rate
    measured again in the same run (``repeat`` > 0), or by a retried run (``attempt`` > 0),
    gets fresh prompts: repeating them on a server that keeps its cache (an external
    endpoint lives across runs) would turn the prefix cache into an answer cache."""
    return derive_seed(base, "point", block, f"{rate:.6g}", repeat, attempt)
