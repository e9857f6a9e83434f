"""From stored capacities to bar verdicts: per-block log ratios over valid blocks only."""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.analysis.stats import BarEvidence, Judgement, judge_bars
from orchestrator.plan import Bar, Plan

BACK_TO_BACK = "back_to_back"


@dataclass(frozen=True)
class BarOutcome:
    bar: Bar
    judgement: Judgement
    blocks: list[int]  # the blocks the verdict rests on
    values: dict[int, tuple[float, float]]  # block -> (A, B)


def valid_runs(store, experiment_id: int) -> dict[tuple[int, str], int]:
    """(block, arm) -> the run id that counts: valid, done, and no failed run-level guard."""
    out: dict[tuple[int, str], int] = {}
    for r in store.runs(experiment_id):
        if r.status == "done" and r.valid:
            run_level = [g for g in store.guard_results(r.id) if g.point_id is None]
            if all(g.passed for g in run_level):
                out[(r.block, r.arm)] = r.id
    return out


def bar_values(store, experiment_id: int, bar: Bar, runs: dict[tuple[int, str], int]) -> dict[int, tuple[float, float]]:
    """Per block with both arms valid: (value of A, value of B) of the bar's metric."""
    blocks = sorted({b for b, _ in runs})
    out: dict[int, tuple[float, float]] = {}
    caps = store.capacities(experiment_id) if bar.metric == "capacity" else None
    for b in blocks:
        if (b, "A") not in runs or (b, "B") not in runs:
            continue
        vals = []
        for arm in ("A", "B"):
            run_id = runs[(b, arm)]
            if caps is not None:
                row = caps[(caps.run_id == run_id) & (caps.class_name == bar.service_class)]
                vals.append(float(row.capacity.iloc[0]) if len(row) else math.nan)
            else:
                vals.append(_at_rate(store, run_id, bar))
        if all(math.isfinite(v) for v in vals):
            out[b] = (vals[0], vals[1])
    return out


def _at_rate(store, run_id: int, bar: Bar) -> float:
    pts = store.points(run_id)
    if pts.empty:
        return math.nan
    pts = pts[pts.valid & ((pts.offered_rate - (bar.rate or 0)).abs() <= 1e-6 * max(1.0, bar.rate or 0))]
    if pts.empty:
        return math.nan
    per_class = pts.per_class.iloc[-1].get(bar.service_class, {})
    key = "goodput_tok_s" if bar.metric == "goodput_at" else "attainment"
    v = per_class.get(key)
    return float(v) if v is not None else math.nan


def _log_ratio(a: float, b: float) -> float:
    if a <= 0 and b <= 0:
        return 0.0
    if a <= 0:
        return math.inf
    if b <= 0:
        return -math.inf
    return math.log(b / a)


def judge_experiment(store, experiment_id: int, plan: Plan) -> list[BarOutcome]:
    """Judge every bar of the plan over the experiment's valid blocks (Holm across bars)."""
    if not plan.bars:
        return []
    runs = valid_runs(store, experiment_id)
    values = [bar_values(store, experiment_id, bar, runs) for bar in plan.bars]
    evidence = [
        BarEvidence([_log_ratio(a, b) for a, b in v.values()], bar.threshold, bar.confidence, bar.direction)
        for bar, v in zip(plan.bars, values, strict=True)
    ]
    judgements = judge_bars(evidence)
    return [
        BarOutcome(bar, j, sorted(v), v)
        for bar, j, v in zip(plan.bars, judgements, values, strict=True)
    ]


def experiment_complete(store, experiment_id: int, plan: Plan) -> bool:
    """The one definition of "complete" for `orch run` and `orch verdict --gate`: the
    experiment is done and every planned block counts (valid runs of both arms whose
    run-level guards, back-to-back included, passed)."""
    if store.get_experiment(experiment_id).status != "done":
        return False
    counted = valid_runs(store, experiment_id)
    return all((b, arm) in counted for b in range(plan.design.blocks) for arm in plan.arms)


def gate_exit_code(outcomes: list[BarOutcome], incomplete: bool) -> int:
    """`orch verdict --gate`: 5 a run invalid (a block without valid runs), 3 a bar rejected,
    4 inconclusive, 0 every bar accepted."""
    return gate_code([o.judgement.verdict for o in outcomes], incomplete)


def gate_code(verdicts: list[str], incomplete: bool) -> int:
    """The gate's exit code from verdict names (stored or freshly judged)."""
    if incomplete:
        return 5
    if "REJECT" in verdicts:
        return 3
    if "INCONCLUSIVE" in verdicts:
        return 4
    return 0
