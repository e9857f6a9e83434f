"""The virtual backend: an arm on the simulated engine in virtual time, with no socket, no
process, no sleep and no wall clock in its measurements.

It is the sim backend's model without the servers: each load point is one discrete-event run
of the arm's simulated cluster (``orchestrator.sim.engine``), and its records, with the same
meaning as the real generator's (TTFT from the scheduled send, every scheduled request one
record), go through the real point runner, guards, store and verdicts. A whole 4-block
experiment takes seconds and gives the same records for the same plan and seed every time:
what the control logic (executor, resume, retries, early stop, verdicts, gate) is tested on.

What it cannot show, by construction: the load generator's own lateness (a virtual send is
never late), HTTP, the router process, streaming. Those are the real-time tier's.

Faults: the same flags as ``orch sim serve`` (``--fault-ignore-max-tokens[-streaming]``,
``--fault-stall-every N --fault-stall-ms X``, ``--fault-die-after N``,
``--fault-frozen-output``), per (arm, block, attempt), as the sim backend takes them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast, overload

import numpy as np

from orchestrator import __version__
from orchestrator.backends.base import (
    QUICK_START_BUDGET_S,
    Deployment,
    Endpoint,
    Fingerprint,
    RunKey,
)
from orchestrator.engines import EngineAdapter, engine_for
from orchestrator.errors import PermanentError, TransientError, UserError
from orchestrator.loadgen.runner import STOPPED_EARLY, PointSummary, Sink, StopCheck, summarize
from orchestrator.loadgen.schedules import derive_seed
from orchestrator.loadgen.session_scripts import SessionScript
from orchestrator.loadgen.workloads import RequestSpec
from orchestrator.plan import Plan, Workload
from orchestrator.records import ERROR_STATUSES, RequestRecord
from orchestrator.sim.engine import ClusterSpec, Windows, cluster_for_arm, output_hash
from orchestrator.sim.engine import simulate_closed_loop as sim_closed
from orchestrator.sim.engine import simulate_open_loop as sim_open
from orchestrator.sim.engine import simulate_sessions as sim_sessions

ENGINE_VERSION = f"sim-virtual-{__version__}"  # "sim-": never pooled with measured capacities
CHECK_EVERY_S = 0.25  # how often the real generator asks an early-stop question (runner.run_point)
BATCH = 500  # records handed to the sink at a time (the real generator's batch size)
UNSENT = "not sent before the end of the point"
CANCELLED = "in flight at the point's deadline"


@dataclass(frozen=True)
class Faults:
    """What a faulty simulated server does (the flags of ``orch sim serve``)."""

    ignore_max_tokens: bool = False  # every request, the readiness check's too
    ignore_max_tokens_streaming: bool = False  # streamed requests only: readiness passes
    stall_every: int = 0
    stall_ms: float = 0.0
    die_after: int = 0  # the server exits after this many requests (0: never)
    frozen_output: bool = False
    # The served tokenizer counts each prompt this many times longer (a BPE tokenizer splitting
    # the generator's words; 0: the asked length, as the sim server's one-word-one-token).
    prompt_token_factor: float = 0.0

    @classmethod
    def from_flags(cls, flags: Sequence[str]) -> Faults:
        kw: dict[str, Any] = {}
        it = iter(flags)
        for flag in it:
            name = flag.removeprefix("--fault-").replace("-", "_")
            f = next((f for f in dataclasses.fields(cls) if f.name == name), None)
            if f is None or not flag.startswith("--fault-"):
                raise UserError(f"unknown fault flag {flag!r} for the virtual backend")
            kw[name] = True if f.type in (bool, "bool") else type(getattr(cls(), name))(next(it))
        return cls(**kw)


@dataclass
class _ArmState:
    """One deployment's simulated servers: their cluster, faults and what /metrics counts."""

    cluster: ClusterSpec
    faults: Faults
    seed: int
    model: str
    engine: EngineAdapter  # whose metric names the servers export
    served: int = 0  # requests the servers took so far (for die_after)
    prefix_queries: int = 0
    prefix_hits: int = 0
    points: int = 0
    dead: bool = False
    # The last open-loop point's sent requests, their offsets and when its servers were idle
    # again (seconds from its start): replayed before the next point, so that point meets the
    # prefix caches (and cache-aware routing) the servers would have kept, as a real server does.
    history: tuple[Sequence[RequestSpec], np.ndarray, float] | None = field(default=None, repr=False)

    def metrics_text(self) -> str:
        """The engine's counter and gauge names, as the real-time sim server exports them."""
        m = self.engine.metrics
        lab = f'{{model_name="{self.model}"}}'
        return (f"{m.prefix_queries}_total{lab} {self.prefix_queries}\n"
                f"{m.prefix_hits}_total{lab} {self.prefix_hits}\n"
                f"{m.running}{lab} 0\n{m.waiting}{lab} 0\n")


