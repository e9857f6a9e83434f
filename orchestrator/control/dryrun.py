"""The dry run: a plan's whole design in virtual time, before any GPU hour is spent.

For each arm, the capacity search of ``analysis.search`` is driven by virtual-time load points
(the same requests, schedules, engine and metrics as a real point, on the simulator's clock),
class after class in the plan's order, each search fed the points earlier classes measured
(as the executor does). That gives the predicted capacity per arm and class, and how many
points a real run would measure.

Run-to-run noise: a run's efficiency is drawn as exp(N(0, noise)) (``plan.sim.noise``; a dry
run uses ``DRY_RUN_NOISE`` when the plan's is 0, and says so). The searches are repeated at
a lower efficiency (exp(-max(NOISE_GRID x noise, MIN_GRID_STEP))), and a run's capacity at any
efficiency is read off the log-log line through the two (its slope: the capacity's elasticity). The plan's blocks are then replayed with a seeded draw per
(block, arm) and judged with Holm's correction (the predicted verdict), and ``replications``
further draws of the whole design give the power: the share that ACCEPT. Modelled spread: the
efficiency jitter (and the search's own discreteness, through the grid); not modelled: arrival
sampling differing between blocks (the real run's points are longer and average it out).

GPU-hours: GPUs of each arm x (deploy and readiness + every point's warm-up, window,
cool-down and drain) for each block that runs it (every block, unless a sweep's blocks are
incomplete).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.analysis.metrics import PointMetrics, point_metrics
from orchestrator.analysis.search import CapacityResult, search_capacity
from orchestrator.control.design import carryover_warnings, design_warnings, lead_in_runs

# The predictions' types and the bars' arithmetic live in control.dry_bars; their names stay
# importable from here.
from orchestrator.control.dry_bars import (  # noqa: F401 - re-exported
    TARGET_POWER,
    ArmPrediction,
    BarPrediction,
    ClassPrediction,
    _elasticity,
    _finite,
    _log_ratio,
    _ratio,
    predict_bars,
)
from orchestrator.control.load_kinds import load_kind
from orchestrator.control.points import drain_seconds
from orchestrator.errors import UserError
from orchestrator.loadgen.schedules import derive_seed
from orchestrator.paths import cache_root, data_root
from orchestrator.plan import Plan, plan_hash
from orchestrator.plan.experiment import ARM_NAMES
from orchestrator.plan.incomplete import runs_per_arm
from orchestrator.plan.sweep import arm_names, describe
from orchestrator.sim.engine import Windows, cluster_for_arm
from orchestrator.sim.model import DeviceProfile
from orchestrator.sim.profiles import profile_for, profiles_in

# Efficiency jitter (sigma of its log) a dry run assumes when the plan sets none: a few percent
# run to run is what repeated vLLM benchmarks on one node show. Not in the seed notes.
DRY_RUN_NOISE = 0.03
# The efficiency grid of the noise model: searches at 1 and at exp(-max(NOISE_GRID x sigma,
# MIN_GRID_STEP)); the step is kept well above the search precision so the slope is measurable.
NOISE_GRID = 2.0
MIN_GRID_STEP = 0.10
# Time to deploy an arm and see it ready on a GPU node (image cached, 8B-class weights loaded
# from a local cache, CUDA graphs captured): a few minutes. An assumption, printed with the
# GPU-hours. The executor's ready deadline (180 s) is the same order.
DEPLOY_S = 240.0
# Virtual points shorter than the plan's: enough requests for an attainment estimate, fast
# enough for a whole design in seconds. (Longer points only reduce sampling noise.) The window
# also shrinks at high rates to hold about MAX_MEASURED requests, never under MIN_MEASURE_S.
DRY_MEASURE_S = 30.0
DRY_WARMUP_S = 5.0
MAX_MEASURED = 300
MIN_MEASURE_S = 5.0
DRY_COOLDOWN_S = 2.0
# The dry run's search precision at the finest: the virtual points' sampling noise is larger.
DRY_PRECISION = 0.03
# The priors of a real-time run need less: a rate near the knee.
PRIOR_MEASURE_S = 20.0
PRIOR_WARMUP_S = 5.0
PRIOR_PRECISION = 0.05
# Short virtual points near a knee are noisy: one search's rate moved 2x from seed to seed on
# the e2e two-vs-one plan (2.4 to 6.2 req/s). The prior is the median of a few seeds' searches.
PRIOR_SEEDS = 3


@dataclass(frozen=True)
class DryWindows:
    """Lengths of a virtual point and the search precision a dry run uses."""

    measure_s: float
    warmup_s: float
    cooldown_s: float
    precision: float

    @classmethod
    def for_plan(cls, plan: Plan, measure_s: float, warmup_s: float, cooldown_s: float,
                 precision: float | None = None) -> DryWindows:
        s = plan.search
        return cls(min(s.point_s, measure_s), min(s.warmup_s, warmup_s), min(s.cooldown_s, cooldown_s),
                   precision if precision is not None else s.precision)


def unpredictable(plan: Plan) -> str | None:
    """Why the simulator cannot dry-run the plan's own workload (None: it can). Never a dry run
    of some other workload in its place: a power check on it would judge the wrong plan."""
    if not load_kind(plan.workload).searchable:
        return "capacity comes from open-loop runs only; this workload is closed loop"
    if any(a.external for a in plan.arms.values()):
        return "the simulator models provisioned arms; external arms are only labelled"
    return None


class ArmSimulator:
    """Virtual-time load points and capacity searches of one arm at one efficiency."""

    def __init__(self, plan: Plan, arm: str, windows: DryWindows, seed: int, efficiency: float = 1.0,
                 profile: DeviceProfile | None = None):
        if (why := unpredictable(plan)) is not None:
            raise ValueError(why)
        self.plan = plan
        self.arm = arm
        self.windows = windows
        self.seed = seed
        self.efficiency = efficiency
        # Faults (stalls) off: a dry run predicts what a healthy run measures.
        self.cluster = cluster_for_arm(plan.model, plan.arm(arm), plan.router_for(arm), plan.sim,
                                       efficiency_scale=efficiency, with_faults=False, profile=profile)
        self.points: dict[float, PointMetrics] = {}
        self.drains: dict[float, float] = {}

    def point(self, rate: float) -> PointMetrics:
        """One open-loop point at ``rate`` (for sessions: sessions started per second); both arms
        share the schedule and prompts of a rate."""
        for r, m in self.points.items():
            if abs(r - rate) <= 1e-6 * rate:
                return m
        w, plan, kind = self.windows, self.plan, load_kind(self.plan.workload)
        seed = derive_seed(self.seed, "dry-run", f"{rate:.6g}")
        per_start = kind.requests_per_unit(plan.workload)
        measure_s = min(w.measure_s, max(MIN_MEASURE_S, MAX_MEASURED / (rate * per_start)))
        w = DryWindows(measure_s, w.warmup_s, w.cooldown_s, w.precision)
        total = w.warmup_s + w.measure_s + w.cooldown_s
        # The point's own load, as the point runner builds it: synthetic, a prompts file's, a
        # trace's (its arrivals scaled to the rate), or live sessions (started at the rate).
        records, end_s, n_measure, last = kind.simulate(plan, self.cluster, rate,
                                                        Windows(w.warmup_s, w.measure_s, w.cooldown_s),
                                                        drain_seconds(plan), seed)
        m = point_metrics(records, plan.classes, window_s=w.measure_s, n_scheduled=n_measure)
        self.points[rate] = m
        self.drains[rate] = min(max(end_s - max(last, total), 0.0), drain_seconds(plan))
        return m

    def search(self, cls: str, prior: float | None = None) -> CapacityResult:
        """The capacity search of one class, fed every point this arm measured so far."""
        seen = [(r, m.per_class[cls].attainment, m.per_class[cls].goodput_tok_s) for r, m in list(self.points.items())]

        def measure(rate: float) -> tuple[float, float]:
            c = self.point(rate).per_class[cls]
            return c.attainment, c.goodput_tok_s

        return search_capacity(self.plan.search, measure, seen, precision=self.windows.precision, prior=prior)

    def search_all(self, priors: dict[str, float] | None = None) -> dict[str, CapacityResult]:
        """Every class of the plan, in order (as one real run does)."""
        return {c.name: self.search(c.name, (priors or {}).get(c.name)) for c in self.plan.classes}


def profiles_dir() -> Path:
    """Where installed device profiles live (`orch device fit --install`): ORCH_PROFILES_DIR or
    the user's data directory."""
    return Path(os.environ.get("ORCH_PROFILES_DIR") or data_root() / "profiles")


