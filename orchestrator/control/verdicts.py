"""From stored capacities to bar verdicts: per-block log ratios over valid blocks only.

Each bar compares its own pair of arms (``Bar.compare``: B/A, or C/A in a plan of three arms):
its per-block ratio is taken between the two runs of that pair in the same block, and every
bar of the plan is one family for Holm's correction (``analysis.stats.judge_bars``).

A stored verdict is never trusted (issue 30): ``recheck_verdicts`` judges every bar again from
the stored records and the registered plan, with the judge the executor used, and says where
the latest stored verdict differs from it (`orch verdict --verify` and `--gate` exit 6 then)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from orchestrator.analysis.balance import order_balance
from orchestrator.analysis.blocks import BlockRatio, CapacityValue, block_log_ratio
from orchestrator.analysis.carryover import OrderEffect, order_effect
from orchestrator.analysis.critical import (
    DEFAULT_METHOD,
    MEDIAN,
    MEDIAN_RULES,
    MEDIAN_SKEW,
    METHODS,
    ROBUST,
    Method,
)
from orchestrator.analysis.sequential import Look, judge_looks, look_blocks
from orchestrator.analysis.stats import BarEvidence, Judgement, judge_bars
from orchestrator.control.design import look_step, plan_order
from orchestrator.plan import Bar, Plan
from orchestrator.plan.incomplete import describe_blocks

if TYPE_CHECKING:
    import pandas as pd

    from orchestrator.store import StoreLike, VerdictInfo

BACK_TO_BACK = "back_to_back"


@dataclass(frozen=True)
class BarOutcome:
    bar: Bar
    judgement: Judgement
    blocks: list[int]  # the blocks the verdict rests on
    values: dict[int, tuple[float, float]]  # block -> (denominator, numerator): (A, B) for B/A
    dropped: dict[int, str] = field(default_factory=dict)  # planned block it cannot use -> why
    censored: dict[int, str] = field(default_factory=dict)  # used block judged as an interval -> why
    carryover: OrderEffect | None = None  # the order effect of its blocks (MEDIAN's rule)
    look: Look | None = None  # where a sequential design stands (None: a fixed design)
    voided: dict[str, int] = field(default_factory=dict)  # arm -> attempts voided and retried
    gpu_hours_saved: float | None = None  # a sequential stop: the planned blocks not run, priced
    lead_in_s: float = 0.0  # design.carryover.lead_in_s: lead-in runs balanced a first-order carry-over

    def evidence(self) -> dict[str, Any]:
        """What the verdict rests on, as stored with it and shown by `orch verdict` and the
        report: the blocks used, the censored and dropped blocks with their reasons, and how
        each end of the interval was computed (``label`` says it in words)."""
        j = self.judgement
        return {
            "compare": self.bar.compare,
            "blocks_used": list(self.blocks),
            "censored": [{"block": b, "why": w} for b, w in sorted(self.censored.items())],
            "dropped": [{"block": b, "why": w} for b, w in sorted(self.dropped.items())],
            "lower_level": _finite(j.lower_level), "upper_level": _finite(j.upper_level),
            "method": j.method, "sd": _finite(j.sd), "sd_used": _finite(j.sd_used), "sd_floor": j.sd_floor,
            "p_value": _finite(j.p_value), "p_reject": _finite(j.p_reject),
            "estimand": ESTIMANDS.get(j.method, j.method), "resolution": j.resolution,
            "carryover": None if self.carryover is None else self.carryover.to_dict(),
            "sequential": None if self.look is None else {**self.look.to_dict(),
                                                          "gpu_hours_saved": self.gpu_hours_saved},
            "voided_attempts": dict(self.voided),
            "lead_in_s": self.lead_in_s,
        }


ESTIMANDS: dict[str, str] = {MEDIAN_SKEW: "median block ratio", MEDIAN: "median block ratio", ROBUST: "geometric mean of the block ratios",
             "student_t": "geometric mean of the block ratios"}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def valid_runs(store: StoreLike, experiment_id: int) -> dict[tuple[int, str], int]:
    """(block, arm) -> the run id that counts: valid, done, and no failed run-level guard."""
    out: dict[tuple[int, str], int] = {}
    for r in store.runs(experiment_id):
        if r.status == "done" and r.valid:
            run_level = [g for g in store.guard_results(r.id) if g.point_id is None]
            if all(g.passed for g in run_level):
                out[(r.block, r.arm)] = r.id
    return out


def bar_values(store: StoreLike, experiment_id: int, bar: Bar, runs: dict[tuple[int, str], int]) -> dict[int, tuple[float, float]]:
    """Per block with both arms of the bar's pair valid: (value of the denominator, value of the
    numerator) of the bar's metric: (A, B) for B/A, (A, C) for C/A."""
    blocks = sorted({b for b, _ in runs})
    out: dict[int, tuple[float, float]] = {}
    caps = store.capacities(experiment_id) if bar.metric == "capacity" else None
    pair = _den_num(bar)
    for b in blocks:
        if any((b, arm) not in runs for arm in pair):
            continue
        vals = [_value(store, caps, runs[(b, arm)], bar) for arm in pair]
        if all(math.isfinite(v) for v in vals):
            out[b] = (vals[0], vals[1])
    return out