class _Taken(Sequence[RequestSpec]):
    """An endless request iterator seen as a sequence, taken only as far as it is read (a
    closed loop's count is known only when its point ends): its length is always one past the
    last index read, until the iterator runs out."""

    def __init__(self, it: Iterator[RequestSpec], served: Callable[[RequestSpec], RequestSpec]):
        self._it, self._items, self._read, self._done = it, cast(list[RequestSpec], []), 0, False
        self.taken: list[RequestSpec] = []  # as the client sent them (``_items``: as served)
        self._served = served

    def _fill(self, n: int) -> None:
        while not self._done and len(self._items) < n:
            nxt = next(self._it, None)
            if nxt is None:
                self._done = True
            else:
                self.taken.append(nxt)
                self._items.append(self._served(nxt))

    def __len__(self) -> int:
        self._fill(self._read + 1)
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> RequestSpec: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[RequestSpec]: ...
    def __getitem__(self, i: int | slice) -> RequestSpec | Sequence[RequestSpec]:
        if isinstance(i, slice):
            raise TypeError("a closed loop's requests are read one at a time")
        self._fill(i + 1)
        self._read = max(self._read, i + 1)
        return self._items[i]


def _deliver(sink: Sink | None, records: list[RequestRecord]) -> None:
    if sink is None:
        return
    for k in range(0, len(records), BATCH):
        out = sink(records[k:k + BATCH])
        if out is not None:  # an async sink: the point runner's are sync
            raise TypeError("the virtual driver takes a synchronous sink")


def _timed_windows(duration_s: float, warmup_s: float, measure_s: float | None, request_timeout_s: float,
                   deadline_s: float | None) -> tuple[Windows, float]:
    """A timed point's windows (closed loop, sessions) and when it ends: the deadline, else the
    duration plus one request's timeout."""
    measure = measure_s if measure_s is not None else max(duration_s - warmup_s, 1e-9)
    windows = Windows(warmup_s, measure, max(0.0, duration_s - warmup_s - measure))
    return windows, deadline_s if deadline_s is not None else duration_s + request_timeout_s