def installed_profiles() -> list[DeviceProfile]:
    """Every installed device profile (none when the directory does not exist)."""
    d = profiles_dir()
    return profiles_in(d) if d.is_dir() else []


def predicted_capacity_rates(plan: Plan, profiles: Sequence[DeviceProfile] | None = None) -> dict[str, dict[str, float]]:
    """Rate (requests/s) at which each arm's capacity of each class was found in virtual time
    (noise off): the prior of a real run's capacity search. Short points, coarse precision: a
    few seconds for the quickstart plan. A class with no passing rate gets the bracket's low end
    or the plan's lowest rate. An arm whose GPU has an installed profile is simulated on it
    when the plan runs on real GPUs (backend kubernetes; the sim backend runs the datasheet)."""
    if unpredictable(plan) is not None:
        return {}
    if profiles is None:
        profiles = installed_profiles() if plan.backend == "kubernetes" else []
    windows = DryWindows.for_plan(plan, PRIOR_MEASURE_S, PRIOR_WARMUP_S, DRY_COOLDOWN_S,
                                  max(plan.search.precision, PRIOR_PRECISION))
    out: dict[str, dict[str, float]] = {}
    for arm in plan.arms:
        profile = profile_for(plan.arm(arm).gpu, list(profiles))
        found: dict[str, list[float]] = {}
        for k in range(PRIOR_SEEDS):
            seed = plan.design.seed if k == 0 else derive_seed(plan.design.seed, "prior", str(k))
            for name, res in ArmSimulator(plan, arm, windows, seed, profile=profile).search_all().items():
                found.setdefault(name, []).append(_rate_of(res, plan))
        out[arm] = {name: float(np.median(rates)) for name, rates in found.items()}
    return out


