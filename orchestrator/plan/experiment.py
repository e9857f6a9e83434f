"""The experiment plan: arms (A and B, or up to 8), a workload, service classes, search, design,
bars, guards."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BeforeValidator,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from orchestrator.errors import PlanError, Problem
from orchestrator.plan.arms import ROUTER_POLICIES_OF, Arm, RouterConfig, router_policy_problem
from orchestrator.plan.base import CrossFieldError, StrictModel, omit_while
from orchestrator.plan.catalog import GPUS, MODELS, SERVICE_CLASSES, ModelSpec, ServiceClass
from orchestrator.plan.design import CarryOver, Design, RateRange, SearchSettings, Sequential  # noqa: F401 (re-exported)
from orchestrator.plan.incomplete import block_arms, blocks_problem, describe_blocks, shared_blocks
from orchestrator.plan.kubernetes import KubernetesSettings
from orchestrator.plan.sweep import Sweep, expand
from orchestrator.plan.sweep import per_block as sweep_per_block
from orchestrator.plan.workload import Workload


def _resolve_model(v: Any) -> Any:
    if isinstance(v, str):
        if v not in MODELS:
            raise ValueError(f"unknown model {v!r}; known: {', '.join(MODELS)} (or give a full spec)")
        return MODELS[v]
    return v


def _resolve_class(v: Any) -> Any:
    if isinstance(v, str):
        if v not in SERVICE_CLASSES:
            raise ValueError(
                f"unknown service class {v!r}; built in: {', '.join(SERVICE_CLASSES)} "
                "(or give {name, ttft_ms, tpot_ms})"
            )
        return SERVICE_CLASSES[v]
    return v


# Built from the catalogs at runtime, for the JSON schema only (never an annotation): a value of
# type Any to a type checker, which cannot read a Literal made from a dict's keys.
ModelName: Any = Literal[tuple(MODELS)]
ClassName: Any = Literal[tuple(SERVICE_CLASSES)]
# The schema shows both forms a user may write: a catalog name or a full spec.
ModelRef = Annotated[
    ModelSpec, BeforeValidator(_resolve_model, json_schema_input_type=ModelName | ModelSpec)
]
ClassRef = Annotated[
    ServiceClass, BeforeValidator(_resolve_class, json_schema_input_type=ClassName | ServiceClass)
]
Backend = Literal["sim", "virtual", "local", "kubernetes", "external"]
# Which way a bar's ratio must lie from its threshold (``Bar.direction``; analysis.stats judges it).
Direction = Literal["at_least", "at_most"]
DIRECTIONS: tuple[str, ...] = get_args(Direction)

# Arms are named by consecutive capital letters from A (A conventionally the baseline); two
# arms (A and B) is the simple case, every arm runs once in every block. Up to 8 written by
# hand (A to H); a sweep expands to up to 16 (A to P).
ARM_NAMES = "ABCDEFGHIJKLMNOP"
MAX_ARMS = len(ARM_NAMES)
MAX_HAND_ARMS = 8
COMPARE_PATTERN = f"^[{ARM_NAMES[0]}-{ARM_NAMES[-1]}]/[{ARM_NAMES[0]}-{ARM_NAMES[-1]}]$"


def arm_names_problem(names: Any) -> str | None:
    """Why a set of arm names is not A, B, ... in order (2 to 8 of them); None when it is."""
    got = sorted(str(n) for n in names)
    if 2 <= len(got) <= MAX_ARMS and got == list(ARM_NAMES[: len(got)]):
        return None
    return (f"arms must be named by consecutive letters from A: A and B, or A, B, C, ... up to "
            f"{ARM_NAMES[-1]} (2 to {MAX_ARMS} arms); got {', '.join(got) or 'none'}")


class Bar(StrictModel):
    """An acceptance bar, registered before any run: the ratio of a metric between two arms
    (``compare``: B/A by default, e.g. C/A in a plan of three arms) against a threshold."""

    model_config = StrictModel.model_config | {"populate_by_name": True}

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$", description="Stable id, e.g. interactive-capacity.")
    metric: Literal["capacity", "goodput_at", "attainment_at"] = Field(
        default="capacity", description="What is compared."
    )
    service_class: str = Field(alias="class", description="Service class the metric is taken at.")
    compare: str = Field(
        default="B/A", json_schema_extra={"pattern": COMPARE_PATTERN},
        description="Ratio compared with the threshold: arm over arm, e.g. B/A (the default) or C/A; "
                    "both arms of the plan, not the same one.",
    )
    at_least: float | None = Field(default=None, gt=0, le=1000, description="Accept if the ratio is at least this (at most 1000).")
    at_most: float | None = Field(default=None, gt=0, le=1000, description="Accept if the ratio is at most this (at most 1000).")
    confidence: float = Field(default=0.95, ge=0.5, lt=1, description="One-sided confidence.")
    rate: float | None = Field(
        default=None, gt=0, le=100_000,
        description="goodput_at / attainment_at: offered rate, requests/s (sessions/s for live "
        "sessions; at most 100000); open "
        "loop only: a closed-loop plan is judged at its N users.",
    )
    users: int | None = Field(
        default=None, ge=1, le=100_000,
        description="A closed loop that sweeps users (workload.closed.users a list): the level the bar is "
                    "judged at (one of them).",
    )

    @model_serializer(mode="wrap")
    def _omit_no_users(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Added after plans were registered (a bar at a users level hashes apart).
        return omit_while(handler(self), {"users": None})

    @field_validator("compare")
    @classmethod
    def _two_arm_names(cls, v: str) -> str:
        if not re.fullmatch(COMPARE_PATTERN, v):
            raise ValueError(f"compare names two arms as numerator/denominator, e.g. B/A or C/A (arms A to "
                             f"{ARM_NAMES[-1]}); got {v!r}")
        return v

    @model_validator(mode="after")
    def _one_threshold(self) -> Bar:
        problems: list[tuple[str, str]] = []
        if (self.at_least is None) == (self.at_most is None):
            problems.append(("at_least", "give exactly one of `at_least` or `at_most`"))
        if self.metric == "capacity" and self.rate is not None:
            problems.append(("rate", "a capacity bar takes no `rate` (capacity is searched)"))
        if problems:
            raise CrossFieldError(problems)
        return self

    @property
    def pair(self) -> tuple[str, str]:
        """(numerator, denominator) arms of the compared ratio: ("B", "A") for B/A."""
        num, den = self.compare.split("/")
        return num, den

    @property
    def threshold(self) -> float:
        """The registered threshold on the ratio (``compare``, B/A by default)."""
        return self.at_least if self.at_least is not None else float(self.at_most or 0)

    @property
    def direction(self) -> Direction:
        """``at_least`` (the numerator must be this much better) or ``at_most`` (regression gate)."""
        return "at_least" if self.at_least is not None else "at_most"


PROMPT_LENGTH_TOLERANCE = 0.05


class GuardThresholds(StrictModel):
    """Thresholds of the validity guards (DESIGN section 9), registered with the plan."""

    max_send_lag_p99_ms: float = Field(default=5.0, gt=0, le=60_000, description="Generator lag: p99 send lag bound, ms (at most 60000).")
    max_rate_shortfall: float = Field(
        default=0.02, ge=0, lt=1, description="Generator lag: achieved vs scheduled send rate shortfall."
    )
    max_duplicate_prompts: int = Field(
        default=0, ge=0, le=1_000_000_000,
        description="Repeated prompts: prompts identical beyond the shared prefix (at most 1e9)."
    )
    prefix_hit_tolerance: float = Field(
        default=0.15, ge=0, le=1, description="Repeated prompts: |server hit rate - expected| bound."
    )
    max_wrong_output_share: float = Field(
        default=0.0, ge=0, le=1, description="Output limit: share of finished requests with wrong length."
    )
    max_identical_output_share: float = Field(
        default=0.5, ge=0, le=1, description="Frozen randomness: share of requests sharing one output."
    )
    stall_gap_ms: float = Field(default=500, gt=0, le=3_600_000, description="Stalls: an inter-token gap beyond this, ms (at most 3600000).")
    max_stall_share: float = Field(
        default=0.01, ge=0, le=1, description="Stalls: share of requests with a stall before failing."
    )
    steady_state_tolerance: float = Field(
        default=0.15, ge=0, le=1, description="Steady state: first vs last third, relative difference."
    )
    max_access_path_share: float = Field(
        default=0.05, gt=0, le=1,
        description="Access path: the p99 round trip the load's path to the router adds (a "
        "port-forward or ingress, measured before the points) may be at most this share of the "
        "judged class's TTFT limit; beyond it TTFT measures the path, not the server.",
    )
    prompt_length_tolerance: float = Field(
        default=PROMPT_LENGTH_TOLERANCE, ge=0, le=10,
        description="Prompt length: the median over a point's requests of |server's "
        "usage.prompt_tokens - the prompt length the workload asked for| / that length may be at "
        "most this (5%: the synthetic words are one token each under the tokenizers they were "
        "chosen for; a tokenizer that splits them, or a chat template on short prompts, moves "
        "it). Not checked when the server reports no usage.",
    )
    max_sim_lateness_p99_ms: float = Field(
        default=50.0, gt=0, le=3_600_000,
        description="Simulator timing: p99 of how late a simulated server's steps end against its "
        "model. Up to 50 ms a late step is followed by on-time ones (the server keeps the model's "
        "timeline); beyond, it restarts the timeline and runs slower than its model: a CPU-starved "
        "simulator measures the machine, not the model. Real engines: not checked. At most 3600000.",
    )

    @model_serializer(mode="wrap")
    def _omit_default_prompt_length(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Added after plans were registered (a plan that sets another tolerance hashes apart).
        return omit_while(handler(self), {"prompt_length_tolerance": PROMPT_LENGTH_TOLERANCE})


class SimSettings(StrictModel):
    """Parameters of the simulated engine: noise and faults (off by default)."""

    noise: float = Field(
        default=0.0, ge=0, le=0.5, description="Run-to-run efficiency jitter (sigma, relative)."
    )
    stall_every_steps: int = Field(default=0, ge=0, le=1_000_000_000, description="Stall once every N engine steps (0: never; at most 1e9).")
    stall_ms: float = Field(default=0.0, ge=0, le=3_600_000, description="Length of one stall, ms (at most 3600000).")
    kv_link: Literal["nvlink", "rdma"] = Field(
        default="nvlink", description="Prefill-to-decode KV path: within a node or between nodes."
    )
    rdma_bytes_s: float = Field(default=50e9, gt=0, le=1e13, description="RDMA bandwidth per GPU, bytes/s (400 Gb/s; at most 1e13).")


class Plan(StrictModel):
    """An experiment plan. Registered (hashed and stored) before its first run; never edited."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="Experiment name.")
    hypothesis: str = Field(default="", description="What the experiment is meant to show, in words.")
    model: ModelRef = Field(description="Catalog name (e.g. qwen3-8b) or a full model spec.")
    arms: dict[str, Arm] = Field(
        description="The arms: A and B, or more named by consecutive letters (A, B, C, ... up to H; a sweep "
                    "writes up to P); "
                    "every block runs each arm once."
    )
    router: RouterConfig = Field(
        default_factory=RouterConfig, description="Router of every arm that sets none."
    )
    workload: Workload = Field(description="Arrivals, prompts, replies.")
    classes: list[ClassRef] = Field(
        default_factory=lambda: list(SERVICE_CLASSES.values()),
        min_length=1,
        max_length=64,
        description="Service classes measured: built-in names or {name, ttft_ms, tpot_ms} (at most 64).",
    )
    search: SearchSettings = Field(description="Capacity search settings.")
    design: Design = Field(default_factory=Design, description="Blocks and order.")
    bars: list[Bar] = Field(default_factory=list, max_length=64, description="Acceptance bars, registered before any run (at most 64).")
    guards: GuardThresholds = Field(default_factory=GuardThresholds, description="Validity guard thresholds.")
    backend: Backend = Field(
        default="sim",
        description="Where arms run: sim, local or kubernetes; virtual: the simulated engine in virtual "
        "time (seconds per experiment, no servers); external: each arm's `endpoint`, already running.",
    )
    sim: SimSettings = Field(default_factory=SimSettings, description="Simulated engine parameters.")
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings, description="Cluster settings (backend: kubernetes).")
    sweep: Sweep | None = Field(
        default=None,
        description="Factors and levels over arm A's fields, expanded into the plan's arms (A: every "
                    "factor at its first level); the verdict estimates each factor's effect.",
    )

    @model_validator(mode="before")
    @classmethod
    def _expand_sweep(cls, data: Any) -> Any:
        """A sweep plan gives arm A (the base); its arms are the sweep's cells. The canonical
        form holds the expanded arms too: they must be what the sweep writes."""
        if not isinstance(data, dict):
            return data
        swept = swept_arms(data)
        if swept is None:
            return data
        arms, problems = swept
        if problems:
            raise CrossFieldError([(f"sweep.{path}", msg) for path, msg in problems])
        given = {k: v for k, v in data["arms"].items() if k != "A"}
        if given and not _same_arms(given, arms):
            raise CrossFieldError([("arms", "a sweep plan gives one arm, A (the base arm its factors vary); the "
                                            f"sweep writes the others: remove arms {', '.join(map(str, given))}")])
        return {**data, "arms": arms}

    @model_serializer(mode="wrap")
    def _omit_no_sweep(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Added after plans were registered (a sweep plan hashes apart; every other keeps its hash).
        return omit_while(handler(self), {"sweep": None})

    @field_validator("arms")
    @classmethod
    def _named_a_b_c(cls, v: dict[str, Arm]) -> dict[str, Arm]:
        problem = arm_names_problem(v)
        if problem:
            raise ValueError(problem)
        return dict(sorted(v.items()))

    @model_validator(mode="after")
    def _cross_checks(self) -> Plan:
        problems = cross_check(
            model=self.model, arms=self.arms, workload=self.workload, classes=self.classes, bars=self.bars,
            backend=self.backend,
        )
        problems.extend(_router_policy_fits(self.router, self.arms))
        if self.sweep is None and len(self.arms) > MAX_HAND_ARMS:
            problems.append(Problem("arms", f"at most {MAX_HAND_ARMS} arms written by hand (A to "
                                            f"{ARM_NAMES[MAX_HAND_ARMS - 1]}); a sweep (`sweep:`) writes up to "
                                            f"{MAX_ARMS} (A to {ARM_NAMES[-1]}) from arm A"))
        if self.sweep is not None and not self.bars:
            problems.append(Problem("bars", "a sweep's effects are stored with the verdicts of its bars: register "
                                            "at least one bar (e.g. the arm of every factor's last level over A)"))
        problems.extend(self._incomplete_problems())
        if problems:
            raise PlanError(problems)
        return self

    def _incomplete_problems(self) -> list[Problem]:
        """Incomplete blocks: a number of blocks that holds every other arm equally often, and
        bars between arms that share a block (a bar's ratio is taken within blocks)."""
        k = self.per_block
        if k is None:
            return []
        out = []
        if (why := blocks_problem(len(self.arms), k, self.design.blocks)) is not None:
            out.append(Problem("design.blocks", why))
        for i, bar in enumerate(self.bars):
            num, den = bar.pair
            if num != den and num in self.arms and den in self.arms and not shared_blocks(
                    tuple(self.arms), k, self.design.blocks, (num, den)):
                out.append(Problem(f"bars.{i}.compare", f"compare {bar.compare}: arms {num} and {den} never run in the "
                                                        f"same block ({describe_blocks(len(self.arms), k)}); a bar "
                                                        f"compares two arms within blocks: compare each with A "
                                                        f"({num}/A, {den}/A), or read their ratio off the effects"))
        return out

    @property
    def per_block(self) -> int | None:
        """Arms per block of an incomplete design (a sweep's ``max_arms_per_block`` below its
        arms); None when every block runs every arm."""
        return None if self.sweep is None else sweep_per_block(self.sweep)

    def block_arms(self) -> list[tuple[str, ...]]:
        """The arms each planned block runs (every arm, unless the blocks are incomplete), A first."""
        return block_arms(tuple(self.arms), self.per_block, self.design.blocks)

    @property
    def planned_runs(self) -> int:
        """Runs the design plans: one per arm of each block."""
        return sum(len(held) for held in self.block_arms())

    def arm(self, name: str) -> Arm:
        """An arm by name (``A``, ``B``, ...)."""
        return self.arms[name]

    def router_for(self, name: str) -> RouterConfig:
        """The router an arm runs behind: its own or the plan's."""
        return self.arms[name].router or self.router

    def service_class(self, name: str) -> ServiceClass:
        """A measured class by name."""
        for c in self.classes:
            if c.name == name:
                return c
        raise KeyError(name)


# Section name -> type, so cross checks can run on the sections that validate on their own
# even when another part of the plan is wrong (every problem reported at once).
SECTION_TYPES: dict[str, Any] = {
    "model": ModelRef,
    "arms": dict[str, Arm],
    "workload": Workload,
    "classes": list[ClassRef],
    "bars": list[Bar],
    "backend": Backend,
}


def cross_check(
    model: ModelSpec | None,
    arms: dict[str, Arm] | None,
    workload: Workload | None,
    classes: list[ServiceClass] | None,
    bars: list[Bar] | None,
    backend: str | None = None,
) -> list[Problem]:
    """Checks across sections; each runs when the sections it needs are valid."""
    problems: list[Problem] = []
    if arms is not None and backend is not None:
        problems.extend(_endpoints_match_backend(arms, backend))
    if classes is not None:
        seen: set[str] = set()
        for i, c in enumerate(classes):
            if c.name in seen:
                problems.append(Problem(f"classes.{i}", f"class {c.name!r} is listed twice"))
            seen.add(c.name)
    if bars is not None:
        ids: set[str] = set()
        for i, bar in enumerate(bars):
            if bar.id in ids:
                problems.append(Problem(f"bars.{i}.id", f"bar id {bar.id!r} is used twice"))
            ids.add(bar.id)
            if classes is not None and bar.service_class not in {c.name for c in classes}:
                measured = ", ".join(c.name for c in classes)
                problems.append(
                    Problem(
                        f"bars.{i}.class",
                        f"class {bar.service_class!r} is not measured by this plan (classes: {measured})",
                    )
                )
            if workload is not None:
                problems.extend(_bar_fits_loop(i, bar, workload))
            num, den = bar.pair
            if num == den:  # here, not in Bar: reported with the other bars' compare problems
                problems.append(Problem(f"bars.{i}.compare",
                                        f"compare {bar.compare} is an arm against itself: name two arms, e.g. B/A"))
            elif arms is not None:
                missing = [a for a in dict.fromkeys(bar.pair) if a not in arms]
                if missing:
                    problems.append(Problem(
                        f"bars.{i}.compare",
                        f"compare {bar.compare}: the plan has no arm {' or '.join(missing)} "
                        f"(arms: {', '.join(sorted(arms))})"))
    if model is not None and arms is not None:
        for name, arm in arms.items():
            if not arm.external:
                problems.extend(_weights_fit(model, name, arm))
    return problems


def _bar_fits_loop(i: int, bar: Bar, workload: Workload) -> list[Problem]:
    """Open loop: a point metric names its offered rate. Closed loop: no capacity (DESIGN 7:
    capacity comes from open-loop runs only) and no rate (the point is the plan's N users)."""
    if workload.open_loop:
        out = []
        if bar.metric != "capacity" and bar.rate is None:
            out.append(Problem(f"bars.{i}.rate", f"metric {bar.metric} needs the offered `rate`"))
        if bar.users is not None:
            out.append(Problem(f"bars.{i}.users", "an open-loop plan is judged at a rate; `users` names a level "
                                                  "of a closed loop's users (workload.closed.users)"))
        return out
    levels = workload.closed.levels if workload.closed is not None else ()
    out = []
    if bar.users is None and len(levels) > 1:
        out.append(Problem(f"bars.{i}.users", f"the workload sweeps users ({', '.join(map(str, levels))}): name "
                                              f"the level the bar is judged at, e.g. `users: {levels[-1]}`"))
    if bar.users is not None and bar.users not in levels:
        out.append(Problem(f"bars.{i}.users", f"{bar.users} is not a level of workload.closed.users "
                                              f"({', '.join(map(str, levels))})"))
    if bar.metric == "capacity":
        out.append(Problem(f"bars.{i}.metric",
                           "capacity comes from open-loop runs only; this workload is closed loop "
                           "(workload.closed): use goodput_at or attainment_at, judged at its users"))
    if bar.rate is not None:
        out.append(Problem(f"bars.{i}.rate",
                           "a closed-loop plan is judged at its workload.closed.users, not at a rate: "
                           "remove `rate`"))
    return out


def _router_policy_fits(router: RouterConfig, arms: dict[str, Arm]) -> list[Problem]:
    """The plan's router runs in front of every arm without its own: each arm's engine's router
    must have its policy (an arm's own router is checked with the arm)."""
    return [Problem("router.policy", f"arm {name} serves {arm.engine.kind}: "
                    + router_policy_problem(arm.engine.kind, router.policy))
            for name, arm in arms.items()
            if not arm.external and arm.router is None
            and router.policy not in ROUTER_POLICIES_OF[arm.engine.kind]]


def _endpoints_match_backend(arms: dict[str, Arm], backend: str) -> list[Problem]:
    """backend external: every arm names its endpoint; any other backend: none does."""
    out: list[Problem] = []
    for name, arm in arms.items():
        if backend == "external" and not arm.external:
            out.append(Problem(f"arms.{name}.endpoint",
                               "backend external sends load to running stacks: every arm needs an "
                               "`endpoint: {url, model}` (and `labels` to find it in history)"))
        elif backend != "external" and arm.external:
            out.append(Problem(f"arms.{name}.endpoint",
                               f"backend {backend} provisions the arm itself; an endpoint applies to "
                               "backend external only (set `backend: external`, or remove the endpoint)"))
    return out


def swept_arms(data: dict[str, Any]) -> tuple[dict[str, Arm], list[tuple[str, str]]] | None:
    """A plan document's sweep expanded from its arm A: (arms, problems below ``sweep``); None
    when it has no sweep, or its sweep or arm A is wrong on its own (reported by their fields)."""
    if data.get("sweep") is None or not isinstance(data.get("arms"), dict):
        return None
    try:
        sweep = Sweep.model_validate(data["sweep"])
        base = Arm.model_validate(data["arms"].get("A"))
    except ValidationError:
        return None
    router = data.get("router") if isinstance(data.get("router"), dict) else None
    return expand(sweep, base, ARM_NAMES, router)


def _same_arms(given: dict[Any, Any], arms: dict[str, Arm]) -> bool:
    """The arms a canonical form holds are the sweep's expansion."""
    if set(given) != set(arms) - {"A"}:
        return False
    try:
        return all(Arm.model_validate(v) == arms[str(k)] for k, v in given.items())
    except ValidationError:
        return False


def _external_warnings(plan: Plan) -> list[str]:
    external = {n: a for n, a in plan.arms.items() if a.endpoint is not None}
    out = [
        f"arms.{n}: no `labels`; history will list it as gpu unknown, layout external "
        "(give labels.gpu, labels.layout, labels.replicas, labels.engine_version)"
        for n, a in external.items() if a.labels is None or a.labels.gpu is None
    ]
    same: dict[tuple[str, str], list[str]] = {}
    for n, a in external.items():
        if a.endpoint is not None:
            same.setdefault((a.endpoint.url, a.endpoint.model), []).append(n)
    out.extend(f"arms: {' and '.join(names)} send load to the same endpoint and model: an A/A comparison"
               for names in same.values() if len(names) > 1)
    return out


def _weights_fit(model: ModelSpec, name: str, arm: Arm) -> list[Problem]:
    assert arm.gpu is not None
    spec = GPUS[arm.gpu]
    usable = spec.memory_bytes * arm.engine.gpu_memory_utilization
    weights = model.weight_bytes(arm.engine.quantization)
    out: list[Problem] = []
    for role, pool in arm.pools().items():
        per_gpu = weights / pool.tp
        if per_gpu >= usable:
            path = f"arms.{name}.tp" if role == "worker" else f"arms.{name}.{role}.tp"
            out.append(
                Problem(
                    path,
                    f"{model.name} weights need {per_gpu / 1e9:.1f} GB per GPU at TP {pool.tp}; "
                    f"{arm.gpu} offers {usable / 1e9:.1f} GB at gpu_memory_utilization "
                    f"{arm.engine.gpu_memory_utilization}: raise tp or quantize",
                )
            )
    return out


def plan_warnings(plan: Plan) -> list[str]:
    """Things that are legal but probably not what the user meant."""
    out: list[str] = []
    ctx = plan.workload.mean_context_tokens()
    out.extend(_external_warnings(plan))
    for name, arm in plan.arms.items():
        if arm.external or arm.gpu is None:
            continue  # not provisioned here: its memory is not the plan's to check
        spec = GPUS[arm.gpu]
        kv_per_token = plan.model.kv_bytes_per_token(arm.engine.kv_cache_dtype)
        for role, pool in arm.pools().items():
            if role == "prefill":
                continue
            free = spec.memory_bytes * arm.engine.gpu_memory_utilization * pool.tp
            free -= plan.model.weight_bytes(arm.engine.quantization)
            fit = int(max(free, 0) // (kv_per_token * ctx))
            if fit < arm.engine.max_num_seqs:
                out.append(
                    f"arms.{name}: the KV cache holds about {fit} sequences of the workload's mean "
                    f"context ({ctx:.0f} tokens), fewer than max_num_seqs={arm.engine.max_num_seqs}; "
                    "the engine will queue or preempt"
                )
    if plan.bars and len(plan.arms) > 2 and plan.sweep is None:  # a sweep's arms are judged by its effects
        compared = {a for bar in plan.bars for a in bar.pair}
        out.extend(f"arms.{n}: no bar compares it; it is run in every block but judged by none"
                   for n in plan.arms if n not in compared)
    if plan.bars and plan.design.blocks < 2:
        out.append("design.blocks: a bar is judged over blocks; with fewer than 2 it stays INCONCLUSIVE")
    k = plan.per_block
    if k is not None and plan.design.blocks * (k - 1) - (len(plan.arms) - 1) < 1:
        out.append(f"design.blocks: {plan.design.blocks} incomplete blocks of {k} arms leave no degrees of freedom "
                   f"for the error of the sweep's effects (runs within blocks, {plan.design.blocks * (k - 1)}, "
                   f"not above the {len(plan.arms) - 1} arms they compare with A): the effects get no interval; "
                   f"use more blocks")
    return out
