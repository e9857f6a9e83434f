"""Balance of a block design against a linear drift in time (DESIGN section 10). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.analysis.williams import rows_for


@dataclass(frozen=True, slots=True)
class OrderBalance:
    """Whether the blocks a verdict rests on cancel a linear drift in time.

    Within a block the arm that runs second sees one more step of drift; a block run A-then-B
    adds +d to ln(B/A), B-then-A adds -d. ``drift_weight`` = (A-first - B-first) / blocks is
    the share of one step's drift d left in the mean log ratio (0 when balanced)."""

    balanced: bool
    a_first: int
    b_first: int
    drift_weight: float
    warning: str = ""


def order_balance(
    orders: Sequence[Sequence[str]],
    dropped: Sequence[int] = (),
    arms: tuple[str, str] = ("A", "B"),
) -> OrderBalance:
    """Balance of a design against linear drift for the ratio ``arms[1]/arms[0]``: ``orders[b]``
    is block b's arms in run order (as ``control.design.block_order`` gives them); ``dropped``
    the blocks the verdict cannot use (no valid run of an arm). ABBA with an odd number of
    blocks, or a dropped block, leaves one arm going first more often: the warning says so and
    by how much.

    With more than two arms per block a block shifts ln(Y/X) by d times the positions between
    the two arms (Y two runs after X: +2d); the design is balanced for the pair when those
    shifts sum to zero over the blocks used (a whole Williams design, or any Latin square)."""
    first, second = arms
    dropped_set = set(dropped)
    kept = [(b, tuple(o)) for b, o in enumerate(orders)
            if b not in dropped_set and first in o and second in o]
    a_first = sum(1 for _, o in kept if o.index(first) < o.index(second))
    b_first = len(kept) - a_first
    n = len(kept)
    shift = sum(o.index(second) - o.index(first) for _, o in kept)
    weight = shift / n if n else 0.0
    if shift == 0:
        return OrderBalance(True, a_first, b_first, 0.0)
    why = f"blocks {sorted(dropped_set)} dropped; " if dropped_set else ""
    width = max((len(o) for _, o in kept), default=2)
    if width == 2:
        lead, more, fewer = (first, a_first, b_first) if a_first > b_first else (second, b_first, a_first)
        what = f"{more} run {lead} first and {fewer} the other way"
        fix = "use an even number of blocks"
    else:
        what = f"{a_first} run {first} before {second} and {b_first} after, {shift:+d} positions in all"
        fix = f"use a multiple of {rows_for(width)} blocks (a whole Williams design)"
    warning = (
        f"{why}{n} blocks used: {what}, so a linear drift of d per run shifts ln({second}/{first}) by "
        f"{weight:+.3g} d (not cancelled); "
        + (fix if not dropped_set else "rerun the dropped block(s) to restore balance")
    )
    return OrderBalance(False, a_first, b_first, weight, warning)


def abba_orders(blocks: int, arms: tuple[str, str] = ("A", "B")) -> list[tuple[str, str]]:
    """Run order per block under ABBA (block 0 A-then-B, block 1 B-then-A, ...)."""
    first, second = arms
    return [(first, second) if b % 2 == 0 else (second, first) for b in range(blocks)]