def _rate_of(res: CapacityResult, plan: Plan) -> float:
    if res.at_rate is not None:
        return float(res.at_rate)
    lo = res.bracket[0]
    return float(lo) if lo is not None else plan.search.rate.min


# --- the whole design ---------------------------------------------------------------------


@dataclass(frozen=True)
class SweepPrice:
    """What a sweep costs before it runs: its design in words, its arms by readable name, and
    GPU-hours = sum over arms of GPUs x the blocks that run it x (deploy + points x a point's
    seconds)."""

    design: str
    arms: dict[str, str]
    blocks: int
    points_per_run: dict[str, int]
    gpus: dict[str, int]
    gpu_hours: float
    runs: dict[str, int] = field(default_factory=dict)  # arm -> blocks that run it
    per_block: int | None = None  # arms per block of incomplete blocks (None: every arm)


@dataclass(frozen=True)
class DryRunResult:
    """What ``orch plan simulate`` prints."""

    plan: str
    sha256: str
    seed: int
    replications: int
    noise: float
    noise_source: str  # "plan" | "dry-run default"
    arms: dict[str, ArmPrediction]
    bars: list[BarPrediction]
    gpu_hours: float
    gpu_hours_per_arm: dict[str, float]
    wall_hours: float
    windows: DryWindows
    notes: list[str]
    elapsed_s: float
    sweep: SweepPrice | None = None  # a sweep plan: its design, arms and price


    def to_dict(self) -> dict[str, object]:
        arms = {}
        for name, a in self.arms.items():
            arms[name] = {
                "gpus": a.gpus, "layout": a.layout, "points_per_run": a.points_per_run,
                "run_wall_s": a.run_wall_s,
                "capacity": {
                    c: {"capacity_tok_s": p.capacity_tok_s, "at_rate": p.at_rate, "attainment": p.attainment,
                        "points_used": p.points_used, "converged": p.converged, "censored": p.censored,
                        "elasticity": _elasticity(p.curve),
                        "efficiency_curve": [{"efficiency": e, "capacity_tok_s": v} for e, v in p.curve]}
                    for c, p in a.classes.items()
                },
            }
        return {
            "plan": self.plan, "sha256": self.sha256, "seed": self.seed, "replications": self.replications,
            "noise": {"sigma": self.noise, "source": self.noise_source},
            "virtual_point": {"measure_s": self.windows.measure_s, "warmup_s": self.windows.warmup_s,
                              "cooldown_s": self.windows.cooldown_s, "precision": self.windows.precision},
            "arms": arms,
            "bars": [b.to_dict() for b in self.bars],
            "gpu_hours": {"total": self.gpu_hours, "per_arm": self.gpu_hours_per_arm,
                          "wall_hours": self.wall_hours, "deploy_s_assumed": DEPLOY_S},
            "notes": self.notes,
            "elapsed_s": self.elapsed_s,
        } | ({"sweep": asdict(self.sweep)} if self.sweep is not None else {})


