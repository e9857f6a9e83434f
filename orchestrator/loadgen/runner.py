"""Run one load point: open loop (send on the clock) or closed loop (users), every scheduled
request yielding exactly one record, records streamed to a sink in batches.

Open loop: a dispatcher sleeps *to* each scheduled time (coarse ``asyncio.sleep`` to within
``spin_s`` of it, then yields with ``sleep(0)`` until the time: the selector's millisecond
rounding alone would add up to 1 ms of lag) and starts the request as its own task. At the
deadline, requests still in flight are cancelled and recorded ``cancelled``; requests never
sent are recorded ``unsent``. A request past its own timeout is ``timeout``.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from orchestrator.loadgen.client import (
    Api,
    ClientKind,
    Clock,
    StreamingClient,
    check_lengths,
    make_client,
    new_record,
)
from orchestrator.loadgen.schedules import phase_at
from orchestrator.loadgen.workloads import RequestSpec
from orchestrator.records import STATUSES, RequestRecord

Sink = Callable[[list[RequestRecord]], None] | Callable[[list[RequestRecord]], Awaitable[None]]

# Measured by benchmarks/loadgen_bench.py on the build machine: aiohttp sustains a higher
# open-loop rate than httpx at p99 send lag < 1 ms (figures in the module's closing note).
DEFAULT_CLIENT: ClientKind = "aiohttp"


@dataclass
class PointSummary:
    """What one point's generator did (from its records)."""

    scheduled: int
    sent: int
    by_status: dict[str, int]
    offered_rate: float  # requests/s the schedule asked for
    achieved_rate: float  # requests/s actually sent, over the span of sends
    send_lag_p50_s: float
    send_lag_p99_s: float
    send_lag_max_s: float
    chunks: int
    chunks_per_s: float
    duration_s: float  # first send to last record
    started_at: float  # wall clock (epoch) of offset 0
    client: str = ""
    shards: int = 1
    extra: dict[str, float] = field(default_factory=dict)
    records: list[RequestRecord] | None = field(default=None, repr=False)  # with keep_records

    @property
    def achieved_ratio(self) -> float:
        return self.achieved_rate / self.offered_rate if self.offered_rate > 0 else math.nan

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "records"}
        d["by_status"], d["extra"] = dict(self.by_status), dict(self.extra)
        d["achieved_ratio"] = self.achieved_ratio
        return d


def _rate(times: Sequence[float]) -> float:
    if len(times) < 2:
        return math.nan
    span = max(times) - min(times)
    return (len(times) - 1) / span if span > 0 else math.inf


def summarize(records: Sequence[RequestRecord], started_at: float, client: str = "", shards: int = 1) -> PointSummary:
    """Counts by status, offered vs achieved rate, send-lag percentiles, chunk throughput."""
    by_status = dict.fromkeys(STATUSES, 0)
    for r in records:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    sent = [r for r in records if r.sent_s is not None]
    sent_at = [r.sent_s for r in records if r.sent_s is not None]
    lags = (np.array([t - r.scheduled_s for r, t in zip(sent, sent_at, strict=True)]) if sent
            else np.array([math.nan]))
    chunks = sum(r.chunks for r in records)
    ends = [r.last_token_s for r in records if r.last_token_s is not None]
    first_send = min(sent_at, default=started_at)
    end = max([*ends, *sent_at], default=first_send)
    duration = max(0.0, end - first_send)
    return PointSummary(
        scheduled=len(records),
        sent=len(sent),
        by_status=by_status,
        offered_rate=_rate([r.scheduled_s for r in records]),
        achieved_rate=_rate(sent_at),
        send_lag_p50_s=float(np.percentile(lags, 50)),
        send_lag_p99_s=float(np.percentile(lags, 99)),
        send_lag_max_s=float(np.max(lags)),
        chunks=chunks,
        chunks_per_s=chunks / duration if duration > 0 else math.nan,
        duration_s=duration,
        started_at=started_at,
        client=client,
        shards=shards,
    )


class _Batcher:
    """Hands records to the sink in batches (``batch_size`` or every ``flush_s``); a sync sink
    runs in a thread so a slow store never stalls the send loop. One batch in flight at most,
    so a crash loses at most the batch being written plus the one being filled."""

    def __init__(self, sink: Sink | None, batch_size: int, flush_s: float):
        self.sink, self.batch_size, self.flush_s = sink, batch_size, flush_s
        self.buf: list[RequestRecord] = []
        self.all: list[RequestRecord] = []
        self.queue: asyncio.Queue[list[RequestRecord] | None] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    def add(self, rec: RequestRecord) -> None:
        self.all.append(rec)
        if self.sink is None:
            return
        self.buf.append(rec)
        if len(self.buf) >= self.batch_size:
            self._cut()

    def _cut(self) -> None:
        if self.buf:
            self.queue.put_nowait(self.buf)
            self.buf = []

    async def _deliver(self, batch: list[RequestRecord]) -> None:
        sink = self.sink
        assert sink is not None  # add() queues batches only when there is a sink
        if inspect.iscoroutinefunction(sink):
            await sink(batch)
        else:
            await asyncio.to_thread(sink, batch)

    async def _run(self) -> None:
        while True:
            try:
                batch = await asyncio.wait_for(self.queue.get(), self.flush_s)
            except TimeoutError:
                self._cut()
                continue
            if batch is None:
                return
            await self._deliver(batch)

    async def close(self) -> None:
        self._cut()
        self.queue.put_nowait(None)
        if self.task is not None:
            await self.task


