"""Export an experiment to llm-d-benchmark's benchmark report format v0.2: one report per load
point (that format describes one stack under one load), so that ecosystem's tools can read
our measurements.

Mapping: run = the point (uid), the experiment (eid), the backend's node pool (cid);
scenario.stack = one inference_engine per pool of the arm (role replica for colocated
workers, prefill / decode when disaggregated) plus the router as a generic component;
scenario.load = the workload at the point's offered rate (open loop: concurrency .inf);
results.request_performance.aggregate = the point's measured requests. Latency statistics
are over finished requests (the format's convention); failed and unfinished ones are counted
in requests.failures / requests.incomplete. Per-class attainment and goodput, which the
format has no field for, are under results.observability.service_classes.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml

from orchestrator import __version__
from orchestrator.engines import Role, ServeTarget, engine_for
from orchestrator.plan import GPUS, Plan
from orchestrator.plan.workload import LengthDist
from orchestrator.records import ERROR_OR_TIMEOUT_STATUSES, RequestRecord
from orchestrator.report import llmd_schema as br
from orchestrator.report.data import ExperimentData
from orchestrator.store import RunInfo, config_columns

ROUTER_TOOLS = {"vllm": "vllm-router", "sglang": "sglang-router"}
DIST: dict[str, Literal["fixed", "gaussian", "random", "other"]] = {
    "fixed": "fixed", "normal": "gaussian", "uniform": "random", "lognormal": "other"}
# Arm.pools() role -> the format's engine role.
ROLE: dict[str, Literal["replica", "prefill", "decode"]] = {
    "worker": "replica", "prefill": "prefill", "decode": "decode"}


def _sha(*parts: object, n: int = 32) -> str:
    return hashlib.sha256(":".join(str(p) for p in parts).encode()).hexdigest()[:n]


def _stats(values: list[float], units: str) -> br.Statistics | None:
    a = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if a.size == 0:
        return None
    p = np.percentile(a, [50, 90, 95, 99])
    return br.Statistics(units=units, mean=float(a.mean()), stddev=float(a.std()), min=float(a.min()),
                         p50=float(p[0]), p90=float(p[1]), p95=float(p[2]), p99=float(p[3]),
                         max=float(a.max()))


def _one(value: float, units: str) -> br.Statistics:
    return br.Statistics(units=units, mean=float(value))


def _seq_len(d: LengthDist) -> br.SequenceLength:
    return br.SequenceLength(
        distribution=DIST[d.dist], value=max(1.0, d.mean),
        std_dev=d.sigma if d.dist == "normal" else None,
        min=d.min, max=d.max,
    )


def accelerator_name(gpu: str | None) -> str:
    """The GPU as NVIDIA's GPU Feature Discovery names it (the most specific label known)."""
    spec = GPUS.get(gpu or "")
    return spec.node_labels[-1] if spec else (gpu or "unknown")


def _engine_args(plan: Plan, arm: str, tp: int, role: Role) -> dict[str, Any]:
    """The worker's engine arguments as the backends render them (the engine adapter's), as a
    flag -> value map (JSON-valued flags as objects); host and port are the deployment's."""
    spec = plan.arm(arm)
    target = ServeTarget(model=plan.model.hf_id or plan.model.name, host="0.0.0.0", port=8000, tp=tp, role=role)
    engine = engine_for(spec)
    model, *flags = engine.serve_args(plan, spec, target)
    args: dict[str, Any] = {engine.launcher("cuda").model_flag or "--model": model}
    i = 0
    while i < len(flags):
        flag, value = flags[i], flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else None
        i += 1 if value is None else 2
        if flag not in ("--host", "--port"):
            args[flag] = json.loads(value) if value is not None and value.startswith("{") else value
    return args


def stack(plan: Plan, run: RunInfo) -> list[br.Component]:
    """One inference_engine per pool of the run's arm, and the router."""
    arm = plan.arm(run.arm)
    fp = run.fingerprint or {}
    cfg = config_columns(plan, run.arm)["config_sha256"][:32]
    backend = str(fp.get("backend", plan.backend))
    tool = arm.engine.kind if backend != "sim" else "orchestrator-sim"
    version = str(fp.get("engine_version") or arm.engine.version)
    gpu = str(fp.get("gpu_type") or arm.gpu or "")
    out = []
    for role, pool in arm.pools().items():
        std_role = ROLE[role]
        for i in range(pool.replicas):
            out.append(br.Component(
                metadata=br.ComponentMetadata(
                    kind="inference_engine", label=f"{run.arm}-{role}-{i}", cfg_id=_sha(cfg, role),
                    description=f"arm {run.arm}: {role} {i + 1} of {pool.replicas} ({backend} backend)"),
                standardized=br.InferenceEngine(
                    tool=tool, tool_version=version, role=std_role,
                    model=br.EngineModel(name=plan.model.hf_id or plan.model.name),
                    accelerator=br.Accelerator(model=accelerator_name(gpu), count=pool.tp,
                                               parallelism=br.Parallelism(tp=pool.tp))),
                native=br.ComponentNative(args=_engine_args(plan, run.arm, pool.tp, role)),
            ))
    router = plan.router_for(run.arm)
    out.append(br.Component(
        metadata=br.ComponentMetadata(kind="generic", label=f"{run.arm}-router", cfg_id=_sha(cfg, "router"),
                                      description=f"request router ({ROUTER_TOOLS[arm.engine.kind]})"),
        standardized=br.Generic(tool=ROUTER_TOOLS[arm.engine.kind], tool_version=str(fp.get("router_version", "unknown")),
                                kind_draft="router", policy=router.policy),
        native=br.ComponentNative(config=router.model_dump(mode="json")),
    ))
    return out


