"""Stopping at the first decisive look: a group-sequential design (issue 31). Pure.

A plan that registers ``design.sequential`` is judged at looks: after every whole design (2
blocks for two arms, a Williams design's rows for more) from ``min_blocks`` on, and at its
last block. Each look spends a share of every bar's alpha, by an alpha-spending function of the
information fraction t = blocks / planned blocks (Lan-DeMets):

- ``obrien_fleming``: A(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)): almost nothing early, nearly
  all of alpha at the last look (a fixed design's power is kept where the effect is small);
- ``pocock``: A(t) = alpha ln(1 + (e - 1) t): evenly spread (stops earlier, costs more power
  at the last look).

Look k tests every bar (Holm across the bars, as a fixed design does) at alpha x s_k, where s_k
= (A(t_k) - A(t_{k-1})) / alpha; the shares sum to 1. A false verdict at any look is then at most
the sum of the looks' levels, alpha (the union bound: conservative, as the looks' statistics
are positively correlated). The experiment stops at the first look at which every bar is decided
(ACCEPT or REJECT); an undecided bar at the last look stays INCONCLUSIVE.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from scipy import stats as sps

from orchestrator.analysis.stats import BarEvidence, Judgement, Method, judge_bars

Spending = Literal["obrien_fleming", "pocock"]
SPENDINGS: tuple[Spending, ...] = ("obrien_fleming", "pocock")
_NAMES = {"obrien_fleming": "O'Brien-Fleming", "pocock": "Pocock"}


def spent(t: float, alpha: float, kind: Spending) -> float:
    """Cumulative alpha spent by information fraction ``t`` in (0, 1]."""
    if not 0 < t <= 1:
        raise ValueError(f"an information fraction is in (0, 1] (got {t})")
    if kind == "obrien_fleming":
        return float(2.0 - 2.0 * sps.norm.cdf(sps.norm.ppf(1 - alpha / 2) / math.sqrt(t)))
    if kind == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    raise ValueError(f"spending must be one of {', '.join(SPENDINGS)} (got {kind!r})")


def look_blocks(planned: int, min_blocks: int, step: int) -> list[int]:
    """The block counts at which the design looks: every ``step`` (a whole design) from
    ``min_blocks`` (rounded up to a whole design), and the last block."""
    if planned < 2 or step < 1:
        raise ValueError("a sequential design needs at least 2 planned blocks and a step >= 1")
    first = max(2, min_blocks)
    first = -(-first // step) * step
    out = list(range(first, planned, step))
    return [*out, planned]


def shares(looks: Sequence[int], planned: int, alpha: float, kind: Spending) -> list[float]:
    """Each look's share of alpha (they sum to 1)."""
    cum = [spent(n / planned, alpha, kind) / alpha for n in looks]
    return [c - p for c, p in zip(cum, [0.0, *cum[:-1]], strict=True)]


@dataclass(frozen=True, slots=True)
class Look:
    """Where a sequential judgement stands: look ``index`` (1-based) of ``looks``, at
    ``blocks`` of ``planned`` blocks, testing at ``share`` of each bar's alpha; ``stopped``: every
    bar was decided here before the last planned block."""

    index: int
    looks: int
    blocks: int
    planned: int
    share: float
    spending: Spending
    stopped: bool
    interim: bool = False  # judged before its look's blocks were all run (an in-progress view)

    def label(self) -> str:
        return (f"sequential look {self.index} of {self.looks} at {self.blocks} of {self.planned} blocks "
                f"({_NAMES[self.spending]} spending: this look tests at {100 * self.share:.3g}% of each bar's alpha)")

    def describe(self) -> str:
        if self.stopped:
            return (f"stopped at the first decisive look: {self.blocks} of {self.planned} blocks "
                    f"({self.planned - self.blocks} not run)")
        return self.label()

    def to_dict(self) -> dict[str, object]:
        return {"look": self.index, "looks": self.looks, "blocks": self.blocks, "planned": self.planned,
                "share": self.share, "spending": self.spending, "stopped": self.stopped, "interim": self.interim}


def judge_looks(evidence: Callable[[int], list[BarEvidence]], looks: Sequence[int], planned: int,
                available: int, spending: Spending, alpha: float, *, method: Method,
                adjust: Callable[[int, list[Judgement]], list[Judgement]] | None = None) -> tuple[list[Judgement], Look]:
    """Judge at each look whose blocks are all run (``available``: how many of the planned
    blocks are), in order, stopping at the first where every bar is decided. ``evidence(n)``
    gives each bar's evidence from the first ``n`` blocks. Before the first look the bars are
    judged at the first look's share (an interim view: never a stop). ``adjust(n, judgements)``
    applies a rule that may void a verdict (the carry-over rule) before a look decides."""
    def judge(n: int, share: float, look: Look) -> list[Judgement]:
        out = judge_bars(evidence(n), method=method, spend=share, look=look.label())
        return adjust(n, out) if adjust is not None else out

    s = shares(looks, planned, alpha, spending)
    reached = [k for k, n in enumerate(looks) if n <= available]
    if not reached:
        first = Look(1, len(looks), looks[0], planned, s[0], spending, False, interim=True)
        return judge(available, s[0], first), first
    judged: list[Judgement] = []
    look: Look | None = None
    for k in reached:
        n = looks[k]
        look = Look(k + 1, len(looks), n, planned, s[k], spending, False)
        judged = judge(n, s[k], look)
        if judged and all(j.verdict != "INCONCLUSIVE" for j in judged):
            return judged, Look(k + 1, len(looks), n, planned, s[k], spending, n < planned)
    assert look is not None
    return judged, look