def simulate_plan(plan: Plan, replications: int = 200, seed: int | None = None,
                  profiles: Sequence[DeviceProfile] = ()) -> DryRunResult:
    """Run the plan's design in virtual time: capacities, verdicts, power, GPU-hours. An arm
    whose GPU a measured profile describes (``orch device fit``) runs at the profile's rates."""
    if not plan.workload.open_loop:
        raise ValueError("a dry run searches capacity, which comes from open-loop runs only; "
                         "this workload is closed loop")
    if replications < 1:
        raise ValueError("replications must be >= 1")
    if (why := unpredictable(plan)) is not None:
        raise UserError(f"no dry run of this plan: {why}")
    started = time.perf_counter()
    seed = plan.design.seed if seed is None else seed
    notes: list[str] = design_warnings(plan.design, tuple(plan.arms), plan.per_block)  # ABBA over an odd number of blocks
    notes += carryover_warnings(plan)
    if plan.sim.noise > 0:
        sigma, source = plan.sim.noise, "plan"
    else:
        sigma, source = DRY_RUN_NOISE, "dry-run default"
        notes.append(f"sim.noise is 0 in the plan: the dry run assumes run-to-run efficiency jitter of "
                     f"{DRY_RUN_NOISE:.0%} (sigma of its log) to estimate verdict intervals and power")
    windows = DryWindows.for_plan(plan, DRY_MEASURE_S, DRY_WARMUP_S, DRY_COOLDOWN_S,
                                  max(plan.search.precision, DRY_PRECISION))
    if windows.measure_s < plan.search.point_s:
        notes.append(f"virtual points measure {windows.measure_s:g} s after {windows.warmup_s:g} s of "
                     f"warm-up (the plan's: {plan.search.point_s:g} s after {plan.search.warmup_s:g} s)")
    grid = (math.exp(-max(NOISE_GRID * sigma, MIN_GRID_STEP)), 1.0)
    bar_rates = sorted({b.rate for b in plan.bars if b.rate is not None})
    used = {name: profile_for(plan.arm(name).gpu, list(profiles)) for name in plan.arms}
    for name, p in used.items():
        if p is not None:
            notes.append(f"arm {name}: device profile {p.name} ({p.source or 'no source given'})")
    arms = {name: _predict_arm(plan, name, windows, seed, grid, bar_rates, used[name]) for name in plan.arms}

    bars = predict_bars(plan, arms, sigma, seed, replications)
    runs = runs_per_arm(tuple(plan.arms), plan.per_block, plan.design.blocks)  # incomplete blocks: fewer
    per_arm = {n: a.gpus * a.run_wall_s * runs[n] / 3600.0 for n, a in arms.items()}
    wall = sum(a.run_wall_s * runs[n] for n, a in arms.items()) / 3600.0
    if leads := lead_in_runs(plan):  # each: a deployment and the lead-in's seconds of load
        lead_s = DEPLOY_S + plan.design.carryover.lead_in_s
        extra = {n: arms[n].gpus * lead_s * k / 3600.0 for n, k in leads.items()}
        per_arm = {n: h + extra.get(n, 0.0) for n, h in per_arm.items()}
        wall += lead_s * sum(leads.values()) / 3600.0
        notes.append(f"lead-in runs: {sum(leads.values())} (" + ", ".join(f"{n} {k}" for n, k in leads.items())
                     + f"), {lead_s:g} s each with its deployment: {sum(extra.values()):.2f} GPU-hours of the total")
    notes.append("modelled spread: per-run efficiency jitter; not modelled: arrival sampling between "
                 "blocks, guard failures and their retries (each retry adds a run's GPU-hours)")
    return DryRunResult(
        plan=plan.name, sha256=plan_hash(plan), seed=seed, replications=replications, noise=sigma,
        noise_source=source, arms=arms, bars=bars, gpu_hours=sum(per_arm.values()),
        gpu_hours_per_arm=per_arm, wall_hours=wall, windows=windows, notes=notes,
        elapsed_s=time.perf_counter() - started, sweep=_sweep_price(plan, arms, sum(per_arm.values())),
    )