class VirtualDriver:
    """A deployment's load driver on the simulator's clock (offset 0 of a point = time 0)."""

    realtime = False
    remote = False

    def __init__(self, state: _ArmState):
        self.state = state

    # -- the three ways a point sends -------------------------------------------------------
    def open_loop(self, url: str, model: str, requests: Sequence[RequestSpec],
                  offsets: Sequence[float] | np.ndarray, phases: Sequence[str], *, sink: Sink | None = None,
                  request_timeout_s: float = 60.0, deadline_s: float | None = None,
                  keep_records: bool = False, stop_when: StopCheck | None = None,
                  stop_drain_s: float = 0.0, **_http: Any) -> PointSummary:
        offs = np.asarray(offsets, dtype=np.float64)
        last = float(offs[-1]) if len(offs) else 0.0
        deadline = deadline_s if deadline_s is not None else last + request_timeout_s
        n_send = int(np.searchsorted(offs, deadline, side="left"))
        sent = self._simulate(requests[:n_send], offs[:n_send], phases, deadline, request_timeout_s)
        stopped_at: float | None = None
        if stop_when is not None and n_send:
            stopped_at = _first_stop(sent, offs[:n_send], deadline, stop_when)
            if stopped_at is not None:
                # Nothing more is sent after the stop; in-flight requests get stop_drain_s to end.
                n_send = int(np.searchsorted(offs, stopped_at, side="right"))
                end = min(deadline, stopped_at + stop_drain_s)
                sent = self._simulate(requests[:n_send], offs[:n_send], phases, end, request_timeout_s)
        self._count_prefix(sent)
        self.state.history = _history(requests[:n_send], offs[:n_send], sent, deadline) if n_send else None
        why = STOPPED_EARLY if stopped_at is not None else UNSENT
        rest = [_unsent(spec, phases[i], float(offs[i]), why)
                for i, spec in enumerate(requests[n_send:], start=n_send)]
        self._account(sent)
        records = sent + rest
        _deliver(sink, records)
        summary = summarize(records, 0.0, "virtual")
        if stopped_at is not None:
            summary.extra["stopped_at"] = stopped_at
        if keep_records:
            summary.records = records
        return summary

    def closed_loop(self, url: str, model: str, requests: Iterable[RequestSpec], *, users: int,
                    think_s: float = 0.0, ramp_up_s: float = 0.0, duration_s: float,
                    warmup_s: float = 0.0, measure_s: float | None = None, sink: Sink | None = None,
                    request_timeout_s: float = 60.0, deadline_s: float | None = None,
                    keep_records: bool = False, **_http: Any) -> PointSummary:
        if users < 1:
            raise ValueError("users must be >= 1")
        windows, end = _timed_windows(duration_s, warmup_s, measure_s, request_timeout_s, deadline_s)
        st = self.state
        taken = _Taken(iter(requests), lambda spec: _as_served(spec, st.faults))
        res = sim_closed(self._cluster(), taken, users, windows, think_s=think_s,
                         ramp_up_s=ramp_up_s, drain_s=max(0.0, end - windows.total_s), seed=self._seed())
        records = self._finish(res.records, taken.taken[:len(res.records)], request_timeout_s)
        return self._handed(records, sink, keep_records)

    def sessions(self, url: str, model: str, workload: Workload, starts: Sequence[float] | np.ndarray, *,
                 seed: int, duration_s: float, warmup_s: float = 0.0, measure_s: float | None = None,
                 sink: Sink | None = None, request_timeout_s: float = 60.0, deadline_s: float | None = None,
                 keep_records: bool = False, sent: list[RequestSpec] | None = None,
                 **_http: Any) -> PointSummary:
        """Live sessions on the simulator's clock: each later turn is due when its reply has
        ended plus the think time, and carries a reply of the length the engine returned."""
        windows, end = _timed_windows(duration_s, warmup_s, measure_s, request_timeout_s, deadline_s)
        script = _ServedSessions(SessionScript(workload, seed), self.state.faults)
        res = sim_sessions(self._cluster(), starts, script, windows,
                           drain_s=max(0.0, end - windows.total_s), seed=self._seed())
        records = self._finish(res.records, script.asked, request_timeout_s)
        if sent is not None:
            sent.extend(script.asked)
        return self._handed(records, sink, keep_records)

    def _handed(self, records: list[RequestRecord], sink: Sink | None, keep_records: bool) -> PointSummary:
        """A timed point's records counted, handed to the sink and summarized."""
        self._count_prefix(records)
        self._account(records)
        _deliver(sink, records)
        summary = summarize(records, 0.0, "virtual")
        if keep_records:
            summary.records = records
        return summary

    # -- one simulated point ----------------------------------------------------------------
    def _seed(self) -> int:
        self.state.points += 1
        return derive_seed(self.state.seed, "point", self.state.points)

    def _cluster(self) -> ClusterSpec:
        f = self.state.faults
        if f.stall_every and f.stall_ms:
            return replace(self.state.cluster, stall_every_steps=f.stall_every, stall_s=f.stall_ms / 1000)
        return self.state.cluster

    def _simulate(self, requests: Sequence[RequestSpec], offsets: np.ndarray, phases: Sequence[str],
                  end_s: float, request_timeout_s: float) -> list[RequestRecord]:
        """The records of one simulated open-loop point (after the last point's replay)."""
        if not len(requests):
            return []
        st = self.state
        lead: Sequence[RequestSpec] = []
        lead_offs, t0 = np.empty(0), 0.0
        if st.history is not None:
            lead, lead_offs, t0 = st.history
        served = [_as_served(spec, st.faults) for spec in (*lead, *requests)]
        all_offs = np.concatenate([lead_offs, offsets + t0])
        res = sim_open(self._cluster(), served, all_offs, Windows(0.0, 0.0, 0.0),
                       drain_s=max(0.0, end_s - float(offsets[-1])), seed=self._seed())
        records = res.records[len(lead):]
        for rec, phase in zip(records, phases, strict=False):
            rec.phase = phase
            if t0:
                rec.scheduled_s -= t0
                rec.sent_s = None if rec.sent_s is None else rec.sent_s - t0
                rec.first_token_s = None if rec.first_token_s is None else rec.first_token_s - t0
                rec.last_token_s = None if rec.last_token_s is None else rec.last_token_s - t0
        return self._finish(records, requests, request_timeout_s)

    def _count_prefix(self, records: Sequence[RequestRecord]) -> None:
        """/metrics' prefix-cache counters (tokens looked up, tokens found) over a point's
        requests that reached a server."""
        for r in records:
            if r.status != "unsent" and r.sent_s is not None:
                self.state.prefix_queries += r.prompt_tokens
                self.state.prefix_hits += r.cached_tokens or 0

    def _finish(self, records: list[RequestRecord], requests: Sequence[RequestSpec],
                request_timeout_s: float) -> list[RequestRecord]:
        """What a client would have recorded: its own timeout, the deadline's cancellations,
        the asked length, the server's usage, and the server's faults."""
        st = self.state
        for k, (rec, spec) in enumerate(zip(records, requests, strict=True)):
            rec.output_tokens_asked = spec.max_tokens
            if rec.status == "timeout":  # still running when the point ended
                rec.status, rec.error = "cancelled", CANCELLED
                rec.first_token_s = rec.last_token_s = None
                continue
            rec.server_prompt_tokens = (round(spec.prompt_tokens * st.faults.prompt_token_factor)
                                        if st.faults.prompt_token_factor else spec.prompt_tokens)
            if rec.last_token_s is not None and rec.last_token_s - rec.scheduled_s > request_timeout_s:
                rec.status, rec.error, rec.last_token_s = "timeout", "request timed out", None
            if st.faults.frozen_output:
                rec.output_hash = output_hash(st.seed, 0, frozen=True)
            if st.faults.die_after and st.served + k >= st.faults.die_after:
                rec.status, rec.error, rec.http_status = "disconnect", "the server exited", None
                rec.first_token_s = rec.last_token_s = rec.output_tokens = None
                rec.chunks, rec.max_gap_s = 0, None
        return records

    def _account(self, records: Sequence[RequestRecord]) -> None:
        st = self.state
        st.served += sum(1 for r in records if r.sent_s is not None)
        if st.faults.die_after and st.served >= st.faults.die_after:
            st.dead = True


