"""One load point against a deployed arm: schedule, send, stream records to the store,
measure, guard. The executor decides which rates; this measures one."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.analysis.guards import GuardResult, PointContext, prompt_length, run_guards
from orchestrator.analysis.metrics import PointMetrics, point_metrics
from orchestrator.analysis.saturation import EarlyStop, SaturationWatch
from orchestrator.backends.base import Backend, Deployment
from orchestrator.control.design import point_seed
from orchestrator.control.load_kinds import LoadPoint, Send, load_kind, run_sharded
from orchestrator.control.progress import AttainmentTally, ProgressSink
from orchestrator.control.prompt_fit import fit_point_prompts
from orchestrator.control.spool import SpoolingSink
from orchestrator.engines import EngineMetrics, engine_for
from orchestrator.loadgen.runner import STOPPED_EARLY, PointSummary
from orchestrator.loadgen.schedules import shards_needed
from orchestrator.loadgen.scrape import Sample, parse_metrics
from orchestrator.loadgen.workloads import expected_prefix_hit_rate
from orchestrator.plan import Plan
from orchestrator.records import RequestRecord
from orchestrator.store.protocol import StoreLike


@dataclass
class PointOutcome:
    """What one point measured and whether it may be counted."""

    point_id: int
    rate: float
    metrics: PointMetrics
    guards: list[GuardResult]
    server_hit_rate: float | None
    records: list[RequestRecord] = field(repr=False, default_factory=list)
    stored: int = 0
    spooled: bool = False
    early_stop: EarlyStop | None = None  # why it stopped sending before its window ended

    @property
    def valid(self) -> bool:
        return all(g.passed for g in self.guards)

    @property
    def failed_guards(self) -> list[GuardResult]:
        return [g for g in self.guards if not g.passed]

    def class_values(self, name: str) -> tuple[float, float]:
        """(attainment, goodput tokens/s) of a class at this point."""
        c = self.metrics.per_class[name]
        return c.attainment, c.goodput_tok_s


def counter_total(samples: Sequence[Sample], name: str) -> float:
    """Sum of a counter over every label set and source (``name`` or ``name_total``)."""
    return sum(s.value for s in samples if s.name in (name, f"{name}_total"))


def scrape_samples(backend: Backend, dep: Deployment) -> list[Sample]:
    out: list[Sample] = []
    for text in backend.scrape(dep).values():
        try:
            out.extend(parse_metrics(text))
        except ValueError:
            continue
    return out


def server_prefix_hit_rate(before: Sequence[Sample], after: Sequence[Sample],
                           m: EngineMetrics) -> float | None:
    """Prefix-cache hits / queries over the point, from the engine's counters (None if not exported)."""
    q = counter_total(after, m.prefix_queries) - counter_total(before, m.prefix_queries)
    h = counter_total(after, m.prefix_hits) - counter_total(before, m.prefix_hits)
    if q <= 0:
        return None
    return h / q


SIM_LATENESS = "orch_sim_step_lateness_seconds"


def access_path_p99(dep: Deployment) -> float | None:
    """The p99 round trip of the load's path to the router, if the backend measured one
    (a port-forward or ingress from outside the cluster)."""
    path = dep.fingerprint.details.get("access_path")
    if isinstance(path, dict) and path.get("rtt_p99_ms") is not None:
        return float(path["rtt_p99_ms"]) / 1000
    return None


def sim_lateness_p99(before: Sequence[Sample], after: Sequence[Sample]) -> float | None:
    """Upper bound of the histogram bucket holding the p99 of the simulated servers' step
    lateness over the point (None when no server exports it: a real engine)."""
    def buckets(samples: Sequence[Sample]) -> dict[float, float]:
        out: dict[float, float] = {}
        for s in samples:
            if s.name == SIM_LATENESS + "_bucket":
                le = float(s.labels.get("le", "inf"))
                out[le] = out.get(le, 0.0) + s.value  # summed over servers
        return out

    b, a = buckets(before), buckets(after)
    delta = sorted((le, a[le] - b.get(le, 0.0)) for le in a)
    if not delta or delta[-1][1] <= 0:
        return None
    total = delta[-1][1]
    return next(le for le, cum in delta if cum >= 0.99 * total)


def busy_requests(samples: Sequence[Sample], m: EngineMetrics) -> float | None:
    """Requests running or waiting on the servers (None when they export no such gauge)."""
    names = (m.running, m.waiting)
    found = [s.value for s in samples if s.name in names]
    return sum(found) if found else None


