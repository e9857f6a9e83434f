"""A point's live sessions, turn by turn (pure): synthetic, a prompts file's conversations, or a
multi-turn trace's sessions. The live runner (``loadgen.sessions``) and the virtual-time engine
(``SessionScript``) both play them through ``PointSessions``: when session ``i`` starts, its
first request, each later request once the reply before it is in (its text carried in the
history), and when that later turn is due.

A prompts file's conversation is a session started on the arrival clock: turn k+1's prompt is
turn k's, the reply the server returned, and the file's next user turn (with any system or
tool message before it); its reply length is the file's recorded reply (else the line's
``output_tokens``, else the workload's). A 5-word nonce opens the first user message, so every
session is unique (cycling the file included) and its later turns share its whole history.

A trace's session starts at its first record's time (the sessions' starts scaled so their mean
rate is the point's sessions/s, as a trace's arrivals are for requests); a later turn adds
``input_length`` minus the turn before's prompt and reply (at least one word) as new words.
When a later turn is due (chosen here, DESIGN 7's clock): after the reply before it plus its
``delay`` where the record states one (AIPerf's meaning of it: the user's wait); otherwise at
its own recorded gap after the turn before was due, unscaled (the pace of one user is the
trace's, only how many users arrive scales with the rate), but never before that reply.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol

import numpy as np

from orchestrator.loadgen.datasets import _nonce, scaled_times, trace_request, verified
from orchestrator.loadgen.schedules import derive_seed, open_loop_offsets, think_time
from orchestrator.loadgen.workloads import (
    _VOCAB_ARR,
    VOCAB,
    LiveSession,
    RequestSpec,
    _hash,
    _words,
    shared_prefix_words,
)
from orchestrator.plan.sources import (
    Conversation,
    TraceSession,
    read_conversations,
    read_trace,
    trace_sessions,
)
from orchestrator.plan.workload import ThinkTime, Workload


class SessionTurns(Protocol):
    """One session's turns, built as its replies arrive."""

    @property
    def turns(self) -> int: ...
    def first(self, request_id: int) -> RequestSpec: ...
    def after_reply(self, reply_text: str, request_id: int) -> RequestSpec: ...
    def due_s(self, turn: int, prev_due_s: float, reply_end_s: float) -> float: ...


class PointSessions(Protocol):
    """A point's sessions: ``stride`` spaces the request ids (request ``session * stride + turn``)."""

    @property
    def stride(self) -> int: ...
    def starts(self, rate: float, duration_s: float) -> np.ndarray: ...
    def open(self, session: int) -> SessionTurns: ...


def point_sessions(workload: Workload, seed: int) -> PointSessions:
    """The sessions a workload plays at a point of this seed."""
    if workload.sessions is None:
        raise ValueError("the workload has no `sessions`")
    if workload.source is None:
        return _SyntheticSessions(workload, seed)
    if workload.source.kind == "trace":
        return _TraceSessions(workload, seed)
    return _FileSessions(workload, seed)


class _ThinkAfterReply:
    """Due when the reply before has arrived plus the workload's think time."""

    think: ThinkTime
    seed: int
    session: int

    def due_s(self, turn: int, prev_due_s: float, reply_end_s: float) -> float:
        return reply_end_s + think_time(self.think, self.seed, self.session, turn)


class _SyntheticTurns(_ThinkAfterReply):
    def __init__(self, live: LiveSession, turns: int, think: ThinkTime, seed: int, session: int):
        self.live, self.turns, self.think, self.seed, self.session = live, turns, think, seed, session

    def first(self, request_id: int) -> RequestSpec:
        return self.live.first(request_id)

    def after_reply(self, reply_text: str, request_id: int) -> RequestSpec:
        return self.live.after_reply(reply_text, request_id)


class _OnTheClock:
    """Sessions started on the workload's arrival clock."""

    workload: Workload
    seed: int

    def starts(self, rate: float, duration_s: float) -> np.ndarray:
        assert self.workload.arrival is not None  # sessions start on the clock
        return open_loop_offsets(self.workload.arrival, rate, duration_s, self.seed)