class _ServedSessions:
    """A session script as a faulty server serves it; ``asked`` keeps each turn as sent."""

    def __init__(self, script: SessionScript, faults: Faults):
        self.script, self.faults = script, faults
        self.asked: list[RequestSpec] = []

    def turns_of(self, session: int) -> int:
        return self.script.turns_of(session)

    def done(self, session: int) -> None:
        self.script.done(session)

    def request(self, session: int, turn: int, reply_tokens: int) -> RequestSpec:
        spec = self.script.request(session, turn, reply_tokens)
        self.asked.append(spec)
        return _as_served(spec, self.faults)

    def due_s(self, session: int, turn: int, prev_due_s: float, reply_end_s: float) -> float:
        return self.script.due_s(session, turn, prev_due_s, reply_end_s)


def _as_served(spec: RequestSpec, faults: Faults) -> RequestSpec:
    """A request as a faulty server reads it (one that ignores max_tokens runs on)."""
    if faults.ignore_max_tokens or faults.ignore_max_tokens_streaming:
        return replace(spec, max_tokens=2 * spec.max_tokens + 1)
    return spec


SETTLE_S = 30.0  # the point runner waits up to this for idle servers before the next point


def _history(requests: Sequence[RequestSpec], offsets: np.ndarray, records: Sequence[RequestRecord],
             deadline: float) -> tuple[Sequence[RequestSpec], np.ndarray, float]:
    """What the next point replays first, and when it starts (seconds after this point's
    start): once every reply ended, or the deadline plus the runner's settle wait if some never
    did (a simulated server finishes what it took, as the real-time one does)."""
    ends = [r.last_token_s for r in records if r.last_token_s is not None]
    done = all(r.status == "ok" for r in records)
    idle = max([float(offsets[-1]), *ends]) if done else deadline + SETTLE_S
    return list(requests), np.asarray(offsets, dtype=np.float64).copy(), idle + 1.0


