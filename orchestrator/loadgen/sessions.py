"""Live multi-turn sessions: sessions start on the open-loop clock; within a session each next
turn is sent only after the previous reply has arrived, plus a think time, and carries the text
the server returned in its history (so prefix caching and KV growth behave as in production).

A later turn's ``scheduled_s`` is when it became due (reply arrived + think time): TTFT counts
from then, so a generator that sends it late still shows the lateness (DESIGN 7). Every turn
that became due is recorded: a turn after a failed one is recorded ``unsent`` (a miss), due
when the failure was seen plus its think time. No turn becomes due after ``duration_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

import numpy as np

from orchestrator.loadgen.client import Api, ClientKind, Clock, make_client, new_record
from orchestrator.loadgen.runner import (
    DEFAULT_CLIENT,
    PointSummary,
    Sink,
    _Batcher,
    _Point,
    _sleep_until,
    summarize,
)
from orchestrator.loadgen.schedules import phase_at
from orchestrator.loadgen.session_scripts import point_sessions
from orchestrator.loadgen.workloads import RequestSpec
from orchestrator.plan.workload import Workload
from orchestrator.records import RequestRecord


async def run_sessions(
    endpoint_url: str,
    model: str,
    workload: Workload,
    starts: Sequence[float] | np.ndarray,
    *,
    seed: int,
    duration_s: float,
    warmup_s: float = 0.0,
    measure_s: float | None = None,
    api: Api = "completions",
    sink: Sink | None = None,
    request_timeout_s: float = 60.0,
    deadline_s: float | None = None,
    client: ClientKind = DEFAULT_CLIENT,
    max_connections: int = 0,
    spin_s: float = 0.002,
    keep_records: bool = False,
    headers: Mapping[str, str] | None = None,
    sent: list[RequestSpec] | None = None,
) -> PointSummary:
    """Start session ``i`` at ``start + starts[i]`` and play its turns live (the workload's
    sessions: ``session_scripts.point_sessions``). ``deadline_s`` (default ``duration_s + request_timeout_s``): what is still in flight is
    cancelled (recorded). ``sent``, when given, collects every request spec as it is sent."""
    if workload.sessions is None:
        raise ValueError("the workload has no `sessions`")
    offs = np.asarray(starts, dtype=np.float64)
    if len(offs) and np.any(np.diff(offs) < 0):
        raise ValueError("session starts must be sorted")
    book = point_sessions(workload, seed)
    stride = book.stride
    measure = measure_s if measure_s is not None else max(duration_s - warmup_s, 1e-9)
    clock = Clock()
    transport = make_client(client, endpoint_url, model, api, clock, max_connections, headers)
    batcher = _Batcher(sink, 500, 1.0)
    point = _Point(transport, batcher, request_timeout_s)
    batcher.start()
    tasks: set[asyncio.Task[None]] = set()
    try:
        await transport.warm(min(32, max(1, len(offs))))
        t0_wall = clock.now() + 0.05
        t0 = clock.perf_at(t0_wall)
        deadline = t0 + (deadline_s if deadline_s is not None else duration_s + request_timeout_s)

        def record(spec: RequestSpec, due_perf: float) -> RequestRecord:
            return new_record(spec, phase_at(due_perf - t0, warmup_s, measure), t0_wall + (due_perf - t0))

        def unsent(spec: RequestSpec, due_perf: float, why: str) -> None:
            rec = record(spec, due_perf)
            rec.error = why
            batcher.add(rec)

        async def session(i: int, due: float) -> None:
            live = book.open(i)
            spec, reply = live.first(i * stride), ""
            for k in range(live.turns):
                if k:
                    due = live.due_s(k, due, time.perf_counter())
                    if due - t0 >= duration_s:
                        return  # due after the point: outside it, not scheduled
                    await _sleep_until(due, spin_s)
                    spec = live.after_reply(reply, i * stride + k)
                rec = record(spec, due)
                if sent is not None:
                    sent.append(spec)
                text: list[str] = []
                await point.execute(spec, rec, text)
                if rec.status != "ok":
                    # The session cannot go on without its reply: its next turn, due as if the
                    # failure were the reply, is a miss (never dropped).
                    if k + 1 < live.turns:
                        nxt = live.due_s(k + 1, due, time.perf_counter())
                        if nxt - t0 < duration_s:
                            follow = live.after_reply("", i * stride + k + 1)
                            unsent(follow, nxt, f"session ended: turn {k} {rec.status}")
                    return
                reply = "".join(text)

        for i, off in enumerate(offs):
            target = t0 + float(off)
            if target >= deadline:
                for j in range(i, len(offs)):  # never started before the deadline: recorded
                    first = book.open(j).first(j * stride)
                    unsent(first, t0 + float(offs[j]), "not sent before the end of the point")
                break
            await _sleep_until(target, spin_s)
            task = asyncio.get_running_loop().create_task(session(i, target))
            tasks.add(task)
        while tasks and (left := deadline - time.perf_counter()) > 0:
            _, pending = await asyncio.wait(tasks, timeout=left)
            tasks = set(pending)
    finally:
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await batcher.close()
        await transport.close()
    summary = summarize(batcher.all, t0_wall, client)
    if keep_records:
        summary.records = sorted(batcher.all, key=lambda r: r.request_id)
    return summary
