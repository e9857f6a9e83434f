"""The order runs happen in, and the seeds they draw from (recorded, reproducible)."""

from __future__ import annotations

import hashlib

import numpy as np

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


def derive_seed(base: int, *parts: object) -> int:
    """A 63-bit seed from the plan's seed and a path of names (block, rate, ...): a different
    block gets a different seed, and both arms of a block get the same one (paired schedules)."""
    text = ":".join([str(base), *(str(p) for p in parts)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def point_seed(base: int, block: int, rate: float) -> int:
    """Seed of one load point: same block and rate -> same schedule and prompts for both arms."""
    return derive_seed(base, "point", block, f"{rate:.6g}")