def _unsent(spec: RequestSpec, phase: str, offset: float, why: str) -> RequestRecord:
    return RequestRecord(request_id=spec.request_id, conversation_id=spec.conversation_id, turn=spec.turn,
                         phase=phase, scheduled_s=offset, prompt_tokens=spec.prompt_tokens,
                         output_tokens_asked=spec.max_tokens, prompt_hash=spec.prompt_hash, error=why)


def _first_stop(records: list[RequestRecord], offsets: np.ndarray, deadline: float,
                stop_when: StopCheck) -> float | None:
    """When the real generator's early-stop question would first have said yes: asked every
    CHECK_EVERY_S while requests remain to be sent, over the records as they stood then."""
    views = [RequestRecord(request_id=r.request_id, conversation_id=r.conversation_id, turn=r.turn,
                           phase=r.phase, scheduled_s=r.scheduled_s, prompt_tokens=r.prompt_tokens,
                           output_tokens_asked=r.output_tokens_asked, prompt_hash=r.prompt_hash)
             for r in records]
    # Each record's news in time order: sent, first token, end (its final fields).
    events: list[tuple[float, int, int]] = []
    for i, r in enumerate(records):
        if r.sent_s is not None:
            events.append((r.sent_s, 0, i))
        if r.first_token_s is not None:
            events.append((r.first_token_s, 1, i))
        if r.last_token_s is not None:
            events.append((r.last_token_s, 2, i))
        elif r.sent_s is not None:  # a failed request fails when sent; a cancelled one at the deadline
            events.append((r.sent_s if r.status in ERROR_STATUSES else deadline, 2, i))
    events.sort()
    k, last_send = 0, float(offsets[-1])
    t = float(offsets[0])
    while t < last_send:
        t += CHECK_EVERY_S
        while k < len(events) and events[k][0] <= t:
            _, kind, i = events[k]
            v, r = views[i], records[i]
            if kind == 0:
                v.sent_s = r.sent_s
            elif kind == 1:
                v.first_token_s = r.first_token_s
            else:
                for f in dataclasses.fields(RequestRecord):
                    setattr(v, f.name, getattr(r, f.name))
            k += 1
        if t >= last_send:
            break
        if stop_when(views, t):
            return t
    return None