class _SyntheticSessions(_OnTheClock):
    def __init__(self, workload: Workload, seed: int):
        assert workload.sessions is not None
        self.workload, self.seed, self.stride = workload, seed, workload.prompts.turns
        self.think = workload.sessions.think
        self.prefix = shared_prefix_words(workload, seed)

    def open(self, session: int) -> SessionTurns:
        live = LiveSession(self.workload, session, self.seed, self.prefix)
        return _SyntheticTurns(live, self.stride, self.think, self.seed, session)


@lru_cache(maxsize=8)
def _conversations(path: str, sha256: str) -> tuple[Conversation, ...]:
    return tuple(read_conversations(path))


@lru_cache(maxsize=8)
def _trace_sessions(path: str, sha256: str) -> tuple[TraceSession, ...]:
    return tuple(trace_sessions(read_trace(path, sessions=True)))


def _clean(text: str) -> str:
    return " ".join(text.split())


class _History:
    """A session's messages so far, as one request."""

    def __init__(self, workload: Workload, session: int):
        self.workload, self.session = workload, session
        self.messages: list[tuple[str, str]] = []
        self.words = 0

    def add(self, role: str, text: str) -> None:
        text = _clean(text)
        self.messages.append((role, text))
        self.words += len(text.split())

    def spec(self, request_id: int, turn: int, max_tokens: int, history_tokens: int) -> RequestSpec:
        words = [w for _, c in self.messages for w in c.split()]
        chat = self.workload.api == "chat"
        return RequestSpec(request_id=request_id, conversation_id=self.session, turn=turn, prompt=" ".join(words),
                           prompt_tokens=len(words), shared_prefix_tokens=0, max_tokens=max_tokens,
                           prompt_hash=_hash(words), messages=tuple(self.messages) if chat else (),
                           history_tokens=history_tokens)


class _ConversationTurns(_ThinkAfterReply):
    def __init__(self, conv: Conversation, workload: Workload, seed: int, session: int):
        assert workload.sessions is not None
        self.conv, self.workload, self.seed, self.session = conv, workload, seed, session
        self.think, self.turns, self.k = workload.sessions.think, len(conv.turns), 0
        self.history = _History(workload, session)

    def _reply_len(self) -> int:
        return self.conv.turns[self.k].reply_tokens or self.workload.output_tokens

    def first(self, request_id: int) -> RequestSpec:
        msgs = list(self.conv.turns[0].messages)
        j = next((n for n, (role, _) in enumerate(msgs) if role != "system"), 0)
        msgs[j] = (msgs[j][0], " ".join([*_nonce(self.session, self.seed), msgs[j][1]]))
        for role, text in msgs:
            self.history.add(role, text)
        return self.history.spec(request_id, 0, self._reply_len(), 0)

    def after_reply(self, reply_text: str, request_id: int) -> RequestSpec:
        self.history.add("assistant", reply_text)
        seen = self.history.words  # the turn before's prompt and its reply: the server has seen them
        self.k += 1
        for role, text in self.conv.turns[self.k].messages:
            self.history.add(role, text)
        return self.history.spec(request_id, self.k, self._reply_len(), seen)


class _FileSessions(_OnTheClock):
    """A prompts file's conversations, taken in an order drawn from the seed (cycling)."""

    def __init__(self, workload: Workload, seed: int):
        src = workload.source
        assert src is not None
        self.workload, self.seed = workload, seed
        self.convs = _conversations(src.path, verified(src))
        self.stride = max(len(c.turns) for c in self.convs)
        self._orders: dict[int, np.ndarray] = {}

    def open(self, session: int) -> SessionTurns:
        cycle, k = divmod(session, len(self.convs))
        order = self._orders.get(cycle)
        if order is None:
            rng = np.random.default_rng(derive_seed(self.seed, "session-order", cycle))
            order = self._orders[cycle] = rng.permutation(len(self.convs))
        return _ConversationTurns(self.convs[int(order[k])], self.workload, self.seed, session)