def _den_num(bar: Bar) -> tuple[str, str]:
    """The bar's arms as (denominator, numerator): ("A", "B") for B/A."""
    num, den = bar.pair
    return den, num


def _value(store: StoreLike, caps: pd.DataFrame | None, run_id: int, bar: Bar) -> float:
    if caps is not None:
        row = caps[(caps.run_id == run_id) & (caps.class_name == bar.service_class)]
        return float(row.capacity.iloc[0]) if len(row) else math.nan
    return _at_rate(store, run_id, bar)


def dropped_blocks(store: StoreLike, experiment_id: int, plan: Plan, bar: Bar, runs: dict[tuple[int, str], int],
                   used: set[int] | dict[int, Any], limit: int | None = None) -> dict[int, str]:
    """Each planned block holding both of a bar's arms that its verdict cannot use, with why (of
    the bar's two arms): an arm not run yet, an arm
    without a valid run (its last attempt's reason), a failed run-level guard (back to back),
    or a valid run without the bar's figure."""
    all_runs = store.runs(experiment_id)
    caps = store.capacities(experiment_id) if bar.metric == "capacity" else None
    out: dict[int, str] = {}
    held = plan.block_arms()
    for b in range(plan.design.blocks if limit is None else limit):
        if b in used or not set(_den_num(bar)) <= set(held[b]):  # an incomplete block without the pair
            continue
        why: list[str] = []
        for arm in _den_num(bar):
            mine = [r for r in all_runs if r.block == b and r.arm == arm]
            if not mine:
                why.append(f"arm {arm} not run yet")
            elif (b, arm) in runs:
                if not math.isfinite(_value(store, caps, runs[(b, arm)], bar)):
                    what = (f"no capacity at class {bar.service_class}" if bar.metric == "capacity"
                            else f"no valid point at {bar.rate:g} {plan.workload.rate_unit}" if bar.rate is not None
                            else "no valid closed-loop point")
                    why.append(f"arm {arm}: {what}")
            elif done := [r for r in mine if r.status == "done" and r.valid]:
                why.extend(f"{g.name} guard failed ({g.detail})" for r in done
                           for g in store.guard_results(r.id) if g.point_id is None and not g.passed)
            else:
                last = mine[-1]
                why.append(f"arm {arm}: no valid run in {len(mine)} attempt(s); the last {last.status}"
                           + (f": {last.invalid_reason}" if last.invalid_reason else ""))
        out[b] = "; ".join(dict.fromkeys(why)) or "not usable"
    return out


def _at_rate(store: StoreLike, run_id: int, bar: Bar) -> float:
    pts = store.points(run_id)
    if pts.empty:
        return math.nan
    if bar.rate is None:  # a closed-loop plan: its run's points are at the plan's N users
        pts = pts[pts.valid]
        if bar.users is not None:  # a concurrency sweep: the bar's level only
            pts = pts[pts.users == bar.users]
    else:
        pts = pts[pts.valid & ((pts.offered_rate - bar.rate).abs() <= 1e-6 * max(1.0, bar.rate))]
    if pts.empty:
        return math.nan
    key = "goodput_tok_s" if bar.metric == "goodput_at" else "attainment"
    # A rate measured more than once keeps the mean of its measurements, not the last one.
    vals = [v for pc in pts.per_class if (v := (pc or {}).get(bar.service_class, {}).get(key)) is not None]
    return sum(float(v) for v in vals) / len(vals) if vals else math.nan


