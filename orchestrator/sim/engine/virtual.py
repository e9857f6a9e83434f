"""Virtual-time discrete-event runs of a simulated cluster (pure, no sockets).

Events: request arrivals (open loop: a fixed schedule; closed loop: users who wait for their
reply and think), and the end of each worker's step. Workers step back to back while they
have work. Every scheduled request yields one ``RequestRecord`` with the same meaning as the
real load generator's (DESIGN section 7): unfinished requests end as ``timeout``.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast

from orchestrator.records import RequestRecord
from orchestrator.sim.engine.cache import PromptHasher
from orchestrator.sim.engine.chains import Blocks
from orchestrator.sim.engine.cluster import ClusterSpec
from orchestrator.sim.engine.routing import Router
from orchestrator.sim.engine.worker import Sequence as Seq
from orchestrator.sim.engine.worker import Worker

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

ARRIVE, STEP_END, WAKE, USER, SUBMIT = range(5)
_INF = float("inf")


class RequestLike(Protocol):
    """What the engine reads of a request (orchestrator.loadgen.workloads.RequestSpec)."""

    # Read-only (properties), so that frozen dataclasses such as RequestSpec satisfy it.
    @property
    def request_id(self) -> int: ...
    @property
    def conversation_id(self) -> int: ...
    @property
    def turn(self) -> int: ...
    @property
    def prompt(self) -> str: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def prompt_hash(self) -> str: ...


class SessionsLike(Protocol):
    """What the engine asks of live sessions (orchestrator.loadgen.session_scripts.SessionScript):
    a session's turns, each turn's request once the reply before it is in, when a later turn is
    due (from when the turn before was due and when its reply ended), and that a session ended."""

    def turns_of(self, session: int) -> int: ...
    def request(self, session: int, turn: int, reply_tokens: int) -> RequestLike: ...
    def due_s(self, session: int, turn: int, prev_due_s: float, reply_end_s: float) -> float: ...
    def done(self, session: int) -> None: ...


@dataclass(frozen=True)
class Windows:
    """Phases of a load point by scheduled time: warm-up, measurement, cool-down (seconds)."""

    warmup_s: float = 0.0
    measure_s: float = 60.0
    cooldown_s: float = 0.0

    @property
    def total_s(self) -> float:
        """Length of the whole point."""
        return self.warmup_s + self.measure_s + self.cooldown_s

    def phase(self, t: float) -> str:
        """warmup | measure | cooldown for a scheduled time."""
        if t < self.warmup_s:
            return "warmup"
        if t < self.warmup_s + self.measure_s:
            return "measure"
        return "cooldown"


@dataclass
class SimResult:
    """Records of every scheduled request, plus what the engine's /metrics would have said."""

    records: list[RequestRecord]
    end_s: float
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    steps: int = 0
    worker_hit_rates: list[float] = field(default_factory=list)

    @property
    def prefix_hit_rate(self) -> float:
        """Server-side prefix-cache hit rate over all workers (tokens)."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0


def output_hash(seed: int, request_id: int, frozen: bool = False) -> str:
    """Hash of the sampled text: distinct per request unless randomness is frozen."""
    rid = 0 if frozen else request_id
    if type(seed) is int and type(rid) is int:
        key = b"%d:%d" % (seed, rid)  # f"{seed}:{rid}".encode(), a little faster (once a request)
    else:
        key = f"{seed}:{rid}".encode()
    return hashlib.sha256(key).hexdigest()[:16]


def _no_users(user: int, t: float) -> None:  # an open loop has no users
    raise NotImplementedError


class _Run:
    def __init__(self, cluster: ClusterSpec, requests: Sequence[RequestLike], seed: int):
        self.cluster = cluster
        self.requests = requests
        self.seed = seed
        self.back: list[Worker]
        if cluster.disaggregated:
            self.front = [cluster.worker(m, f"prefill-{i}", chain_blocks=True) for i, m in enumerate(cluster.prefill)]
            self.back = [cluster.worker(m, f"decode-{i}", chain_blocks=True) for i, m in enumerate(cluster.decode)]
            self.router_back: Router | None = cluster.router(len(self.back), seed + 1)
        else:
            self.front = [cluster.worker(m, f"worker-{i}", chain_blocks=True) for i, m in enumerate(cluster.workers)]
            self.back = []
            self.router_back = None
        self.router = cluster.router(len(self.front), seed)
        self.workers = self.front + self.back
        self.busy = [False] * len(self.workers)
        self.wake_at: list[float | None] = [None] * len(self.workers)
        self.events: list[tuple[float, int, int, int]] = []
        self.n_ev = 0
        self.hashes: dict[int, Blocks] = {}
        self.hasher = PromptHasher()
        self.records: dict[int, RequestRecord] = {}
        self.front_seq: dict[int, Seq] = {}
        self.outstanding = 0
        self.on_done: Callable[[int, float], None] | None = None  # closed loop: callback(index, time)
        self.user_next: Callable[[int, float], None] = _no_users  # closed loop: a user's next send
        self.user_of: dict[int, int] = {}  # closed loop: request index -> user
        self.pending: dict[int, Seq] = {}  # in the server's front end, not yet at a worker
        self.frontend_free = [0.0] * len(self.workers)  # when each worker's front end is next idle
        self.arrival_times: list[float] = []  # open loop (schedule_arrivals)
        self.arrival_index: list[int] = []
        self.next_arrival = 0
        # Open loop, one pool, no front end and a router that ignores the workers' state
        # (schedule_arrivals): each arrival's worker is known beforehand and workers touch
        # nothing of each other's, so a worker may step ahead of the others up to its next
        # arrival; per worker, its arrivals' positions in arrival_times, in order.
        self.ahead: list[deque[int]] | None = None
        self.routes: list[int] = []
        self.last_t = 0.0

    def push(self, t: float, kind: int, a: int) -> None:
        self.n_ev += 1
        heapq.heappush(self.events, (t, self.n_ev, kind, a))

    def hashes_of(self, i: int) -> Blocks:
        h = self.hashes.get(i)
        if h is None:
            r = self.requests[i]
            h = self.hasher.hashes(r.prompt, r.prompt_tokens, getattr(r, "shared_prefix_tokens", 0))
            self.hashes[i] = h
        return h

    def kick(self, wi: int, now: float) -> None:
        if self.busy[wi]:
            return
        w = self.workers[wi]
        dur = w.begin_step(now)
        if dur is not None:
            self.busy[wi] = True
            self.push(now + dur, STEP_END, wi)
            return
        wake = w.next_wakeup()
        if wake is not None and self.wake_at[wi] != wake:
            self.wake_at[wi] = wake
            self.push(max(wake, now), WAKE, wi)

    def arrive(self, i: int, now: float, phase: str, wi: int = -1) -> None:
        """Request ``i`` is sent (to worker ``wi`` when routed beforehand)."""
        r = self.requests[i]
        rec = RequestRecord(
            request_id=r.request_id,
            conversation_id=r.conversation_id,
            turn=r.turn,
            phase=phase,
            scheduled_s=now,
            sent_s=now,
            prompt_tokens=r.prompt_tokens,
            output_tokens_asked=r.max_tokens,
            prompt_hash=r.prompt_hash,
        )
        self.records[i] = rec
        hashes = self.hashes_of(i)
        if wi < 0:
            wi = self.router.pick(hashes, r.prompt_tokens, r.conversation_id)
        else:
            self.router.count(wi)
        max_tokens = 1 if self.back else r.max_tokens
        seq = Seq(key=i, prompt_tokens=r.prompt_tokens, max_tokens=max_tokens, hashes=hashes, tag=(i, wi))
        self.outstanding += 1
        front = self.workers[wi].model
        if front.frontend_latency_s or front.frontend_cpu_s:
            # The engine sees it after the server's front end: one process that handles
            # requests one at a time (frontend_cpu_s each, so a burst reaches the engine spread
            # out), plus a fixed latency (HTTP, the hop to the engine core).
            done = max(now, self.frontend_free[wi]) + front.frontend_cpu_s
            self.frontend_free[wi] = done
            self.pending[i] = seq
            self.push(done + front.frontend_latency_s, SUBMIT, i)
        else:
            self.submit(seq, now)

    def submit(self, seq: Seq, now: float) -> None:
        _, wi = cast("tuple[int, int]", seq.tag)  # a string: no subscript built at each call
        w = self.workers[wi]
        if w.model.frontend_cpu_s and self.busy[wi]:
            w.charge_host(w.model.frontend_cpu_s)
        w.submit(seq)
        self.kick(wi, now)

    def step_end(self, wi: int, now: float) -> None:
        self.busy[wi] = False
        self.step_done(wi, now)
        self.kick(wi, now)

    def step_done(self, wi: int, now: float) -> None:
        """A step of worker ``wi`` ended at ``now``: its finished sequences move on (not the
        worker's next step: the caller's kick)."""
        res = self.workers[wi].end_step(now)
        for seq in res.finished:
            i, w_from = cast("tuple[int, int]", seq.tag)  # the (request, worker) tag arrive() set
            if self.back and wi < len(self.front):
                self.router.done(w_from)
                self.front_seq[i] = seq
                r = self.requests[i]
                assert self.router_back is not None
                d = self.router_back.pick(seq.hashes, r.prompt_tokens, r.conversation_id)
                dseq = Seq(
                    key=i,
                    prompt_tokens=r.prompt_tokens,
                    max_tokens=r.max_tokens,
                    hashes=seq.hashes,
                    remote_tokens=r.prompt_tokens,
                    tag=(i, d),
                )
                di = len(self.front) + d
                self.workers[di].submit(dseq)
                self.kick(di, now)
            else:
                if self.back:
                    assert self.router_back is not None  # set whenever there is a decode pool
                    self.router_back.done(w_from)
                else:
                    self.router.done(w_from)
                self.finish(i, seq)
                if self.on_done is not None:
                    self.on_done(i, now)

    def _steps(self, a: int, t: float, until: float, k: int) -> None:
        """Worker ``a``'s step ended at ``t``: its steps back to back, without the heap, while
        the next one ends before anything that could touch it (strictly: on a tie the other
        event, pushed or scheduled earlier, went first) and by ``until``. Anything is every
        other event; with independent workers (``ahead``), the next arrival routed to ``a``.
        The sequence numbers advance as if each step went through the heap; ``last_t`` is
        the latest step end handled."""
        events, busy, w = self.events, self.busy, self.workers[a]
        if self.ahead is not None:
            q = self.ahead[a]
            before = self.arrival_times[q[0]] if q else _INF
        else:
            before = self.arrival_times[k] if k < len(self.arrival_times) else _INF
        while True:
            busy[a] = False
            self.step_done(a, t)
            last = t
            dur = w.begin_step(t)
            if dur is None:
                self.kick(a, t)  # idle: a wake-up if transfers are pending
                break
            busy[a] = True
            self.n_ev += 1
            t += dur
            if events and events[0][0] < before and self.ahead is None:
                before = events[0][0]  # step_done may have pushed one (a user, a decode step)
            if not (t < before and t <= until):
                heapq.heappush(events, (t, self.n_ev, STEP_END, a))
                break
            t, n = w.quiet_steps(t, before, until)
            if n:
                self.n_ev += n
                last = w.ends[-1]
                if not (t < before and t <= until):
                    heapq.heappush(events, (t, self.n_ev, STEP_END, a))
                    break
        if last > self.last_t:
            self.last_t = last

    def finish(self, i: int, seq: Seq) -> None:
        rec = self.records[i]
        front = self.front_seq.pop(i, seq)
        rec.first_token_s = seq.first_token_s
        rec.last_token_s = seq.last_token_s
        rec.output_tokens = seq.generated
        rec.cached_tokens = front.cached_tokens
        rec.chunks = seq.chunks
        rec.max_gap_s = seq.max_gap_s
        rec.status = "ok"
        rec.http_status = 200
        rec.output_hash = output_hash(self.seed, rec.request_id)
        self.outstanding -= 1

    def loop(self, until: float) -> float:
        now = 0.0
        events = self.events
        heappop = heapq.heappop
        # Open-loop arrivals wait in their own sorted list rather than the heap (thousands of
        # entries there make every step's push and pop slower); an arrival goes first on a tie,
        # as it did in the heap, where it had the lowest sequence number.
        arr_t, arr_i, k = self.arrival_times, self.arrival_index, self.next_arrival
        n_arr = len(arr_t)
        try:
            while True:
                if k < n_arr and (not events or arr_t[k] <= events[0][0]):
                    t = arr_t[k]
                    if t > until:
                        break
                    now = t
                    if self.ahead is not None:
                        wi = self.routes[k]
                        self.ahead[wi].popleft()
                        k += 1
                        self.arrive(arr_i[k - 1], t, self._phase(t), wi)
                    else:
                        k += 1
                        self.arrive(arr_i[k - 1], t, self._phase(t))
                    continue
                if not events:
                    break
                t, _, kind, a = heappop(events)
                if t > until:
                    heapq.heappush(events, (t, 0, kind, a))
                    break
                now = t
                if kind == STEP_END:
                    self._steps(a, t, until, k)
                elif kind == WAKE:
                    self.wake_at[a] = None
                    self.kick(a, t)
                elif kind == USER:
                    self.user_next(a, t)
                elif kind == SUBMIT:
                    self.submit(self.pending.pop(a), t)
                else:  # ARRIVE pushed by hand
                    self.arrive(a, t, self._phase(t))
        finally:
            self.next_arrival = k
        return max(now, self.last_t)  # the last event handled (a worker may have stepped ahead)

    def schedule_arrivals(self, offsets: Sequence[float]) -> None:
        """Request i arrives at offsets[i] (in time order; by index on ties, as the heap did)."""
        order = sorted(range(len(offsets)), key=offsets.__getitem__)
        self.arrival_times = [float(offsets[i]) for i in order]
        self.arrival_index = order
        self.next_arrival = 0
        if (not self.back and self.router.oblivious
                and not any(w.model.frontend_latency_s or w.model.frontend_cpu_s for w in self.front)):
            reqs = self.requests
            self.routes = [self.router.choose_ahead(reqs[i].conversation_id) for i in order]
            self.ahead = [deque() for _ in self.front]
            for pos, wi in enumerate(self.routes):
                self.ahead[wi].append(pos)

    def _phase(self, t: float) -> str:
        return self.windows.phase(t)

    windows: Windows = Windows()

    def result(self, end: float) -> SimResult:
        for rec in self.records.values():
            if rec.status == "unsent":  # scheduled and sent, never finished
                rec.status = "timeout"
        recs = [self.records[i] for i in sorted(self.records)]
        q = sum(w.memory.queries for w in self.front)
        h = sum(w.memory.hits for w in self.front)
        return SimResult(
            records=recs,
            end_s=end,
            prefix_queries=q,
            prefix_hits=h,
            preemptions=sum(w.preemptions for w in self.workers),
            steps=sum(w.step_no for w in self.workers),
            worker_hit_rates=[w.memory.hits / w.memory.queries if w.memory.queries else 0.0 for w in self.front],
        )


def simulate_open_loop(
    cluster: ClusterSpec,
    requests: Sequence[RequestLike],
    offsets: Sequence[float] | NDArray[np.float64],
    windows: Windows,
    *,
    drain_s: float = 60.0,
    seed: int = 0,
) -> SimResult:
    """Send ``requests[i]`` at ``offsets[i]`` whatever happens; run until all return or the
    last send + ``drain_s`` (later ones end as timeouts)."""
    n = min(len(requests), len(offsets))
    run = _Run(cluster, requests, seed)
    run.windows = windows
    times = offsets.tolist() if hasattr(offsets, "tolist") else list(offsets)
    run.schedule_arrivals(times[:n])
    run.n_ev = n  # the sequence numbers the arrivals took when they went through the heap
    last = float(offsets[n - 1]) if n else 0.0
    end = run.loop(max(last, windows.total_s) + drain_s)
    return run.result(end)


def simulate_closed_loop(
    cluster: ClusterSpec,
    requests: Sequence[RequestLike],
    users: int,
    windows: Windows,
    *,
    think_s: float = 0.0,
    ramp_up_s: float = 0.0,
    drain_s: float = 60.0,
    seed: int = 0,
) -> SimResult:
    """``users`` users each send, wait for the reply, think, send again, until the point ends;
    requests are taken in order from ``requests`` (cycled if the point needs more)."""
    run = _Run(cluster, requests, seed)
    run.windows = windows
    state = {"next": 0}
    horizon = windows.total_s

    def user_next(user: int, t: float) -> None:
        if t >= horizon:
            return
        i = state["next"]
        if i >= len(requests):
            return
        state["next"] = i + 1
        run.user_of[i] = user
        run.arrive(i, t, windows.phase(t))

    def on_done(i: int, t: float) -> None:
        run.push(t + think_s, USER, run.user_of[i])

    run.user_next = user_next
    run.on_done = on_done
    for u in range(users):
        run.push(ramp_up_s * u / users, USER, u)
    end = run.loop(horizon + drain_s)
    return run.result(end)


def simulate_sessions(
    cluster: ClusterSpec,
    starts: Sequence[float] | NDArray[np.float64],
    sessions: SessionsLike,
    windows: Windows,
    *,
    drain_s: float = 60.0,
    seed: int = 0,
) -> SimResult:
    """Session ``s`` sends its first turn at ``starts[s]``; each later turn is due when the
    sessions say (the reply before it ended plus a think time, or a trace's own pace, never
    before that reply), and carries that reply (as the live runner). No turn becomes due after the point ends; what is in flight then gets ``drain_s``."""
    requests: list[RequestLike] = []
    run = _Run(cluster, requests, seed)
    run.windows = windows
    horizon = windows.total_s
    turn_of: list[int] = []  # request index -> its turn
    next_turn: dict[int, int] = {}
    reply: dict[int, int] = {}  # session -> tokens of its last reply

    def user_next(session: int, t: float) -> None:
        k = next_turn.get(session, 0)
        requests.append(sessions.request(session, k, reply.get(session, 0)))
        i = len(requests) - 1
        turn_of.append(k)
        next_turn[session] = k + 1
        run.user_of[i] = session
        run.arrive(i, t, windows.phase(t))

    def on_done(i: int, t: float) -> None:
        session, k = run.user_of[i], turn_of[i]
        if k + 1 >= sessions.turns_of(session):
            sessions.done(session)
            return
        reply[session] = run.records[i].output_tokens or 0
        due = sessions.due_s(session, k + 1, run.records[i].scheduled_s, t)
        if due < horizon:
            run.push(due, USER, session)
        else:
            sessions.done(session)

    run.user_next = user_next
    run.on_done = on_done
    times = starts.tolist() if hasattr(starts, "tolist") else list(starts)
    for s, off in enumerate(times):
        if off < horizon:
            run.push(float(off), USER, s)
    end = run.loop(horizon + drain_s)
    return run.result(end)