def _sweep_price(plan: Plan, arms: dict[str, ArmPrediction], gpu_hours: float) -> SweepPrice | None:
    """A sweep plan's price before it runs: its arms (the cells) x the blocks that run each x each
    arm's points x a point's seconds x the arm's GPUs, in GPU-hours (the sum over arms above)."""
    if plan.sweep is None:
        return None
    return SweepPrice(describe(plan.sweep), arm_names(plan.sweep, ARM_NAMES), plan.design.blocks,
                      {n: a.points_per_run for n, a in arms.items()}, {n: a.gpus for n, a in arms.items()},
                      gpu_hours, runs_per_arm(tuple(plan.arms), plan.per_block, plan.design.blocks), plan.per_block)


def _predict_arm(plan: Plan, arm: str, windows: DryWindows, seed: int, grid: Sequence[float],
                 bar_rates: Sequence[float], profile: DeviceProfile | None = None) -> ArmPrediction:
    base = ArmSimulator(plan, arm, windows, seed, 1.0, profile)
    results = base.search_all()
    for r in bar_rates:
        base.point(r)
    curves: dict[str, list[tuple[float, float]]] = {c: [] for c in results}
    fixed: dict[float, list[tuple[float, dict[str, tuple[float, float]]]]] = {r: [] for r in bar_rates}
    for eff in grid:
        if eff == 1.0:
            sim, res = base, results
        else:
            sim = ArmSimulator(plan, arm, windows, seed, eff, profile)
            # A good prior: the knee moves with the efficiency.
            priors = {c: _rate_of(r, plan) * eff for c, r in results.items()}
            res = sim.search_all(priors)
        for c, cap in res.items():
            curves[c].append((eff, cap.capacity))
        for rate in bar_rates:
            m = sim.point(rate)
            fixed[rate].append((eff, {c: (v.goodput_tok_s, v.attainment) for c, v in m.per_class.items()}))
    classes = {
        c: ClassPrediction(r.capacity, r.at_rate, r.attainment, r.points_used, r.converged, r.censored,
                           tuple(curves[c]))
        for c, r in results.items()
    }
    s = plan.search
    point_wall = sum(s.warmup_s + s.point_s + s.cooldown_s + base.drains.get(r, 0.0) for r in base.points)
    spec = plan.arm(arm)
    return ArmPrediction(
        gpus=spec.gpus, layout=spec.layout, classes=classes, points_per_run=len(base.points),
        run_wall_s=DEPLOY_S + point_wall,
        fixed_rate={r: tuple(v) for r, v in fixed.items()},
    )


# --- the pre-run power check (issue 21) ---------------------------------------------------

