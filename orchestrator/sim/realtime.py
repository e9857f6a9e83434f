"""Real-time driver of simulated workers: the same ``Worker`` steps, paced by the event loop.

Each worker runs one asyncio task: schedule a step, sleep until its end on an absolute
timeline (no drift), apply it, hand each request its tokens. Tokens therefore leave at the
times the performance model gives, within the loop's ~1 ms timer resolution (or sub-ms with
``spin_s``, at some CPU); the server exports how late each step ended and how far each step's
duration strayed from the model's (orch_sim_step_lateness_seconds, orch_sim_step_time_error_seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.sim.engine import ClusterSpec, Sequence, Worker, block_hashes
from orchestrator.sim.model import WorkerModel

# Beyond this lateness the timeline restarts from now instead of trying to catch up.
MAX_CATCH_UP_S = 0.050
# The event loop's timers wake up to ~1 ms late (epoll rounds its timeout up to whole
# milliseconds). Step *durations* keep the model's (the timeline is absolute, so a wake-up late
# by about the same each step cancels out); with spin_s > 0 a worker also sleeps only until
# spin_s before a step's end and yields to the loop until it: sub-ms step ends, for CPU.
TimingSink = Callable[[float, float | None], None]


@dataclass(eq=False)
class Pending:
    """A request in flight: the server reads emissions from ``queue``."""

    seq: Sequence
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)  # (tokens, time) | None at the end
    worker: Worker | None = None


class RealtimeWorker:
    """One simulated worker stepping in real time."""

    def __init__(self, worker: Worker, on_step: Callable[[Worker, float], None] | None = None,
                 on_timing: TimingSink | None = None, spin_s: float = 0.0):
        self.worker = worker
        self.on_step = on_step
        # (lateness of the step's end against the model, |its duration - the model's| when it
        # followed the previous step back to back, else None)
        self.on_timing = on_timing
        self.spin_s = spin_s
        self.pending: dict[int, Pending] = {}
        self.restarts = 0  # times it fell more than MAX_CATCH_UP_S behind and restarted its timeline
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(self, p: Pending) -> None:
        p.worker = self.worker
        self.pending[p.seq.key] = p
        self.worker.submit(p.seq)
        self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        w = self.worker
        t = loop.time()
        prev_late: float | None = None
        waited = False
        while True:
            now = loop.time()
            busy = w.has_step_work()
            if now - t > MAX_CATCH_UP_S or not busy:
                # Behind while busy (not back from idle): the model's timeline is lost here.
                self.restarts += busy and not waited
                t = now
                prev_late = None
            waited = False
            dur = w.begin_step(t)
            if dur is None:
                wake = w.next_wakeup()
                self._wake.clear()
                timeout = None if wake is None else max(0.0, wake - loop.time())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                waited = True
                continue
            end = t + dur
            delay = end - loop.time()
            if delay > self.spin_s:
                await asyncio.sleep(delay - self.spin_s)
            if self.spin_s:
                while loop.time() < end:
                    await asyncio.sleep(0)  # other tasks (HTTP streams, workers) run meanwhile
            if self.on_timing is not None:
                late = max(0.0, loop.time() - end)
                self.on_timing(late, None if prev_late is None else abs(late - prev_late))
                prev_late = late
            res = w.end_step(end)
            t = end
            for seq, n in res.decoded:
                p = self.pending.get(seq.key)
                if p is not None:
                    p.queue.put_nowait((n, end))
            for seq in res.finished:
                p = self.pending.pop(seq.key, None)
                if p is not None:
                    p.queue.put_nowait(None)
            if self.on_step:
                self.on_step(w, dur)


_keys = itertools.count(1)


class SimCluster:
    """Workers (one, or a whole arm) with a router, serving requests in real time."""

    def __init__(self, cluster: ClusterSpec, role: str = "both", seed: int = 0,
                 on_step: Callable[[Worker, float], None] | None = None,
                 on_timing: TimingSink | None = None, spin_s: float = 0.0):
        self.role = role
        self.disaggregated = cluster.disaggregated
        def worker(m: WorkerModel, name: str) -> RealtimeWorker:
            return RealtimeWorker(cluster.worker(m, name, track_emissions=True), on_step, on_timing, spin_s)

        self.back: list[RealtimeWorker]
        if cluster.disaggregated:
            self.front = [worker(m, f"prefill-{i}") for i, m in enumerate(cluster.prefill)]
            self.back = [worker(m, f"decode-{i}") for i, m in enumerate(cluster.decode)]
        else:
            self.front = [worker(m, f"worker-{i}") for i, m in enumerate(cluster.workers)]
            self.back = []
        self.router = cluster.router(len(self.front), seed)
        self.router_back = cluster.router(max(1, len(self.back)), seed + 1)

    @property
    def workers(self) -> list[Worker]:
        return [rw.worker for rw in (*self.front, *self.back)]

    @property
    def timeline_restarts(self) -> int:
        return sum(rw.restarts for rw in (*self.front, *self.back))

    def start(self) -> None:
        for rw in (*self.front, *self.back):
            rw.start()

    async def stop(self) -> None:
        for rw in (*self.front, *self.back):
            await rw.stop()

    def new_sequence(self, words: list[str], max_tokens: int, remote: bool) -> Sequence:
        n = len(words)
        return Sequence(key=next(_keys), prompt_tokens=max(n, 1), max_tokens=max_tokens,
                        hashes=block_hashes(words), remote_tokens=n if remote else 0)

    async def generate(self, words: list[str], max_tokens: int,
                       remote: bool = False) -> tuple[Pending, Callable[[], None]]:
        """Async iterator of (tokens, time) emissions; the sequence is returned via .seq."""
        if self.disaggregated:
            # whole arm, P/D: prefill on the prefill pool, then decode with the KV transfer
            pre = self.new_sequence(words, 1, False)
            i = self.router.pick(pre.hashes, pre.prompt_tokens)
            p = Pending(pre)
            self.front[i].submit(p)
            while await p.queue.get() is not None:
                pass
            self.router.done(i)
            seq = self.new_sequence(words, max_tokens, True)
            seq.cached_tokens = pre.cached_tokens
            j = self.router_back.pick(seq.hashes, seq.prompt_tokens)
            target, done = self.back[j], lambda: self.router_back.done(j)
        else:
            seq = self.new_sequence(words, max_tokens, remote)
            j = self.router.pick(seq.hashes, seq.prompt_tokens)
            target, done = self.front[j], lambda: self.router.done(j)
        p = Pending(seq)
        target.submit(p)
        return p, done