def load(plan: Plan, offered_rate: float | None, users: int | None, stage: int) -> br.Load:
    w = plan.workload
    prompts = w.prompts
    prefix = None
    if prompts.shared_prefix > 0:
        prefix_tokens = max(1.0, round(prompts.shared_prefix * prompts.input_tokens.mean))
        prefix = br.LoadPrefix(
            prefix_len=br.SequenceLength(distribution="fixed", value=prefix_tokens),
            num_groups=1, num_users_per_group=prompts.conversations, num_prefixes=1)
    turns = None
    if prompts.turns > 1:
        turns = br.MultiTurn(max_turns=br.SequenceLength(distribution="fixed", value=prompts.turns))
    closed = w.closed is not None
    return br.Load(
        metadata=br.LoadMetadata(cfg_id=_sha(w.model_dump_json()),
                                 description=f"{'closed' if closed else 'open'}-loop synthetic workload of plan {plan.name}"),
        standardized=br.LoadStandardized(
            tool="orchestrator", tool_version=__version__, source="random", stage=stage,
            input_seq_len=_seq_len(prompts.input_tokens),
            output_seq_len=br.SequenceLength(distribution="fixed", value=w.output_tokens),
            prefix=prefix, multi_turn=turns,
            rate_qps=None if closed or not offered_rate else float(offered_rate),
            concurrency=users if closed and users else (None if closed else math.inf),
        ),
        native=br.ComponentNative(config={"workload": w.model_dump(mode="json"),
                                          "search": plan.search.model_dump(mode="json")}),
    )


def request_performance(records: list[RequestRecord], n_scheduled: int, window_s: float) -> br.RequestPerformance:
    """Aggregates over the point's measured requests (phase measure)."""
    recs = [r for r in records if r.phase == "measure"]
    fin = [r for r in recs if r.finished]
    failures = sum(1 for r in recs if r.status in ERROR_OR_TIMEOUT_STATUSES)
    total = max(n_scheduled, len(recs))
    w = window_s if window_s > 0 else 1.0
    out_tokens = sum(r.output_tokens or 0 for r in fin)
    in_tokens = sum(r.prompt_tokens for r in fin)

    def ntpot(r: RequestRecord) -> float:
        return r.e2e_s / r.output_tokens if r.output_tokens else math.nan

    return br.RequestPerformance(aggregate=br.AggregateRequestPerformance(
        requests=br.AggregateRequests(
            total=total, failures=failures, incomplete=total - len(fin) - failures,
            input_length=_stats([r.prompt_tokens for r in recs], "count"),
            output_length=_stats([r.output_tokens for r in fin if r.output_tokens is not None], "count"),
        ),
        latency=br.AggregateLatency(
            time_to_first_token=_stats([r.ttft_s for r in fin], "s"),
            time_per_output_token=_stats([r.tpot_s for r in fin], "s/token"),
            normalized_time_per_output_token=_stats([ntpot(r) for r in fin], "s/token"),
            request_latency=_stats([r.e2e_s for r in fin], "s"),
        ),
        throughput=br.AggregateThroughput(
            input_token_rate=_one(in_tokens / w, "tokens/s"),
            output_token_rate=_one(out_tokens / w, "tokens/s"),
            total_token_rate=_one((in_tokens + out_tokens) / w, "tokens/s"),
            requests_rate=_one(len(fin) / w, "queries/s"),
        ),
    ))


def _iso_duration(seconds: float) -> str:
    return f"PT{seconds:.3f}S"


def point_report(data: ExperimentData, point: Any) -> br.BenchmarkReport:
    """The benchmark report of one load point (a row of data.points)."""
    run = data.run(int(point.run_id))
    plan = data.plan
    window = float(point.window_end_s - point.window_start_s)
    context = point.context if isinstance(point.context, dict) else {}
    started = context.get("started_at")
    start = (datetime.fromtimestamp(started, UTC) + timedelta(seconds=float(point.window_start_s))
             if started else None)
    fp = run.fingerprint or {}
    records = data.requests(int(point.id))
    n_measured = sum(1 for r in records if r.phase == "measure")
    report = br.BenchmarkReport(
        run=br.Run(
            uid=_sha(data.registration.sha256, data.experiment.id, point.id),
            eid=_sha(data.registration.sha256, data.experiment.id),
            cid=_sha(fp.get("backend", plan.backend), fp.get("node_pool", ""), fp.get("cluster", "")),
            time=br.RunTime(start=start, end=start + timedelta(seconds=window) if start else None,
                            duration=_iso_duration(window)),
            user=None,
        ),
        scenario=br.Scenario(stack=stack(plan, run),
                             load=load(plan, point.offered_rate, point.users, int(point.seq))),
        results=br.Results(
            request_performance=request_performance(records, n_measured, window),
            observability=br.Observability(
                service_classes=point.per_class or {},
                server_prefix_hit_rate=context.get("server_prefix_hit_rate"),
                orchestrator={"experiment": data.experiment.name, "run_id": run.id, "arm": run.arm,
                              "block": run.block, "attempt": run.attempt, "point_id": int(point.id),
                              "point_valid": bool(point.valid), "run_valid": run.valid,
                              "plan_sha256": data.registration.sha256},
            ),
        ),
    )
    return report


def export_llmd(data: ExperimentData, out_dir: str | Path) -> list[Path]:
    """Write one v0.2 benchmark report (YAML) per load point; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", data.experiment.name)
    paths = []
    for point in data.points.itertuples(index=False):
        doc = point_report(data, point).dump()
        path = out / f"{slug}-b{point.block}-{point.arm}-a{point.attempt}-p{point.seq}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        paths.append(path)
    return paths