class VirtualBackend:
    """Arms on the simulated engine in virtual time (see the module docstring)."""

    name = "virtual"

    def __init__(self, faults: Mapping[tuple[str, int, int], list[str]] | None = None,
                 carryover: Mapping[str, float] | None = None):
        # (arm, block, attempt) -> `orch sim serve` fault flags, as SimBackend takes them.
        self.faults = {k: Faults.from_flags(v) for k, v in (faults or {}).items()}
        self.deployed: dict[str, Deployment] = {}
        # A first-order carry-over, for tests of the design against it: arm -> the share of its
        # efficiency the deployment right after a deployment of that arm loses (whatever arm).
        self.carryover = dict(carryover or {})
        self._previous: str | None = None

    def sends_load_here(self, plan: Plan) -> bool:
        return False  # the simulated engine's own clock: no generator

    def startup_budget_s(self, plan: Plan, arm: str) -> float:
        return QUICK_START_BUDGET_S

    def deploy(self, plan: Plan, arm: str, key: RunKey) -> Deployment:
        spec = plan.arm(arm)
        if spec.external:
            raise UserError(f"arm {arm} is an external endpoint: the virtual backend simulates provisioned arms")
        seed = derive_seed(plan.design.seed, "virtual", arm, key.block, key.attempt)
        # Run-to-run noise as the plan registers it: one efficiency draw per run.
        noise = plan.sim.noise
        eff = math.exp(float(np.random.default_rng(seed).normal(0.0, noise))) if noise > 0 else 1.0
        eff *= 1.0 - self.carryover.get(self._previous or "", 0.0)
        self._previous = arm
        cluster = cluster_for_arm(plan.model, spec, plan.router_for(arm), plan.sim, efficiency_scale=eff)
        model = plan.model.hf_id or plan.model.name
        state = _ArmState(cluster, self.faults.get((arm, key.block, key.attempt), Faults()), seed, model,
                          engine_for(spec))
        fingerprint = Fingerprint(
            backend=self.name, gpu_type=spec.gpu, engine_version=ENGINE_VERSION,
            engine_version_source="package", gpu_products=(f"simulated {spec.gpu}",),
            node_pools=("virtual",), driver_versions=("simulated",), nodes=("virtual",),
            kv_transport="simulated" if spec.layout == "disaggregated" else None,
            topology=f"virtual {plan.router_for(arm).policy}" + (" P/D" if spec.layout == "disaggregated" else ""),
            details={"efficiency": eff},
        )
        dep = Deployment(key=key, endpoint=Endpoint(url=f"virtual://{key.slug}", model=model,
                                                    metrics_urls=(f"virtual://{key.slug}/metrics",)),
                         fingerprint=fingerprint, handles=state, driver=VirtualDriver(state))
        self.deployed[key.slug] = dep
        return dep

    def _state(self, dep: Deployment) -> _ArmState:
        return dep.handles_as(_ArmState)

    def ready(self, deployment: Deployment, deadline_s: float) -> None:
        st = self._state(deployment)
        if st.dead:
            raise TransientError(f"virtual arm {deployment.key.arm}: the server exited", delay=0.0)
        if st.faults.ignore_max_tokens:
            raise PermanentError(f"virtual arm {deployment.key.arm}: the readiness completion returned "
                                 "more tokens than asked: the engine ignores max_tokens/ignore_eos")

    def alive(self, deployment: Deployment) -> bool:
        return not self._state(deployment).dead

    def scrape(self, deployment: Deployment) -> dict[str, str]:
        st = self._state(deployment)
        return {} if st.dead else {deployment.endpoint.metrics_urls[0]: st.metrics_text()}

    def teardown(self, deployment: Deployment) -> None:
        self.deployed.pop(deployment.key.slug, None)

    def cleanup(self, experiment: str, final: bool = False) -> int:
        # Nothing outlives the process that simulated it; a deployment left by a failed run of
        # this backend object is dropped.
        stale = [s for s, d in self.deployed.items() if d.key.experiment == experiment]
        for s in stale:
            del self.deployed[s]
        return len(stale)
