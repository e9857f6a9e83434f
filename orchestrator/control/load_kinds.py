"""Workload kinds (issue 28): one implementation per kind of load, the only code that knows
how a point of that kind is made and sent.

A kind builds a point's load for a seed (``point``), sends it through a deployment's driver
(``run``: real HTTP on the wall clock, or the virtual-time driver), plays it on the simulated
engine for the dry run (``simulate``), warms servers up with it, and says its rate unit, its
ideal prefix-hit bound and whether a point may be sharded or stopped early. The point runner,
the executor and the dry run ask :func:`load_kind`; none branches on the workload's fields.
Adding a kind: a ``WorkloadKind`` value (plan/workload.py) and one class here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np

from orchestrator.control.design import point_seed
from orchestrator.errors import PermanentError, TransientError, stop_on_signals
from orchestrator.loadgen.client import Api
from orchestrator.loadgen.datasets import content_prefix_hit_rate, point_load, requests_iter
from orchestrator.loadgen.driver import LoadDriver
from orchestrator.loadgen.runner import PointSummary, Sink, StopCheck
from orchestrator.loadgen.schedules import point_phases
from orchestrator.loadgen.session_scripts import SessionScript, point_sessions
from orchestrator.loadgen.workloads import (
    RequestSpec,
    ideal_prefix_hit_rate,
    session_prefix_hit_rate,
)
from orchestrator.plan import Plan, Workload, WorkloadKind
from orchestrator.plan.sources import DataFileError
from orchestrator.records import RequestRecord
from orchestrator.sim.engine import ClusterSpec, Windows, simulate_open_loop, simulate_sessions

T = TypeVar("T")


def data(build: Callable[..., T], *args: Any) -> T:
    """A point's requests; a data file that is gone or changed since registration stops the
    experiment with its remedy (no retry can fix it)."""
    try:
        return build(*args)
    except DataFileError as e:
        raise PermanentError(f"workload.source: {e}") from e


def _taking(specs: Iterator[RequestSpec], taken: list[RequestSpec]) -> Iterator[RequestSpec]:
    """``specs`` as they are taken, each kept in ``taken`` (a closed loop's count is unknown)."""
    for spec in specs:
        taken.append(spec)
        yield spec


@dataclass(frozen=True)
class Send:
    """Where and how a point's requests go (the same for every kind)."""

    url: str
    model: str
    api: Api
    sink: Sink | None
    timeout_s: float
    deadline_s: float | None
    keep_records: bool
    headers: Mapping[str, str] | Sequence[tuple[str, str]]

    def kwargs(self) -> dict[str, Any]:
        return dict(api=self.api, sink=self.sink, request_timeout_s=self.timeout_s,
                    deadline_s=self.deadline_s, keep_records=self.keep_records, headers=dict(self.headers))


@dataclass
class LoadPoint:
    """One point's load, built for its seed before anything is sent. ``requests`` holds the
    requests known in advance (a schedule's), or, after ``run``, those the users or sessions
    actually sent; ``offsets``/``phases``: the schedule (None where replies pace the sends)."""

    seed: int
    rate: float | None  # in the kind's unit (None: a closed loop's users set the pace)
    duration_s: float
    warmup_s: float
    measure_s: float
    requests: list[RequestSpec] = field(default_factory=list)
    offsets: np.ndarray | None = None
    phases: list[str] | None = None
    users: int | None = None
    starts: np.ndarray | None = None  # live sessions: when each session's first turn is due

    @property
    def n_scheduled(self) -> int | None:
        """Requests scheduled in all (None where the count is known only as they are sent)."""
        return len(self.requests) if self.offsets is not None else None

    @property
    def n_window(self) -> int | None:
        return None if self.phases is None else sum(1 for p in self.phases if p == "measure")


ShardedRun = Callable[[str, str, Sequence[RequestSpec], np.ndarray, Sequence[str], int, dict[str, Any]], PointSummary]


class LoadKind:
    """What every kind answers (the open loop's answers unless a kind says otherwise)."""

    name: ClassVar[WorkloadKind]
    searchable: ClassVar[bool] = True  # capacity comes from a search over its rate (open loop only)
    shardable: ClassVar[bool] = True  # a point may be split over load-generator processes
    stoppable: ClassVar[bool] = True  # a search point may stop once certain to fail every class

    def point(self, plan: Plan, block: int, rate: float | None, repeat: int, attempt: int) -> LoadPoint:
        """The point's schedule and requests (a point at ``rate``; ``None`` for a closed loop)."""
        assert rate is not None
        s = plan.search
        seed = point_seed(plan.design.seed, block, rate, repeat, attempt)
        duration = s.warmup_s + s.point_s + s.cooldown_s
        offsets, requests = data(point_load, plan.workload, rate, duration, seed)
        return LoadPoint(seed, rate, duration, s.warmup_s, s.point_s, list(requests), offsets,
                         point_phases(offsets, s.warmup_s, s.point_s))

    def run(self, plan: Plan, driver: LoadDriver, pt: LoadPoint, send: Send, *, shards: int = 1,
            sharded: ShardedRun | None = None, stop_when: StopCheck | None = None,
            stop_drain_s: float = 0.0) -> PointSummary:
        """Send the point (``shards`` > 1: through ``sharded``, the Ray shards)."""
        assert pt.offsets is not None and pt.phases is not None
        kw = send.kwargs()
        if stop_when is not None:
            kw.update(stop_when=stop_when, stop_drain_s=stop_drain_s)
        if shards > 1 and sharded is not None:
            return sharded(send.url, send.model, pt.requests, pt.offsets, pt.phases, shards, kw)
        return driver.open_loop(send.url, send.model, pt.requests, pt.offsets, pt.phases, **kw)

    def warm_up(self, plan: Plan, driver: LoadDriver, send: Send, seed: int, seconds: float,
                rate: float | None = None) -> list[RequestSpec]:
        """Send the workload for ``seconds`` at ``rate`` (the lowest search rate if None; a
        lead-in's: its arm's last capacity), unrecorded; the requests sent."""
        rate = max(plan.search.rate.min if rate is None else rate, 2.0 / seconds)
        offsets, requests = data(point_load, plan.workload, rate, seconds, seed)
        if len(offsets):
            driver.open_loop(send.url, send.model, requests, offsets, ["warmup"] * len(offsets), **send.kwargs())
        return list(requests)

    def ideal_hit_rate(self, requests: Sequence[RequestSpec], seen_blocks: set[int]) -> float:
        """The workload's upper bound on the server's prefix-cache hit rate (the repeat guard)."""
        return ideal_prefix_hit_rate(requests)

    def saw(self, requests: Sequence[RequestSpec], seen_blocks: set[int]) -> None:
        """Note what the run's servers were sent (a data file's bound counts earlier points)."""

    def loop_doc(self, pt: LoadPoint, shards: int, ceiling: float | None) -> dict[str, Any] | None:
        """How the point was driven, when not by one process's fixed schedule (stored with it)."""
        if shards > 1:
            return {"kind": "open", "shards": shards, "per_shard_ceiling_rps": ceiling}
        return None

    def requests_per_unit(self, workload: Workload) -> float:
        """Requests one unit of rate brings (a session brings its turns)."""
        return 1.0

    def label(self, plan: Plan, rate: float | None) -> str:
        """A point's load as the progress line names it."""
        return f"{rate:.3g} {plan.workload.rate_unit}"

    def simulate(self, plan: Plan, cluster: ClusterSpec, rate: float, windows: Windows,
                 drain_s: float, seed: int) -> tuple[list[RequestRecord], float, int, float]:
        """The point in virtual time: (records, end s, requests scheduled in the window, last send s)."""
        offsets, requests = point_load(plan.workload, rate, windows.total_s, seed)
        res = simulate_open_loop(cluster, requests, offsets, windows, drain_s=drain_s, seed=seed)
        n = int(np.count_nonzero((offsets >= windows.warmup_s) & (offsets < windows.warmup_s + windows.measure_s)))
        return list(res.records), res.end_s, n, float(offsets[-1]) if len(offsets) else 0.0


class OpenLoad(LoadKind):
    """Synthetic requests on an arrival clock (``workload.arrival``)."""

    name = "open"


class DatasetLoad(LoadKind):
    """A prompts file's prompts on the arrival clock: their content decides the sharing."""

    name: ClassVar[WorkloadKind] = "dataset"

    def ideal_hit_rate(self, requests: Sequence[RequestSpec], seen_blocks: set[int]) -> float:
        return content_prefix_hit_rate(requests, seen_blocks)

    def saw(self, requests: Sequence[RequestSpec], seen_blocks: set[int]) -> None:
        content_prefix_hit_rate(requests, seen_blocks)


class TraceLoad(DatasetLoad):
    """A trace's arrivals, lengths and shared blocks, replayed scaled to the point's rate."""

    name: ClassVar[WorkloadKind] = "trace"


class SessionsLoad(LoadKind):
    """Live sessions started on the arrival clock; each later turn follows its reply, so the
    requests are known only as they are sent, and a session stays in the process it began in."""

    name = "sessions"
    shardable = False
    stoppable = False

    def point(self, plan: Plan, block: int, rate: float | None, repeat: int, attempt: int) -> LoadPoint:
        assert rate is not None
        s = plan.search
        seed = point_seed(plan.design.seed, block, rate, repeat, attempt)
        duration = s.warmup_s + s.point_s + s.cooldown_s
        return LoadPoint(seed, rate, duration, s.warmup_s, s.point_s,
                         starts=data(_starts, plan.workload, seed, rate, duration))

    def run(self, plan: Plan, driver: LoadDriver, pt: LoadPoint, send: Send, *, shards: int = 1,
            sharded: ShardedRun | None = None, stop_when: StopCheck | None = None,
            stop_drain_s: float = 0.0) -> PointSummary:
        assert pt.starts is not None
        sent: list[RequestSpec] = []
        summary = driver.sessions(send.url, send.model, plan.workload, pt.starts,
                                  seed=pt.seed, duration_s=pt.duration_s, warmup_s=pt.warmup_s,
                                  measure_s=pt.measure_s, sent=sent, **send.kwargs())
        pt.requests = sorted(sent, key=lambda spec: spec.request_id)
        return summary

    def warm_up(self, plan: Plan, driver: LoadDriver, send: Send, seed: int, seconds: float,
                rate: float | None = None) -> list[RequestSpec]:
        if plan.workload.source is None:
            return super().warm_up(plan, driver, send, seed, seconds, rate)
        # A file's sessions warm up as sessions (a multi-turn trace's later turns are not
        # requests of their own), at the lowest search rate (or ``rate``), all of it warm-up.
        rate = max(plan.search.rate.min if rate is None else rate, 2.0 / seconds)
        sent: list[RequestSpec] = []
        driver.sessions(send.url, send.model, plan.workload, data(_starts, plan.workload, seed, rate, seconds),
                        seed=seed, duration_s=seconds, warmup_s=seconds, measure_s=None, sent=sent, **send.kwargs())
        return sent

    def ideal_hit_rate(self, requests: Sequence[RequestSpec], seen_blocks: set[int]) -> float:
        return session_prefix_hit_rate(requests)

    def loop_doc(self, pt: LoadPoint, shards: int, ceiling: float | None) -> dict[str, Any] | None:
        return {"kind": "sessions", "sessions_per_s": pt.rate}

    def requests_per_unit(self, workload: Workload) -> float:
        return float(workload.prompts.turns)

    def simulate(self, plan: Plan, cluster: ClusterSpec, rate: float, windows: Windows,
                 drain_s: float, seed: int) -> tuple[list[RequestRecord], float, int, float]:
        offsets = _starts(plan.workload, seed, rate, windows.total_s)
        res = simulate_sessions(cluster, offsets, SessionScript(plan.workload, seed), windows,
                                drain_s=drain_s, seed=seed)
        records = list(res.records)
        n = sum(1 for r in records if r.phase == "measure")
        return records, res.end_s, n, max((r.scheduled_s for r in records), default=0.0)


def _starts(workload: Workload, seed: int, rate: float, duration_s: float) -> np.ndarray:
    """When a point's sessions start: on the arrival clock, or a trace's (scaled) own times."""
    return point_sessions(workload, seed).starts(rate, duration_s)


class ClosedLoad(LoadKind):
    """N users, each waiting for its reply and a think time: the server's pace sets the rate,
    so a point is "at N users", never a capacity (DESIGN 7)."""

    name = "closed"
    searchable = False
    shardable = False
    stoppable = False

    def point(self, plan: Plan, block: int, rate: float | None, repeat: int, attempt: int) -> LoadPoint:
        closed = plan.workload.closed
        assert closed is not None
        s = plan.search
        seed = point_seed(plan.design.seed, block, -float(closed.level()), 0, attempt)
        return LoadPoint(seed, None, s.warmup_s + s.point_s + s.cooldown_s, s.warmup_s, s.point_s,
                         users=closed.level())

    def run(self, plan: Plan, driver: LoadDriver, pt: LoadPoint, send: Send, *, shards: int = 1,
            sharded: ShardedRun | None = None, stop_when: StopCheck | None = None,
            stop_drain_s: float = 0.0) -> PointSummary:
        closed = plan.workload.closed
        assert closed is not None
        taken: list[RequestSpec] = []  # the requests the users actually took, for the guards
        summary = driver.closed_loop(
            send.url, send.model, _taking(data(requests_iter, plan.workload, pt.seed), taken),
            users=closed.level(), think_s=closed.think_s, ramp_up_s=closed.ramp_up_s,
            duration_s=pt.duration_s, warmup_s=pt.warmup_s, measure_s=pt.measure_s, **send.kwargs())
        pt.requests = taken
        return summary

    def warm_up(self, plan: Plan, driver: LoadDriver, send: Send, seed: int, seconds: float,
                rate: float | None = None) -> list[RequestSpec]:
        # The plan's own users for a few seconds (``rate`` does not apply to a closed loop): the load a closed-loop point will bring (a
        # concurrency sweep's most: every level's point then follows a warm server).
        closed = plan.workload.closed
        assert closed is not None
        taken: list[RequestSpec] = []
        driver.closed_loop(send.url, send.model, _taking(data(requests_iter, plan.workload, seed), taken),
                           users=max(closed.levels), think_s=closed.think_s, ramp_up_s=min(closed.ramp_up_s, seconds),
                           duration_s=seconds, warmup_s=seconds, measure_s=None, **send.kwargs())
        return taken

    def loop_doc(self, pt: LoadPoint, shards: int, ceiling: float | None) -> dict[str, Any] | None:
        return {"kind": "closed", "users": pt.users}

    def label(self, plan: Plan, rate: float | None) -> str:
        assert plan.workload.closed is not None
        return f"{', '.join(map(str, plan.workload.closed.levels))} users (closed loop)"

    def simulate(self, plan: Plan, cluster: ClusterSpec, rate: float, windows: Windows,
                 drain_s: float, seed: int) -> tuple[list[RequestRecord], float, int, float]:
        raise ValueError("capacity comes from open-loop runs only; this workload is closed loop")


def level_plans(plan: Plan) -> list[Plan]:
    """A closed-loop plan at each of its users levels, in order (a concurrency sweep: one point
    per level in every run); any other plan alone."""
    closed = plan.workload.closed
    if closed is None or len(closed.levels) == 1:
        return [plan]
    return [plan.model_copy(update={"workload": plan.workload.model_copy(update={"closed": closed.at(n)})})
            for n in closed.levels]


LOAD_KINDS: dict[WorkloadKind, LoadKind] = {
    k.name: k for k in (OpenLoad(), DatasetLoad(), TraceLoad(), SessionsLoad(), ClosedLoad())
}


def load_kind(workload: Workload) -> LoadKind:
    """The implementation of a workload's kind."""
    return LOAD_KINDS[workload.kind]


def run_sharded(url: str, model: str, requests: Sequence[RequestSpec], offsets: np.ndarray,
                phases: Sequence[str], shards: int, kwargs: dict[str, Any]) -> PointSummary:
    """One point over ``shards`` Ray actors with one shared start time: on the cluster's Ray
    under `orch submit` (already connected), else a local Ray started here once."""
    import ray

    from orchestrator.loadgen.shards import run_point_sharded

    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, include_dashboard=False,
                 log_to_driver=False, ignore_reinit_error=True)
        stop_on_signals()  # ray.init installs a SIGTERM handler that exits at once
    # Each shard takes a CPU; shards that cannot all be placed would wait for ever (inside a
    # controller task on a small cluster, say): say so and let the run be retried later.
    deadline = time.monotonic() + 10.0  # the last point's shards give their CPUs back shortly
    while (free := ray.available_resources().get("CPU", 0.0)) < shards and time.monotonic() < deadline:
        time.sleep(0.2)
    if free < shards:
        raise TransientError(f"the point needs {shards} load-generator shards (one CPU each) but Ray has "
                             f"{free:g} CPU free: add Ray workers or lower ORCH_LOADGEN_MAX_SHARDS", delay=30.0)
    return run_point_sharded(url, model, requests, offsets, phases, shards, **kwargs)


__all__ = ["LOAD_KINDS", "LoadKind", "LoadPoint", "Send", "data", "level_plans", "load_kind", "run_sharded"]