class _Point:
    """Shared machinery of open- and closed-loop points."""

    def __init__(self, client: StreamingClient, batcher: _Batcher, request_timeout_s: float):
        self.client, self.batcher, self.timeout = client, batcher, request_timeout_s
        self.inflight: set[asyncio.Task[None]] = set()

    async def execute(self, spec: RequestSpec, rec: RequestRecord, text: list[str] | None = None) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                await self.client.stream(spec, rec, text) if text is not None else await self.client.stream(spec, rec)
        except TimeoutError:
            rec.status, rec.error = "timeout", f"no complete reply within {self.timeout:g} s"
        except asyncio.CancelledError:
            rec.status, rec.error = "cancelled", "unfinished at the end of the point"
            raise
        except Exception as e:  # a bug or an odd reply must cost one record, not the point
            rec.status, rec.error = "disconnect", f"{type(e).__name__}: {e}"[:300]
        finally:
            if rec.status == "unsent" and rec.sent_s is not None:
                rec.status = "cancelled"
            self.batcher.add(rec)

    def spawn(self, spec: RequestSpec, rec: RequestRecord) -> None:
        task = asyncio.get_running_loop().create_task(self.execute(spec, rec))
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)

    async def drain(self, until_perf: float) -> None:
        """Wait for in-flight requests until ``until_perf``; cancel (and record) the rest."""
        while self.inflight:
            left = until_perf - time.perf_counter()
            if left <= 0:
                break
            await asyncio.wait(set(self.inflight), timeout=left)
        pending = set(self.inflight)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


async def _sleep_until(perf_target: float, spin_s: float) -> None:
    delay = perf_target - time.perf_counter()
    if delay > spin_s:
        await asyncio.sleep(delay - spin_s)
    while time.perf_counter() < perf_target:
        await asyncio.sleep(0)


StopCheck = Callable[[Sequence[RequestRecord], float], bool]
STOPPED_EARLY = "not sent: the point stopped early (past capacity)"  # an unsent record's error


async def _watch(stop_when: StopCheck, records: Sequence[RequestRecord], clock: Clock, every_s: float,
                 stopped: asyncio.Event, stopped_at: list[float]) -> None:
    """Ask ``stop_when`` every ``every_s`` (records as they stand, wall-clock now); set
    ``stopped`` on the first yes."""
    while True:
        await asyncio.sleep(every_s)
        now = clock.now()
        if stop_when(records, now):
            stopped_at.append(now)
            stopped.set()
            return


async def _sleep_unless(perf_target: float, spin_s: float, stopped: asyncio.Event) -> bool:
    """:func:`_sleep_until`, cut short by ``stopped``; False when stopped."""
    delay = perf_target - time.perf_counter() - spin_s
    if delay > 0:
        try:
            await asyncio.wait_for(stopped.wait(), delay)
            return False
        except TimeoutError:
            pass
    while time.perf_counter() < perf_target:
        if stopped.is_set():
            return False
        await asyncio.sleep(0)
    return not stopped.is_set()


