"""Ray shards: one point's schedule split over N actors (each its own process and event loop),
started against a common wall-clock time, records merged.

Shard k sends requests k, k+N, k+2N... (``split_shards``): each shard carries 1/N of the rate
and the merged records are the same set a single process would produce for the same seed (up
to timing). The driver drains each shard's finished records every ``flush_s`` and hands them to
the sink, so a crash loses at most one batch per shard. Ray must already be initialised by the
caller (the controller owns the cluster connection).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray

from orchestrator.errors import EnvironmentProblem
from orchestrator.loadgen.runner import DEFAULT_CLIENT, PointSummary, Sink, run_point, summarize
from orchestrator.loadgen.schedules import split_shards
from orchestrator.loadgen.workloads import RequestSpec
from orchestrator.records import RequestRecord


@ray.remote(num_cpus=1)
class LoadShard:
    """One shard: runs its part of a point and buffers finished records for the driver."""

    def __init__(self) -> None:
        self.buffer: list[RequestRecord] = []

    def ping(self) -> float:
        return time.time()

    async def run(self, endpoint_url: str, model: str, requests: list[RequestSpec],
                  offsets: list[float], phases: list[str], kwargs: dict[str, Any]) -> dict:
        async def sink(batch: list[RequestRecord]) -> None:
            self.buffer.extend(batch)

        summary = await run_point(endpoint_url, model, requests, offsets, phases, sink=sink, **kwargs)
        return summary.to_dict()

    async def drain(self) -> list[RequestRecord]:
        out, self.buffer = self.buffer, []
        return out


def run_point_sharded(
    endpoint_url: str,
    model: str,
    requests: Sequence[RequestSpec],
    offsets: Sequence[float] | np.ndarray,
    phases: Sequence[str],
    shards: int,
    *,
    sink: Sink | None = None,
    start_delay_s: float = 2.0,
    flush_s: float = 1.0,
    keep_records: bool = False,
    **kwargs: Any,
) -> PointSummary:
    """``run_point`` over ``shards`` Ray actors against one start time; blocking (call it from a
    thread if the caller is async). ``kwargs`` go to each shard's ``run_point`` (api, client,
    request_timeout_s, deadline_s...). Sync sinks only here (the driver has no event loop)."""
    if not ray.is_initialized():
        raise EnvironmentProblem("Ray is not initialised: call ray.init() (or set RAY_ADDRESS) first")
    if sink is not None and asyncio.iscoroutinefunction(sink):
        raise ValueError("run_point_sharded needs a synchronous sink")
    offs = np.asarray(offsets, dtype=np.float64)
    parts = split_shards(len(requests), shards)
    actors = [LoadShard.remote() for _ in range(shards)]  # type: ignore[attr-defined]  # ray.remote turns the class into an ActorClass at runtime; mypy ignores class decorators
    ray.get([a.ping.remote() for a in actors])  # all up before the clock is set
    start_at = time.time() + start_delay_s
    kw = {**kwargs, "start_at": start_at, "flush_s": flush_s}
    runs = [
        a.run.remote(endpoint_url, model, [requests[i] for i in idx], offs[idx].tolist(),
                     [phases[i] for i in idx], kw)
        for a, idx in zip(actors, parts, strict=True)
    ]
    merged: list[RequestRecord] = []

    def drain_all() -> None:
        for batch in ray.get([a.drain.remote() for a in actors]):
            if batch:
                merged.extend(batch)
                if sink is not None:
                    sink(batch)

    try:
        pending = list(runs)
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=flush_s)
            drain_all()
        ray.get(runs)  # re-raise a shard's failure
        drain_all()
    finally:
        for a in actors:
            ray.kill(a)
    merged.sort(key=lambda r: r.request_id)
    summary = summarize(merged, start_at, kwargs.get("client", DEFAULT_CLIENT), shards)
    if keep_records:
        summary.records = merged
    return summary