class _TraceTurns:
    def __init__(self, sess: TraceSession, copy: int, workload: Workload, seed: int, session: int):
        assert workload.source is not None
        self.rows, self.copy, self.workload, self.seed, self.session = sess.turns, copy, workload, seed, session
        self.turns, self.k = len(sess.turns), 0
        self.history = _History(workload, session)

    def first(self, request_id: int) -> RequestSpec:
        assert self.workload.source is not None
        spec = trace_request(self.rows[0], request_id, self.copy, self.seed, self.workload.source.block_tokens,
                             self.workload)
        self.history.add("user", spec.prompt)
        return self.history.spec(request_id, 0, spec.max_tokens, 0)

    def after_reply(self, reply_text: str, request_id: int) -> RequestSpec:
        self.history.add("assistant", reply_text)
        seen = self.history.words
        before, row = self.rows[self.k], self.rows[self.k + 1]
        self.k += 1
        new = max(1, row.input_tokens - before.input_tokens - before.output_tokens)
        rng = np.random.default_rng(derive_seed(self.seed, "trace-turn", self.copy, self.session, self.k))
        self.history.add("user", " ".join(_words(rng, new)))
        return self.history.spec(request_id, self.k, row.output_tokens, seen)

    def due_s(self, turn: int, prev_due_s: float, reply_end_s: float) -> float:
        row = self.rows[turn]
        if row.delay_s is not None:
            return reply_end_s + row.delay_s
        return max(reply_end_s, prev_due_s + (row.t_s - self.rows[turn - 1].t_s))


class _TraceSessions:
    """A trace's sessions, started at their own (scaled) times; copies of the trace follow each
    other when the point outlasts it (session ``i`` is session ``i mod n`` of copy ``i // n``)."""

    def __init__(self, workload: Workload, seed: int):
        src = workload.source
        assert src is not None
        self.workload, self.seed = workload, seed
        self.sessions = _trace_sessions(src.path, verified(src))
        self.stride = max(len(s.turns) for s in self.sessions)

    def starts(self, rate: float, duration_s: float) -> np.ndarray:
        offs, _, _ = scaled_times(np.array([s.turns[0].t_s for s in self.sessions]), rate, duration_s)
        return offs

    def open(self, session: int) -> SessionTurns:
        copy, row = divmod(session, len(self.sessions))
        return _TraceTurns(self.sessions[row], copy, self.workload, self.seed, session)


class SessionScript:
    """Live sessions played without a server (virtual time, ``sim.engine.simulate_sessions``):
    the turns ``loadgen.sessions.run_sessions`` builds, request ``session * stride + turn``,
    each later turn carrying a reply of the length the server returned, its words drawn from
    (seed, request) alone (a simulated reply has no text of its own)."""

    def __init__(self, workload: Workload, seed: int):
        self.sessions = point_sessions(workload, seed)
        self.seed = seed
        self._live: dict[int, SessionTurns] = {}

    def turns_of(self, session: int) -> int:
        live = self._live.get(session)
        if live is None:
            live = self._live[session] = self.sessions.open(session)
        return live.turns

    def request(self, session: int, turn: int, reply_tokens: int) -> RequestSpec:
        """Turn ``turn`` of ``session``, after a reply of ``reply_tokens`` to the one before."""
        rid = session * self.sessions.stride + turn
        if turn == 0:
            live = self._live[session] = self.sessions.open(session)
            return live.first(rid)
        live = self._live[session]
        return live.after_reply(self.reply_text(rid - 1, reply_tokens), rid)

    def due_s(self, session: int, turn: int, prev_due_s: float, reply_end_s: float) -> float:
        """When ``turn`` is due, the one before having been due at ``prev_due_s`` and its reply
        ended at ``reply_end_s``."""
        return self._live[session].due_s(turn, prev_due_s, reply_end_s)

    def done(self, session: int) -> None:
        """The session has no further turn: its history is freed."""
        self._live.pop(session, None)

    def reply_text(self, request_id: int, n: int) -> str:
        rng = np.random.default_rng(derive_seed(self.seed, "virtual-reply", request_id))
        return " ".join(_VOCAB_ARR[rng.integers(0, len(VOCAB), max(0, n))].tolist())