async def run_point(
    endpoint_url: str,
    model: str,
    requests: Sequence[RequestSpec],
    offsets: Sequence[float] | np.ndarray,
    phases: Sequence[str],
    *,
    api: Api = "completions",
    sink: Sink | None = None,
    request_timeout_s: float = 60.0,
    deadline_s: float | None = None,
    start_at: float | None = None,
    client: ClientKind = DEFAULT_CLIENT,
    max_connections: int = 0,
    warm_connections: int = 32,
    batch_size: int = 500,
    flush_s: float = 1.0,
    spin_s: float = 0.002,
    keep_records: bool = False,
    headers: Mapping[str, str] | None = None,
    stop_when: StopCheck | None = None,
    check_every_s: float = 0.25,
    stop_drain_s: float = 0.0,
) -> PointSummary:
    """Send ``requests[i]`` at ``start + offsets[i]`` (open loop) and record each one.

    ``deadline_s``: seconds after the start when whatever is still in flight is cancelled
    (default: last offset + ``request_timeout_s``). ``start_at``: wall-clock epoch of offset 0
    (shards share one); default: just after the connection pool is warmed. With
    ``keep_records`` the records are also returned on ``summary.records``.

    ``stop_when(records, now)`` (wall clock), asked every ``check_every_s`` while requests are
    still to be sent: when it says True the point stops early: nothing more is sent (the rest
    recorded ``unsent``), requests in flight get ``stop_drain_s`` more to end (within the
    point's deadline) and are then cancelled (recorded ``cancelled``), and
    ``summary.extra["stopped_at"]`` holds the wall-clock time of the stop. Letting them end is
    what keeps a stop honest: a stalling server's gaps show only in streams that run on.
    """
    check_lengths(requests, offsets, phases)
    offs = np.asarray(offsets, dtype=np.float64)
    if len(offs) and np.any(np.diff(offs) < 0):
        raise ValueError("offsets must be sorted")
    clock = Clock()
    transport = make_client(client, endpoint_url, model, api, clock, max_connections, headers)
    batcher = _Batcher(sink, batch_size, flush_s)
    point = _Point(transport, batcher, request_timeout_s)
    batcher.start()
    try:
        if warm_connections:
            await transport.warm(min(warm_connections, max(1, len(requests))))
        t0_wall = start_at if start_at is not None else clock.now() + 0.05
        t0 = clock.perf_at(t0_wall)
        last = float(offs[-1]) if len(offs) else 0.0
        deadline = t0 + (deadline_s if deadline_s is not None else last + request_timeout_s)
        records = [new_record(s, p, t0_wall + float(o)) for s, p, o in zip(requests, phases, offs, strict=True)]
        stopped = asyncio.Event()
        stopped_at: list[float] = []
        watcher = (asyncio.get_running_loop().create_task(_watch(stop_when, records, clock, check_every_s, stopped,
                                                                 stopped_at))
                   if stop_when is not None else None)
        i = 0
        try:
            for i, (spec, rec, off) in enumerate(zip(requests, records, offs, strict=True)):  # noqa: B007
                target = t0 + float(off)
                if target >= deadline or stopped.is_set():
                    break
                if watcher is None:
                    await _sleep_until(target, spin_s)
                elif not await _sleep_unless(target, spin_s, stopped):
                    break
                point.spawn(spec, rec)
            else:
                i = len(records)
        finally:
            if watcher is not None:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
        why = STOPPED_EARLY if stopped.is_set() else "not sent before the end of the point"
        for rec in records[i:]:  # never sent before the deadline (or the stop): recorded, not dropped
            rec.error = why
            batcher.add(rec)
        await point.drain(min(deadline, time.perf_counter() + stop_drain_s) if stopped.is_set() else deadline)
    finally:
        await batcher.close()
        await transport.close()
    summary = summarize(batcher.all, t0_wall, client)
    if stopped_at:
        summary.extra["stopped_at"] = stopped_at[0]
    if keep_records:
        summary.records = batcher.all
    return summary


async def run_closed_loop(
    endpoint_url: str,
    model: str,
    requests: Iterable[RequestSpec],
    *,
    users: int,
    think_s: float = 0.0,
    ramp_up_s: float = 0.0,
    duration_s: float,
    warmup_s: float = 0.0,
    measure_s: float | None = None,
    api: Api = "completions",
    sink: Sink | None = None,
    request_timeout_s: float = 60.0,
    deadline_s: float | None = None,
    client: ClientKind = DEFAULT_CLIENT,
    batch_size: int = 500,
    flush_s: float = 1.0,
    keep_records: bool = False,
    headers: Mapping[str, str] | None = None,
) -> PointSummary:
    """N users, each sending its next request (the list's next one) when its reply is done and
    its think time has passed; no new request after ``duration_s``; in-flight requests are
    cancelled (and recorded ``cancelled``) at ``deadline_s`` (default ``duration_s +
    request_timeout_s``). A request's scheduled time is when its user was ready to send, so a
    slow generator still shows as lag. ``requests`` may be an endless iterator."""
    if users < 1:
        raise ValueError("users must be >= 1")
    measure = measure_s if measure_s is not None else max(duration_s - warmup_s, 1e-9)
    clock = Clock()
    transport = make_client(client, endpoint_url, model, api, clock, users, headers)
    batcher = _Batcher(sink, batch_size, flush_s)
    point = _Point(transport, batcher, request_timeout_s)
    batcher.start()
    it = iter(requests)
    try:
        await transport.warm(users)
        t0_wall = clock.now() + 0.05
        t0 = clock.perf_at(t0_wall)

        async def user(k: int) -> None:
            ready = t0 + (ramp_up_s * k / users)
            while ready - t0 < duration_s:
                spec = next(it, None)
                if spec is None:
                    return
                await _sleep_until(ready, 0.002)
                rec = new_record(spec, phase_at(ready - t0, warmup_s, measure), t0_wall + (ready - t0))
                await point.execute(spec, rec)
                ready = time.perf_counter() + think_s

        tasks = [asyncio.get_running_loop().create_task(user(k)) for k in range(users)]
        limit = deadline_s if deadline_s is not None else duration_s + request_timeout_s
        done, pending = await asyncio.wait(tasks, timeout=max(0.0, t0 + limit - time.perf_counter()))
        for t in pending:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await batcher.close()
        await transport.close()
    summary = summarize(batcher.all, t0_wall, client)
    if keep_records:
        summary.records = batcher.all
    return summary