# A bar whose predicted power with the plan's blocks is below this is a run that probably
# cannot answer its question: `orch run` and `orch submit` say so and ask before spending
# GPU-hours. 0.5: the run is more likely than not to end INCONCLUSIVE or REJECT.
LOW_POWER = 0.5
# Part of the cache key of a dry run (with the installed device profiles): change it when the
# simulator's predictions change.
MODEL_REVISION = "issue-21-step-model"
POWER_CHECK_REPLICATIONS = 200


def dry_run_cache_dir() -> Path:
    """Where dry runs are cached: ORCH_CACHE_DIR or the user's cache directory."""
    return cache_root() / "dryrun"


@dataclass(frozen=True)
class PowerCheck:
    """The bars a plan's dry run predicts too weak to judge with the plan's blocks."""

    sha256: str
    blocks: int
    gpu_hours: float
    low: tuple[dict[str, Any], ...]  # BarPrediction.to_dict() of each bar under LOW_POWER
    skipped: str | None = None  # why no dry run could judge the plan (then nothing is low)
    cached: bool = False

    @property
    def ok(self) -> bool:
        return not self.low

    def message(self) -> str:
        """One line: each low bar, the blocks it would need and their GPU-hours."""
        key = f"blocks_for_{int(TARGET_POWER * 100)}pct_power"
        parts = []
        for b in self.low:
            cmp_ = ">=" if b["direction"] == "at_least" else "<="
            est = b.get("compare", "B/A") + " " + ("-" if b["estimate"] is None else f"{b['estimate']:.3f}")
            if b["lower"] is not None and b["upper"] is not None:
                est += f" [{b['lower']:.3f}, {b['upper']:.3f}]"
            need = b[key]
            if need:
                more = f"{need} blocks for {TARGET_POWER:.0%} power (~{self.gpu_hours / self.blocks * need:.2f} GPU-hours)"
            else:
                more = f"no number of blocks reaches {TARGET_POWER:.0%} power ({b['blocks_note'] or 'see plan simulate'})"
            parts.append(f"bar {b['id']}: predicted power {b['power']:.0%} with {self.blocks} block(s), "
                         f"{est} against {cmp_} {b['threshold']:g}; {more}")
        return ("low predicted power: " + "; ".join(parts)
                + f"; this run: {self.gpu_hours:.2f} GPU-hours (`orch plan simulate` for details)")


def power_check(plan: Plan, cache_dir: Path | None = None) -> PowerCheck:
    """The plan's dry run (cached by plan hash), reduced to its bars of low power."""
    sha = plan_hash(plan)
    if not plan.bars:
        return PowerCheck(sha, plan.design.blocks, 0.0, (), skipped="the plan has no bars")
    if (why := unpredictable(plan)) is not None:
        return PowerCheck(sha, plan.design.blocks, 0.0, (), skipped=f"the simulator cannot predict this plan: {why}")
    profiles = installed_profiles()
    key = hashlib.sha256(json.dumps([MODEL_REVISION, POWER_CHECK_REPLICATIONS]
                                    + [p.model_dump(mode="json") for p in profiles]).encode()).hexdigest()[:16]
    path = (cache_dir or dry_run_cache_dir()) / f"{sha}-{key}.json"
    cached = True
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = False
        try:
            result = simulate_plan(plan, replications=POWER_CHECK_REPLICATIONS, profiles=profiles)
        except ValueError as e:  # e.g. no spread between blocks in the model
            return PowerCheck(sha, plan.design.blocks, 0.0, (), skipped=f"dry run: {e}")
        doc = {"gpu_hours": result.gpu_hours, "bars": [b.to_dict() for b in result.bars]}
        _write_atomic(path, json.dumps(doc))
    low = tuple(b for b in doc["bars"] if b["power"] < LOW_POWER)
    return PowerCheck(sha, plan.design.blocks, float(doc["gpu_hours"]), low, cached=cached)


def _write_atomic(path: Path, text: str) -> None:
    """Concurrent runs of one plan may race to fill the cache; a reader never sees half a file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written only costs the next run another dry run
