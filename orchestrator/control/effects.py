"""A sweep's effects from the stored capacities (``analysis.effects`` does the arithmetic).

Only a point capacity counts (censored or unconverged ones give no point): a block enters a
class's effects when every arm of the sweep has a valid run there with a point capacity at that
class; the others are left out of that class's effects (``SweepEffects.left_out`` says why).
Incomplete blocks: a block enters when its baseline has a point capacity there, with each of its
other arms that has one (intrablock least squares); an arm of it without one is left out of that
block, and a block without its baseline's is left out whole."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.analysis.effects import Effect, intrablock_effects, sweep_effects
from orchestrator.control.verdicts import valid_runs
from orchestrator.plan import Plan
from orchestrator.plan.experiment import ARM_NAMES
from orchestrator.plan.incomplete import describe_blocks
from orchestrator.plan.sweep import cell_name, cells, level_text

# How the effects of incomplete blocks are estimated, in words (stored with them).
INTRABLOCK = ("intrablock least squares on ln capacity with block effects (each block's arms against its "
              "baseline), Student's t on the residual degrees of freedom")

if TYPE_CHECKING:
    from orchestrator.store import StoreLike


@dataclass(frozen=True)
class SweepEffects:
    """Every effect of a sweep plan, the arms' readable names and the blocks left out."""

    effects: list[Effect]
    arm_names: dict[str, str]  # letter -> readable name (A: the baseline)
    left_out: dict[str, dict[int, str]] = field(default_factory=dict)  # class -> block -> why
    design: str | None = None  # incomplete blocks in words (None: every block holds every arm)
    resolution: float = 0.0  # the search's, ln(1 + precision), on each end (0: effects stored before it)

    def to_dict(self) -> dict[str, Any]:
        """As stored with each bar's verdict (evidence ``sweep``) and printed by `orch verdict --json`.
        Incomplete blocks add ``design`` and ``method`` (complete ones store as before them), the
        search's resolution ``resolution`` (effects stored before it have none: judged without)."""
        extra: dict[str, Any] = {} if self.design is None else {"design": self.design, "method": INTRABLOCK}
        if self.resolution > 0:
            extra["resolution"] = self.resolution
        return {"arms": dict(self.arm_names), "effects": [e.to_dict() for e in self.effects],
                "left_out": [{"class": c, "block": b, "why": w}
                             for c, blocks in self.left_out.items() for b, w in sorted(blocks.items())]} | extra


def experiment_effects(store: StoreLike, experiment_id: int, plan: Plan,
                       resolution: float | None = None) -> SweepEffects | None:
    """The sweep's main effects (and, for a full factorial, its two-factor interactions) per
    measured class; None for a plan without a sweep. ``resolution`` (ln units) widens each end
    (analysis.effects); None: the plan's search's, ln(1 + search.precision), for open-loop
    capacities (`orch verdict --verify` passes what a stored verdict was judged with)."""
    sweep = plan.sweep
    if sweep is None:
        return None
    if resolution is None:
        resolution = math.log1p(plan.search.precision) if plan.workload.open_loop else 0.0
    design = dict(zip(ARM_NAMES, cells(sweep), strict=False))
    names = {arm: cell_name(sweep, cell) for arm, cell in design.items()}
    factors = {path: [level_text(x) for x in levels] for path, levels in sweep.factors.items()}
    runs = valid_runs(store, experiment_id)
    caps = store.capacities(experiment_id)
    held = plan.block_arms()
    incomplete = plan.per_block is not None
    effects: list[Effect] = []
    left_out: dict[str, dict[int, str]] = {}
    for cls in plan.classes:
        values: dict[int, dict[str, float]] = {}
        why: dict[int, str] = {}
        for b in range(plan.design.blocks):
            row: dict[str, float] = {}
            missing: list[str] = []
            for arm in held[b]:
                run_id = runs.get((b, arm))
                value = None if run_id is None else _point_capacity(caps, run_id, cls.name)
                if value is None:
                    missing.append(arm if run_id is None else f"{arm} (censored or unconverged)")
                else:
                    row[arm] = math.log(value)
            if not missing:
                values[b] = row
            elif not incomplete:
                why[b] = "no point capacity of " + ", ".join(missing)
            elif "A" not in row or len(row) < 2:
                why[b] = "no point capacity of " + ", ".join(missing) + ": no arm of it measured against A"
            else:
                values[b] = row
                why[b] = "no point capacity of " + ", ".join(missing) + ": left out of this block (the rest kept)"
        left_out[cls.name] = why
        estimate = intrablock_effects if incomplete else sweep_effects
        effects += estimate(factors, design, values, cls.name, sweep.confidence, interactions=sweep.design == "full",
                            resolution=resolution)
    return SweepEffects(effects, names, {c: w for c, w in left_out.items() if w},
                        describe_blocks(len(plan.arms), plan.per_block) if incomplete else None, resolution)


def _point_capacity(caps: Any, run_id: int, class_name: str) -> float | None:
    """A run's capacity at a class when it is a point estimate (uncensored, converged, > 0)."""
    rows = caps[(caps.run_id == run_id) & (caps.class_name == class_name)]
    if not len(rows):
        return None
    r = rows.iloc[0]
    censored = r.get("censored")
    converged = r.get("converged")
    value = float(r.capacity)
    if (isinstance(censored, str) and censored) or (converged is not None and not bool(converged)) or not value > 0 or not math.isfinite(value):
        return None
    return value