def _capacity_value(caps: pd.DataFrame, run_id: int, bar: Bar, value: float) -> CapacityValue:
    """A stored capacity with its censoring: the columns censored/converged/upper once the store
    keeps them (CapacityResult's); until then a zero is "no rate passed" (censored below)."""
    rows = caps[(caps.run_id == run_id) & (caps.class_name == bar.service_class)]
    row = rows.iloc[0] if len(rows) else {}

    def col(name: str, default: Any) -> Any:
        v = row.get(name, default) if hasattr(row, "get") else default
        return default if v is None or (isinstance(v, float) and math.isnan(v)) else v

    censored, converged, upper = col("censored", None), bool(col("converged", True)), col("upper", None)
    if censored is None and converged and value > 0:
        return CapacityValue(value)
    return CapacityValue(value, lower=value, upper=None if upper is None else max(float(upper), value),
                         censored=censored, converged=converged)


def _block_ratio(block: int, a: float, b: float, caps: pd.DataFrame | None = None,
                 runs: dict[tuple[int, str], int] | None = None, bar: Bar | None = None) -> float | BlockRatio:
    """A block's ln(B/A) (or of the bar's pair), or its interval when a capacity is censored;
    0/0 is no ratio, not 1."""
    if caps is not None and runs is not None and bar is not None:
        den, num = _den_num(bar)
        return BlockRatio(block, _capacity_value(caps, runs[(block, den)], bar, a),
                          _capacity_value(caps, runs[(block, num)], bar, b), (den, num))
    return block_log_ratio(b, a, block)


def judge_experiment(store: StoreLike, experiment_id: int, plan: Plan, method: Method = DEFAULT_METHOD) -> list[BarOutcome]:
    """Judge every bar of the plan over the experiment's valid blocks (Holm across all bars,
    whatever pair each compares). ``method`` is the judge (analysis.critical): the median rules add
    the search's resolution to each end of a capacity bar, the carry-over rule and the plan's
    sequential design; ROBUST re-judges a verdict stored before them as it was judged."""
    if not plan.bars:
        return []
    runs = valid_runs(store, experiment_id)
    values = [bar_values(store, experiment_id, bar, runs) for bar in plan.bars]
    caps = store.capacities(experiment_id) if any(bar.metric == "capacity" for bar in plan.bars) else None
    ratios = [{blk: _block_ratio(blk, a, b, *((caps, runs, bar) if bar.metric == "capacity" else ()))
               for blk, (a, b) in v.items()} for bar, v in zip(plan.bars, values, strict=True)]
    new_rule = method in MEDIAN_RULES
    resolution = [math.log1p(plan.search.precision) if new_rule and bar.metric == "capacity" else 0.0
                  for bar in plan.bars]
    orders = [arms for _, arms in plan_order(plan)]

    def evidence(limit: int | None) -> list[BarEvidence]:
        return [BarEvidence([r for blk, r in rs.items() if limit is None or blk < limit], bar.threshold,
                            bar.confidence, bar.direction, bar.compare, rho)
                for bar, rs, rho in zip(plan.bars, ratios, resolution, strict=True)]

    def carried(limit: int | None) -> list[OrderEffect | None]:
        if not new_rule:
            return [None] * len(plan.bars)
        out: list[OrderEffect | None] = []
        for bar, rs in zip(plan.bars, ratios, strict=True):
            den, num = _den_num(bar)
            pts = [(blk, x) for blk, r in rs.items() if (limit is None or blk < limit)
                   and math.isfinite(x := _point(r))]
            after = [orders[blk].index(num) > orders[blk].index(den) for blk, _ in pts]
            out.append(order_effect([r for _, r in pts], after, bar.confidence,
                                    math.log1p(plan.design.carryover.bound), (den, num)))
        return out

    def apply_carryover(limit: int | None, judged: list[Judgement]) -> list[Judgement]:
        out = []
        for j, oe in zip(judged, carried(limit), strict=True):
            if oe is not None and oe.exceeds:
                if plan.design.carryover.action == "void" and j.verdict != "INCONCLUSIVE":
                    j = replace(j, verdict="INCONCLUSIVE")
                why = (f"{oe.describe()} exceeds its bound: "
                       + ("verdict void (INCONCLUSIVE); rerun with a settle period or a cache reset between arms"
                          if plan.design.carryover.action == "void" else "warned (registered action: warn)"))
                j = replace(j, note=f"{j.note}; {why}" if j.note else why)
            out.append(j)
        return out

    look: Look | None = None
    seq = plan.design.sequential if new_rule else None
    if seq is None:
        judgements = apply_carryover(None, judge_bars(evidence(None), method=method))
        limit: int | None = None
    else:
        looks = look_blocks(plan.design.blocks, seq.min_blocks, look_step(plan))
        alpha = 1.0 - min(bar.confidence for bar in plan.bars)
        judgements, look = judge_looks(evidence, looks, plan.design.blocks, _blocks_run(store, experiment_id, plan),
                                       seq.spending, alpha, method=method, adjust=apply_carryover)
        limit = look.blocks
    effects = carried(limit)
    voided = _voided_attempts(store, experiment_id)
    saved = _gpu_hours_saved(store, experiment_id, plan, look) if look is not None and look.stopped else None
    out = []
    held = plan.block_arms()
    for bar, j, v, rs, oe in zip(plan.bars, judgements, values, ratios, effects, strict=True):
        used = {blk: x for blk, x in v.items() if limit is None or blk < limit}
        end = plan.design.blocks if limit is None else limit
        pair = _den_num(bar)
        balance = order_balance(orders[:end], [b for b in range(end) if b not in used and set(pair) <= set(held[b])],
                                pair)
        if not balance.balanced and used:  # ABBA with a dropped block, or a randomized draw: the drift left
            note = balance.warning if plan.design.order == "ABBA" else (
                f"randomized order: {balance.a_first} of {balance.a_first + balance.b_first} blocks used ran "
                f"{_den_num(bar)[0]} first; a linear drift of d per run shifts the estimate's log by "
                f"{balance.drift_weight:+.3g} d (not cancelled)")
            j = replace(j, note=f"{j.note}; {note}" if j.note else note)
        censored = {blk: r.reason().removeprefix(f"block {blk}: ")
                    for blk, r in rs.items() if blk in used and isinstance(r, BlockRatio) and not r.is_point}
        if plan.per_block is not None:  # which blocks the bar can rest on at all
            shared = sum(1 for b in range(end) if set(pair) <= set(held[b]))
            note = (f"{describe_blocks(len(plan.arms), plan.per_block)}: {pair[1]} and {pair[0]} run together in "
                    f"{shared} of {end} blocks, the blocks this ratio is taken in")
            j = replace(j, note=f"{j.note}; {note}" if j.note else note)
        lead_in = plan.design.carryover.lead_in_s if new_rule else 0.0
        if lead_in > 0:
            note = (f"lead-in runs ({lead_in:g} s): every measured run of a block followed a run of its first arm, "
                    "so a first-order carry-over cancels in each block's ratio; the order effect measures what "
                    "remains (a carry-over only a switch of arms leaves, or drift)")
            j = replace(j, note=f"{j.note}; {note}" if j.note else note)
        mine = {arm: voided.get(arm, 0) for arm in _den_num(bar)}
        out.append(BarOutcome(bar, j, sorted(used), used,
                              dropped_blocks(store, experiment_id, plan, bar, runs, used, limit), censored,
                              oe, look, mine, saved, lead_in))
    return out