def settle(backend: Backend, dep: Deployment, m: EngineMetrics, timeout_s: float = 30.0) -> float:
    """Wait until the servers are idle (a point must not inherit the last one's backlog);
    returns the seconds waited. Servers without the engine's gauges are not waited for."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        busy = busy_requests(scrape_samples(backend, dep), m)
        if not busy:
            break
        time.sleep(0.2)
    return time.monotonic() - start


class DuringScraper:
    """Scrapes the deployment every ``every_s`` while a point runs, in its own thread (through
    the backend, so a cluster's pod proxy works too; never on the generator's event loop)."""

    def __init__(self, backend: Backend, dep: Deployment, every_s: float):
        self.backend, self.dep, self.every_s = backend, dep, every_s
        self.snapshots: list[tuple[float, list[Sample]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scrape-during-point", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.snapshots.append((time.time(), scrape_samples(self.backend, self.dep)))

    def __enter__(self) -> DuringScraper:
        if self.dep.driver.realtime:  # a virtual point ends before the first scrape is due
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


def drain_seconds(plan: Plan) -> float:
    """How long to wait for in-flight requests after the last send: past this, a request has
    missed every class anyway (TTFT limit + TPOT limit per token), with margin."""
    w = plan.workload
    # Drawn reply lengths: wait for a long one (its clip, else 3x the mean), not the mean one.
    longest = (w.output_dist.max or 3 * w.output_tokens) if w.output_dist is not None else w.output_tokens
    worst = max(c.ttft_ms / 1e3 + c.tpot_ms / 1e3 * longest for c in plan.classes)
    return min(60.0, 1.5 * worst + 1.0)


def _flush_within(sink: SpoolingSink, budget_s: float) -> bool:
    """Write what the sink spooled during an outage, retrying with backoff for up to
    ``budget_s``; True when nothing is left on disk (else the spool waits for the resume)."""
    deadline, delay = time.monotonic() + budget_s, 0.2
    while not (flushed := sink.flush()) and time.monotonic() < deadline:
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(2 * delay, 5.0)
    return flushed


def watched(sink: Callable[[list[RequestRecord]], None], progress: ProgressSink | None,
            tally: AttainmentTally) -> Callable[[list[RequestRecord]], None]:
    """``sink`` (the point's store sink), teed: each batch the load generator hands over (every
    ``flush_s``, in its sink thread; from the driver for Ray shards) is counted for the live
    display first (in memory), then stored. Sync, as shards need."""
    if progress is None:
        return sink

    def tee(batch: list[RequestRecord]) -> None:
        with contextlib.suppress(Exception):  # the display must never cost the point its records
            progress.point_progress(tally.add(batch))
        sink(batch)

    return tee


class PointRunner:
    """Measures load points of one run and stores everything as it goes. ``progress``: told the
    running point's attainment so far as its requests end (the live display)."""

    def __init__(self, store: StoreLike, backend: Backend, plan: Plan, spool_dir: Path,
                 generator_ceiling: float | None, max_shards: int = 1,
                 progress: ProgressSink | None = None) -> None:
        self.store = store
        self.backend = backend
        self.plan = plan
        self.spool_dir = spool_dir
        self.ceiling = generator_ceiling
        self.max_shards = max(1, max_shards)
        self.progress = progress
        # Prompt blocks this run's servers were sent (warm-up, earlier points): a data file's
        # shared parts stay in their caches from point to point, so its bound counts them.
        self.seen_blocks: set[int] = set()
        self.kind = load_kind(plan.workload)

    def for_plan(self, plan: Plan) -> PointRunner:
        """This runner measuring ``plan`` (a closed-loop sweep's plan at one users level), with
        what this run's servers were already sent."""
        other = copy.copy(self)
        other.plan = plan
        return other

    def warm_up(self, dep: Deployment, arm: str, block: int, attempt: int = 0, seconds: float | None = None,
                rate: float | None = None) -> None:
        """Cold servers (first requests, connection set-up, caches) must not leak into the first
        point: send the workload for a few seconds (at the lowest search rate, or a closed
        loop's own users), unrecorded. A lead-in's ``seconds`` and ``rate`` (its arm's last
        capacity) replace the plan's warm-up and the lowest rate."""
        plan = self.plan
        seconds = max(2.0, plan.search.warmup_s if seconds is None else seconds)
        seed = point_seed(plan.design.seed, block, -1.0, attempt=attempt)
        send = Send(dep.endpoint.send_url, dep.endpoint.model, plan.workload.api, None,
                    timeout_s=seconds + drain_seconds(plan), deadline_s=seconds + drain_seconds(plan),
                    keep_records=False, headers=dep.endpoint.headers)
        sent = self.kind.warm_up(plan, dep.driver, send, seed, seconds, rate)
        if not sent:
            return
        self.kind.saw(sent, self.seen_blocks)
        settle(self.backend, dep, self.metrics(arm))

    def metrics(self, arm: str) -> EngineMetrics:
        """The Prometheus names of the arm's engine (vLLM's or SGLang's)."""
        return engine_for(self.plan.arm(arm)).metrics

    def workers(self, arm: str) -> int:
        pools = self.plan.arm(arm).pools()
        return sum(p.replicas for role, p in pools.items() if role != "decode")

    def measure(
        self, dep: Deployment, run_id: int, arm: str, block: int, seq: int, rate: float | None,
        search_class: str | None, repeat: int = 0, attempt: int = 0,
    ) -> PointOutcome:
        """One point of the plan's workload kind at ``rate`` (in its unit; ``None``: a closed
        loop at its users), stored with its records, metrics and guards as it goes."""
        plan, s, kind = self.plan, self.plan.search, self.kind
        pt = kind.point(plan, block, rate, repeat, attempt)
        if pt.offsets is not None:  # exact lengths when the plan names a tokenizer
            pt.requests = fit_point_prompts(plan.workload, pt.requests, dep.endpoint.url,
                                            dep.endpoint.model, dep.endpoint.headers)
        started = time.time()
        point_id = self.store.record_point(
            run_id, seq=seq, window_start_s=s.warmup_s, window_end_s=s.warmup_s + s.point_s,
            offered_rate=rate, users=pt.users, n_scheduled=pt.n_scheduled, valid=False,
            search_class=search_class,
        )
        sink = SpoolingSink(self.store, point_id, self.spool_dir)
        settle(self.backend, dep, self.metrics(arm))
        before_t, before = time.time(), scrape_samples(self.backend, dep)
        # Ray shards are processes of this controller: not for a point sent from the cluster.
        shards = self.shards_for(rate) if rate is not None and not dep.driver.remote else 1
        send = Send(dep.endpoint.send_url, dep.endpoint.model, plan.workload.api,
                    watched(sink, self.progress, AttainmentTally(plan.classes, pt.n_window)),
                    timeout_s=pt.duration_s + drain_seconds(plan), deadline_s=pt.duration_s + drain_seconds(plan),
                    keep_records=True, headers=dep.endpoint.headers)
        stops: list[EarlyStop] = []
        stop_when = None
        if (s.early_stop and kind.stoppable and search_class is not None and shards == 1 and not dep.driver.remote
                and pt.offsets is not None and pt.phases is not None and len(pt.offsets)):
            # Search points only (a bar's fixed-rate point is measured whole), one process only.
            # In-flight requests end as they would at the point's end (the guards judge their
            # streams: cancelling them hid a stalling server); only the unsent rest is saved.
            stop_when = self._stop_check(pt.offsets, pt.phases, stops)
        with DuringScraper(self.backend, dep, every_s=max(1.0, pt.duration_s / 8)) as during:
            summary = kind.run(plan, dep.driver, pt, send, shards=shards, sharded=run_sharded,
                               stop_when=stop_when, stop_drain_s=drain_seconds(plan))
        early = stops[0] if stops and "stopped_at" in summary.extra else None
        return self._conclude(dep, run_id, arm, point_id, pt, search_class, summary, sink, before,
                              before_t, during, started, shards=shards, early=early)

    def _stop_check(self, offsets: np.ndarray, phases: Sequence[str],
                    stops: list[EarlyStop]) -> Callable[[Sequence[RequestRecord], float], bool]:
        """The open-loop point's early-stop question (analysis/saturation.py): certain to fail
        every class? The first answer is kept in ``stops``."""
        plan, s = self.plan, self.plan.search
        n_window = sum(1 for p in phases if p == "measure")
        first = float(offsets[0])
        watch: list[SaturationWatch] = []  # made at the first question: the window's start is known then

        def check(records: Sequence[RequestRecord], now: float) -> bool:
            if not watch:
                window_start = records[0].scheduled_s - first + s.warmup_s
                watch.append(SaturationWatch(plan.classes, s.attainment, window_start, s.point_s, n_window))
            stop = watch[0](records, now)
            if stop is not None:
                stops.append(stop)
            return stop is not None

        return check

    def shards_for(self, rate: float) -> int:
        """Load-generator processes a point at ``rate`` needs: one while one process holds the
        rate (its calibrated ceiling), else enough Ray shards to hold it, up to ``max_shards``."""
        if self.ceiling is None or self.max_shards <= 1 or not self.kind.shardable:
            return 1
        return shards_needed(rate, self.ceiling, self.max_shards)

    def _conclude(self, dep: Deployment, run_id: int, arm: str, point_id: int, pt: LoadPoint,
                  search_class: str | None, summary: PointSummary, sink: SpoolingSink,
                  before: list[Sample], before_t: float, during: DuringScraper, started: float,
                  shards: int = 1, early: EarlyStop | None = None) -> PointOutcome:
        """Metrics, guards and storage of a point that has run (of any kind)."""
        plan, s = self.plan, self.plan.search
        requests, seed = pt.requests, pt.seed
        # A schedule's rate is offered whatever the server does; sessions and users are paced by it.
        offered_rate = pt.rate if pt.offsets is not None else None
        loop = self.kind.loop_doc(pt, shards, self.ceiling)
        after_t, after = time.time(), scrape_samples(self.backend, dep)
        records = summary.records or []
        window_s = s.point_s
        judged = records
        if early is not None:
            # Stopped early (certain to fail every class): judged over what was scheduled before
            # the stop (in-flight requests, cancelled, are misses), so its attainment is below the
            # bar too; the requests never sent are stored, not judged.
            stopped_at = float(summary.extra["stopped_at"])
            judged = [r for r in records if not (r.sent_s is None and r.error == STOPPED_EARLY)]
            window_s = max(1e-6, min(s.point_s, stopped_at - (summary.started_at + s.warmup_s)))
        # Every request scheduled in the window (open loop: by the schedule; closed loop: by
        # when its user was ready) is judged, finished or not.
        n_measured = sum(1 for r in judged if r.phase == "measure")
        metrics = point_metrics(judged, plan.classes, window_s=window_s, n_scheduled=n_measured)
        hit = server_prefix_hit_rate(before, after, self.metrics(arm))
        judged_class = plan.service_class(search_class) if search_class else plan.classes[0]
        context = PointContext(
            n_scheduled=n_measured, window_s=window_s,
            expected_prefix_hit_rate=self.kind.ideal_hit_rate(requests, self.seen_blocks),
            server_prefix_hit_rate=hit,
            # N shards each hold the one-process ceiling; the guard judges the merged schedule.
            generator_ceiling_rate=None if self.ceiling is None else self.ceiling * shards,
            offered_rate=offered_rate,
            shared_prefix_tokens=requests[0].shared_prefix_tokens if requests else 0,
            service_class=judged_class, attainment_threshold=s.attainment,
            sim_lateness_p99_s=sim_lateness_p99(before, after),
            access_path_p99_s=access_path_p99(dep),
        )
        guards = [*run_guards(judged, plan.guards, context), prompt_length(
            judged, plan.guards, not_asked="a prompts file's own text asks for no length"
            if plan.workload.kind == "dataset" else None)]
        flushed = _flush_within(sink, float(getattr(self.store, "retry_budget_s", 0.0)))
        sink.raise_if_held()  # records in memory only: said loudly, never dropped silently
        doc: dict[str, Any] = metrics.to_dict()  # per_class: class -> figures (a JSON mapping)
        context_doc: dict[str, Any] = {
            "server_prefix_hit_rate": hit, "ideal_prefix_hit_rate": context.expected_prefix_hit_rate,
            "expected_prefix_hit_rate": expected_prefix_hit_rate(
                requests, self.workers(arm), plan.router_for(arm).policy),
            "send_lag_p99_s": summary.send_lag_p99_s, "started_at": started,
            "records_spooled": not flushed, "seed": seed,
            "sim_lateness_p99_s": context.sim_lateness_p99_s,
            "access_path_p99_s": context.access_path_p99_s,
        }
        if loop is not None:  # no fixed schedule: the count judged is what became due in the window
            context_doc["loop"] = {**loop, "n_in_window": n_measured}
        if early is not None:
            context_doc["early_stop"] = {**early.to_dict(), "n_judged": n_measured,
                                         "n_unsent": len(records) - len(judged)}
        self.store.finish_point(
            point_id, achieved_rate=metrics.achieved_rate, throughput_tok_s=metrics.throughput_tok_s,
            per_class=doc["per_class"],
            percentiles={k: doc[k] for k in ("ttft_s", "tpot_s", "max_gap_s", "e2e_s")},
            context=context_doc, valid=all(g.passed for g in guards),
        )
        self.store.record_guards(run_id, point_id, guards)
        snapshots = [(before_t, before), *during.snapshots, (after_t, after)]
        samples = [(t, x.name, x.labels, x.value) for t, snap in snapshots for x in snap
                   if x.name.startswith(self.metrics(arm).prefix)]
        self.store.record_metric_samples(run_id, point_id, samples)
        return PointOutcome(point_id, pt.rate or 0.0, metrics, guards, hit, records, sink.stored, not flushed, early)
