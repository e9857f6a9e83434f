"""The dry run's predictions per arm and per bar (split from ``control.dryrun``): the predicted
capacity curves of each arm, and each bar's verdict and power from its own pair of arms.

A plan of N arms runs every arm in every block; a dry-run block draws one efficiency per arm,
so a bar C/A and a bar B/A of one block share A's draw, as they share A's run in a real block.
A sweep's incomplete blocks run some arms only: a bar's ratios come from the blocks that run
both of its arms, and the blocks it needs for power are the plan's (every block holding the pair
or not), in whole balance units.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from orchestrator.analysis.blocks import BlockRatio
from orchestrator.analysis.blocks import block_log_ratio as _log_ratio
from orchestrator.analysis.power import blocks_needed
from orchestrator.analysis.sequential import judge_looks, look_blocks
from orchestrator.analysis.stats import DEFAULT_METHOD, BarEvidence, Judgement, judge_bars
from orchestrator.control.design import look_step
from orchestrator.loadgen.schedules import derive_seed
from orchestrator.plan import Bar, Plan
from orchestrator.plan.incomplete import balance_unit

# A dry run's power is also reported as the blocks needed for this power.
TARGET_POWER = 0.8


@dataclass(frozen=True)
class ClassPrediction:
    """Predicted capacity of one class at one arm (efficiency 1), and the efficiency curve."""

    capacity_tok_s: float
    at_rate: float | None
    attainment: float | None
    points_used: int
    converged: bool
    censored: str | None  # None, below_min, above_max or at_ceiling (CapacityResult's)
    curve: tuple[tuple[float, float], ...]  # (efficiency, capacity) of the noise grid

    def at(self, efficiency: float) -> float:
        """Capacity at an efficiency, along the log-log line fitted to the grid."""
        return _interp_loglog(self.curve, efficiency)


@dataclass(frozen=True)
class ArmPrediction:
    gpus: int
    layout: str | None  # the arm's layout (None only for an external arm)
    classes: dict[str, ClassPrediction]
    points_per_run: int
    run_wall_s: float  # one run: deploy + every point
    fixed_rate: dict[float, tuple[tuple[float, dict[str, tuple[float, float]]], ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class BarPrediction:
    id: str
    service_class: str
    metric: str
    direction: str
    threshold: float
    confidence: float
    noise_free_ratio: float
    judgement: Judgement
    block_ratios: tuple[float, ...]
    power: float
    blocks_for_power: int | None
    blocks_note: str
    compare: str = "B/A"
    mean_blocks: float = math.nan  # blocks a replication ran (fewer than planned: a sequential stop)

    def to_dict(self) -> dict[str, object]:
        j = self.judgement.to_dict()
        return {
            "id": self.id, "compare": self.compare, "class": self.service_class, "metric": self.metric,
            "direction": self.direction, "threshold": self.threshold, "confidence": self.confidence,
            "noise_free_ratio": _finite(self.noise_free_ratio),
            "verdict": j["verdict"], "estimate": j["estimate"], "lower": j["lower"], "upper": j["upper"],
            "blocks": j["n"], "note": j["note"],
            "block_ratios": [_finite(r) for r in self.block_ratios],
            "power": self.power,
            f"blocks_for_{int(TARGET_POWER * 100)}pct_power": self.blocks_for_power,
            "blocks_note": self.blocks_note,
            "mean_blocks": _finite(self.mean_blocks),
        }


def _curve(arm: ArmPrediction, bar: Bar) -> tuple[tuple[float, float], ...]:
    if bar.metric == "capacity":
        return arm.classes[bar.service_class].curve
    idx = 0 if bar.metric == "goodput_at" else 1
    assert bar.rate is not None  # an open-loop plan's point metric names its rate (plan validation)
    return tuple((e, v[bar.service_class][idx]) for e, v in arm.fixed_rate[bar.rate])


def _value(arm: ArmPrediction, bar: Bar, efficiency: float) -> float:
    return _interp_loglog(_curve(arm, bar), efficiency)


def predict_bars(plan: Plan, arms: dict[str, ArmPrediction], sigma: float, seed: int,
                 replications: int) -> list[BarPrediction]:
    """Each bar's predicted verdict over the plan's blocks and its power: every block draws one
    efficiency per arm (all arms run in every block), each bar takes the ratio of its own pair,
    and all bars are judged together (Holm over every bar of the plan)."""
    if not plan.bars:
        return []
    blocks = plan.design.blocks
    names = list(arms)  # the plan's arm order: column k of a draw is arm names[k]
    col = {n: k for k, n in enumerate(names)}
    held = plan.block_arms()
    shared = [[k for k in range(blocks) if set(bar.pair) <= set(held[k])] for bar in plan.bars]

    def design_ratios(rng: np.random.Generator) -> list[list[tuple[int, float | BlockRatio]]]:
        # Two arms draw (blocks, 2) as they always have: a 2-arm plan's prediction is unchanged.
        eff = np.exp(rng.normal(0.0, sigma, size=(blocks, len(names))))
        out = []
        for bar, ks in zip(plan.bars, shared, strict=True):
            num, den = bar.pair
            out.append([(k, _log_ratio(_value(arms[num], bar, eff[k, col[num]]),
                                       _value(arms[den], bar, eff[k, col[den]]), k)) for k in ks])
        return out

    resolution = [math.log1p(plan.search.precision) if bar.metric == "capacity" else 0.0 for bar in plan.bars]
    seq = plan.design.sequential

    def verdicts(ratios: list[list[tuple[int, float | BlockRatio]]]) -> tuple[list[Judgement], int]:
        """The bars' verdicts by the rule `orch run` applies (a sequential plan's looks
        included), and the blocks it ran."""
        def evidence(n: int) -> list[BarEvidence]:
            return [BarEvidence([x for k, x in r if k < n], bar.threshold, bar.confidence, bar.direction,
                                bar.compare, rho)
                    for r, bar, rho in zip(ratios, plan.bars, resolution, strict=True)]

        if seq is None:
            return judge_bars(evidence(blocks)), blocks
        looks = look_blocks(blocks, seq.min_blocks, look_step(plan))
        alpha = 1.0 - min(bar.confidence for bar in plan.bars)
        judged, look = judge_looks(evidence, looks, blocks, blocks, seq.spending, alpha, method=DEFAULT_METHOD)
        return judged, look.blocks

    predicted_ratios = design_ratios(np.random.default_rng(derive_seed(seed, "dry-run", "blocks")))
    predicted, _ = verdicts(predicted_ratios)
    accepts = np.zeros(len(plan.bars))
    used = 0
    rng = np.random.default_rng(derive_seed(seed, "dry-run", "replications"))
    for _ in range(replications):
        judged, ran = verdicts(design_ratios(rng))
        used += ran
        for i, j in enumerate(judged):
            accepts[i] += j.verdict == "ACCEPT"

    out = []
    for i, bar in enumerate(plan.bars):
        num, den = bar.pair
        a, b = arms[den], arms[num]
        clean = _log_ratio(_value(b, bar, 1.0), _value(a, bar, 1.0))
        ratio = _ratio(clean)
        spread = _spread_of_log_ratio(a, b, bar, sigma)
        n_needed, note = None, ""
        try:
            if isinstance(clean, BlockRatio):
                raise ValueError(clean.reason().removeprefix("block 0: "))
            if not spread > 0:
                raise ValueError("no spread between blocks in the model: power is 0 or 1")
            n_needed = blocks_needed(spread, ratio, bar.threshold, bar.confidence, TARGET_POWER, bar.direction,
                                     resolution=resolution[i])
            if plan.per_block is not None and n_needed is not None:  # pair blocks -> the plan's blocks
                unit = balance_unit(len(names), plan.per_block)
                n_needed = unit * math.ceil(n_needed * blocks / max(len(shared[i]), 1) / unit)
        except ValueError as e:
            note = str(e)
        out.append(BarPrediction(
            id=bar.id, service_class=bar.service_class, metric=bar.metric, direction=bar.direction,
            threshold=bar.threshold, confidence=bar.confidence, noise_free_ratio=ratio,
            judgement=predicted[i], block_ratios=tuple(_ratio(x) for _, x in predicted_ratios[i]),
            power=float(accepts[i] / replications), blocks_for_power=n_needed, blocks_note=note,
            compare=bar.compare, mean_blocks=used / replications,
        ))
    return out


def _spread_of_log_ratio(a: ArmPrediction, b: ArmPrediction, bar: Bar, sigma: float) -> float:
    """sd of ln(B/A) (the bar's pair) per block: each arm's elasticity times sigma (independent draws)."""
    slopes = [_elasticity(_curve(arm, bar)) for arm in (a, b)]
    return math.hypot(*slopes) * sigma


def _ratio(x: float | BlockRatio) -> float:
    """B/A of a block log ratio; NaN for no ratio (0/0)."""
    return math.nan if isinstance(x, BlockRatio) else math.exp(x)


def _elasticity(curve: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of ln(value) on ln(efficiency) over the grid (0 if undefined)."""
    pts = [(math.log(e), math.log(v)) for e, v in curve if v > 0]
    if len(pts) < 2:
        return 0.0
    x = np.array([p[0] for p in pts])
    y = np.array([p[1] for p in pts])
    if np.ptp(x) <= 0:
        return 0.0
    return float(np.polyfit(x, y, 1)[0])


def _interp_loglog(curve: Sequence[tuple[float, float]], x: float) -> float:
    """The value at efficiency ``x``: the efficiency-1 value moved along the fitted log-log
    line (one slope for the grid: the search's discreteness would make a piecewise line jump)."""
    at_one = min(curve, key=lambda p: abs(math.log(p[0])))[1]
    if at_one <= 0:
        return 0.0
    return at_one * x ** _elasticity(curve)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