def _point(r: float | BlockRatio) -> float:
    """A block's ln ratio when it is a point (nan for a censored or unconverged block)."""
    if isinstance(r, BlockRatio):
        return r.interval[0] if r.is_point else math.nan
    return r


def _blocks_run(store: StoreLike, experiment_id: int, plan: Plan) -> int:
    """How many of the planned blocks, from the first, have every arm's run finished."""
    done = {(r.block, r.arm) for r in store.runs(experiment_id) if r.finished}
    held = plan.block_arms()
    n = 0
    while n < plan.design.blocks and all((n, arm) in done for arm in held[n]):
        n += 1
    return n


def _voided_attempts(store: StoreLike, experiment_id: int) -> dict[str, int]:
    """Arm -> attempts that ended without a valid run (voided by a guard or a lost server) and
    were retried or left the block out: the kept runs are the ones that passed."""
    out: dict[str, int] = {}
    for r in store.runs(experiment_id):
        if r.finished and not (r.status == "done" and r.valid):
            out[r.arm] = out.get(r.arm, 0) + 1
    return out


def _gpu_hours_saved(store: StoreLike, experiment_id: int, plan: Plan, look: Look) -> float | None:
    """The planned blocks a sequential stop did not run, priced at what its blocks took: each
    run's load points at the plan's point windows (warm-up, measurement, cool-down) on the arm's
    GPUs, every attempt included (the same price in virtual time as on a cluster; deploys not
    counted)."""
    window_h = (plan.search.point_s + plan.search.warmup_s + plan.search.cooldown_s) / 3600.0
    spent = sum(len(store.points(r.id)) * window_h * plan.arm(r.arm).gpus
                for r in store.runs(experiment_id) if r.block < look.blocks)
    return spent / look.blocks * (look.planned - look.blocks) if look.blocks > 0 else None


