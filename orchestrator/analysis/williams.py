"""Counterbalanced run orders for blocks of more than two arms (Williams designs). Pure.

Within a block every arm runs once, back to back. Two things in time bias a comparison of
two arms X and Y measured in one block: a drift (the later run sees more of it) and a
carry-over (what ran just before: a warm node, a cache, a hotter GPU). A Williams design
orders the arms so that, over its rows,

- every arm takes every position equally often (a Latin square: a linear drift adds the same
  to every arm, so it cancels from every ratio), and
- every arm immediately precedes every other arm equally often (first-order carry-over is
  balanced too, but only in the sense that each ordered pair occurs equally often: a carry-over
  that only one arm leaves still biases the ratios it enters, by half of it for two arms; issue
  31. Lead-in runs, ``design.carryover.lead_in_s``, make every run of a block follow the same
  arm, which cancels a first-order carry-over whichever arm leaves it).

For an even number of arms one square (n rows) does both; for an odd number no single square
can, and the square together with its mirror image (2n rows) does. Two arms: AB, BA (ABBA).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def williams_rows(n: int) -> list[tuple[int, ...]]:
    """The rows of a Williams design for ``n`` arms (0..n-1): n rows for even n, 2n for odd.

    The first row is 0, 1, n-1, 2, n-2, ... and row i adds i to each entry (mod n): the
    differences between neighbours then run through every non-zero residue once, which is
    what makes each ordered neighbour pair occur once. An odd n repeats the square mirrored.
    The square comes first, so a design cut after n rows is still a Latin square."""
    if n < 1:
        raise ValueError(f"a design needs at least one arm (got {n})")
    first = [0]
    lo, hi = 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    square = [tuple((x + i) % n for x in first) for i in range(n)]
    if n % 2 == 0:
        return square
    return square + [tuple(reversed(row)) for row in square]


def williams_orders(arms: Sequence[str], blocks: int) -> list[tuple[str, ...]]:
    """Run order of each block: the design's rows in turn (cycled when there are more blocks
    than rows). ``arms`` in their plan order (A, B, C, ...)."""
    rows = williams_rows(len(arms))
    return [tuple(arms[i] for i in rows[b % len(rows)]) for b in range(blocks)]


def rows_for(n: int) -> int:
    """How many blocks one whole Williams design of ``n`` arms takes."""
    return n if n % 2 == 0 else 2 * n


def position_counts(orders: Sequence[Sequence[str]]) -> Counter[tuple[str, int]]:
    """(arm, position) -> how many blocks run that arm at that position."""
    return Counter((arm, pos) for order in orders for pos, arm in enumerate(order))


def neighbour_counts(orders: Sequence[Sequence[str]]) -> Counter[tuple[str, str]]:
    """(x, y) -> how many blocks run y immediately after x."""
    return Counter((o[k], o[k + 1]) for o in orders for k in range(len(o) - 1))


def is_balanced(orders: Sequence[Sequence[str]]) -> bool:
    """Every arm at every position equally often, and every ordered pair of arms neighbours
    equally often (the two properties of a Williams design)."""
    if not orders:
        return True
    arms = sorted(set(orders[0]))
    n = len(arms)
    if any(sorted(o) != arms for o in orders):
        return False
    pos = position_counts(orders)
    nb = neighbour_counts(orders)
    return (len({pos[(a, p)] for a in arms for p in range(n)}) == 1
            and (n < 2 or len({nb[(x, y)] for x in arms for y in arms if x != y}) == 1))