def experiment_complete(store: StoreLike, experiment_id: int, plan: Plan) -> bool:
    """The one definition of "complete" for `orch run` and `orch verdict --gate`: the
    experiment is done and every planned block counts (valid runs of every arm whose
    run-level guards, back-to-back included, passed)."""
    if store.get_experiment(experiment_id).status != "done":
        return False
    counted = valid_runs(store, experiment_id)
    blocks = plan.design.blocks
    if plan.design.sequential is not None and plan.bars:
        look = judge_experiment(store, experiment_id, plan, _stored_method(store, experiment_id))[0].look
        if look is not None and look.stopped:
            blocks = look.blocks  # a sequential stop: the blocks after it were never to run
    held = plan.block_arms()
    return all((b, arm) in counted for b in range(blocks) for arm in held[b])


def _stored_method(store: StoreLike, experiment_id: int) -> Method:
    """The judge that made the experiment's stored verdicts (its evidence says; before evidence
    carried it, ROBUST); the default (MEDIAN_SKEW) for an experiment with none stored yet."""
    for v in store.verdicts(experiment_id):
        m = (v.evidence or {}).get("method", ROBUST)
        return m if m in METHODS else ROBUST
    return DEFAULT_METHOD


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


# Estimates and bounds recomputed from the same records by the same code are bit-identical;
# the tolerance only absorbs a database that rounds a double on the way (none of ours does).
SAME_REL = 1e-9


def _same(stored: float | None, judged: float) -> bool:
    now = _finite(judged)
    if stored is None or now is None:
        return stored is None and now is None
    return math.isclose(stored, now, rel_tol=SAME_REL, abs_tol=1e-12)


def _number(x: float | None) -> str:
    return "none" if x is None or not math.isfinite(x) else f"{x:.6g}"


@dataclass(frozen=True)
class VerdictCheck:
    """A bar's latest stored verdict (None: never stored) against the one the stored records
    and the registered plan give now. ``superseded``: stored before the experiment's last run
    finished while the experiment is not done (an earlier, partial judgement a resume has not
    replaced yet): reported, not compared. A done experiment's verdicts were judged after its
    last run, so each must be what its records give."""

    judged: BarOutcome
    stored: VerdictInfo | None
    superseded: bool = False

    @property
    def bar_id(self) -> str:
        return self.judged.bar.id

    @property
    def differs(self) -> bool:
        s, j = self.stored, self.judged.judgement
        if s is None or self.superseded:
            return False
        return (s.verdict != j.verdict or s.blocks != j.n
                or not all(_same(a, b) for a, b in ((s.estimate, j.estimate), (s.lower, j.lower), (s.upper, j.upper))))

    def line(self) -> str:
        """One line for `orch verdict --verify` (bar, stored vs recomputed verdict and estimate)."""
        s, j = self.stored, self.judged.judgement
        assert s is not None  # only a stored verdict can differ
        return (f"bar {self.bar_id}: stored verdict {s.verdict} (estimate {_number(s.estimate)}, "
                f"{s.blocks} blocks) is not what its records give: {j.verdict} (estimate {_number(j.estimate)}, "
                f"{j.n} blocks); the stored verdict is not trusted")

    def to_dict(self) -> dict[str, Any]:
        s, j = self.stored, self.judged.judgement
        return {
            "bar": self.bar_id, "differs": self.differs, "superseded": self.superseded,
            "stored": None if s is None else {"verdict": s.verdict, "estimate": s.estimate, "lower": s.lower,
                                              "upper": s.upper, "blocks": s.blocks},
            "recomputed": {"verdict": j.verdict, "estimate": _finite(j.estimate), "lower": _finite(j.lower),
                           "upper": _finite(j.upper), "blocks": j.n},
        }


def recheck_verdicts(store: StoreLike, experiment_id: int, plan: Plan) -> list[VerdictCheck]:
    """Every bar of ``plan`` judged again from the stored records (``judge_experiment``, as the
    executor judges before ``record_verdict``), each with the latest verdict stored for it."""
    outcomes = judge_experiment(store, experiment_id, plan, _stored_method(store, experiment_id))
    stored = {v.bar_id: v for v in store.verdicts(experiment_id)}
    done = store.get_experiment(experiment_id).status == "done"
    finished = [r.finished_at for r in store.runs(experiment_id) if r.finished and r.finished_at is not None]
    last = max(finished, default=None)
    out = []
    for o in outcomes:
        s = stored.get(o.bar.id)
        stale = s is not None and not done and last is not None and s.judged_at < last
        out.append(VerdictCheck(o, s, stale))
    return out
