"""Live sessions against the real-time sim server on loopback: a later turn is sent only after
the previous reply arrived (plus its think time), is scheduled at that due time, and carries the
text the server returned; a session whose turn fails records its next turn as a miss."""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections.abc import Iterator

import pytest

from orchestrator.loadgen.schedules import think_time
from orchestrator.loadgen.sessions import run_sessions
from orchestrator.loadgen.workloads import RequestSpec, session_prefix_hit_rate
from orchestrator.plan import MODELS, gpu
from orchestrator.plan.workload import Workload
from orchestrator.sim.engine import ClusterSpec
from orchestrator.sim.model import WorkerModel
from orchestrator.sim.server import ServeConfig, start_sim_server

pytestmark = pytest.mark.timeout(60)
NAME = "Qwen/Qwen3-8B"
TURNS = 3
WORKLOAD = Workload.model_validate({
    "arrival": {"process": "poisson"},
    "sessions": {"think": {"mean_s": 0.05, "dist": "exponential"}},
    "prompts": {"input_tokens": {"mean": 60}, "shared_prefix": 0.25, "conversations": 1000, "turns": TURNS},
    "output_tokens": 8,
    "api": "chat",
})


@pytest.fixture
def server() -> Iterator[str]:
    h = start_sim_server(ServeConfig(ClusterSpec(workers=(WorkerModel(gpu=gpu("H200"), model=MODELS["qwen3-8b"]),)), NAME))
    try:
        yield h.url
    finally:
        h.stop()


def _blake(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def test_later_turns_wait_for_the_reply_and_carry_its_text(server: str) -> None:
    starts = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    sent: list[RequestSpec] = []
    summary = asyncio.run(run_sessions(server, NAME, WORKLOAD, starts, seed=3, duration_s=20.0, api="chat",
                                       request_timeout_s=10.0, keep_records=True, sent=sent))
    records = {r.request_id: r for r in summary.records or []}
    specs = {s.request_id: s for s in sent}
    assert len(records) == len(specs) == len(starts) * TURNS
    assert all(r.status == "ok" and r.output_tokens == 8 for r in records.values())
    t0 = records[0].scheduled_s
    for session in range(len(starts)):
        # A session's first turn is on the open-loop clock.
        assert records[session * TURNS].scheduled_s - t0 == pytest.approx(starts[session], abs=1e-6)
        for k in range(1, TURNS):
            prev, rec = records[session * TURNS + k - 1], records[session * TURNS + k]
            assert prev.last_token_s is not None and rec.sent_s is not None
            assert rec.conversation_id == prev.conversation_id == session and rec.turn == k
            think = think_time(WORKLOAD.sessions.think, 3, session, k)  # type: ignore[union-attr]
            # Due = reply arrived + think; sent no earlier than due; TTFT counts from due.
            assert rec.scheduled_s >= prev.last_token_s + think - 1e-6
            assert rec.scheduled_s - (prev.last_token_s + think) < 0.05
            assert rec.sent_s >= rec.scheduled_s - 1e-6
            assert rec.ttft_s == pytest.approx(rec.first_token_s - rec.scheduled_s)  # type: ignore[operator]
            # The history holds the server's own reply: its assistant message hashes to what
            # the client received for the previous turn (the sim's replies are random words).
            msgs = specs[rec.request_id].messages
            assistants = [c for role, c in msgs if role == "assistant"]
            assert len(assistants) == k
            assert _blake(" " + assistants[-1]) == prev.output_hash
            prev_spec = specs[prev.request_id]
            assert specs[rec.request_id].prompt.startswith(prev_spec.prompt + " " + assistants[-1])
    # Every turn is a distinct prompt beyond the shared prefix (the repeat guard's view), and
    # the server's cache hits stay within the bound the real history allows (and use it).
    assert len({r.prompt_hash for r in records.values()}) == len(records)
    served = sum(r.cached_tokens or 0 for r in records.values()) / sum(r.prompt_tokens for r in records.values())
    bound = session_prefix_hit_rate([specs[i] for i in sorted(specs)])
    assert 0 < served <= bound + 1e-9, (served, bound)


def test_a_failed_turn_ends_its_session_with_the_next_turn_a_miss() -> None:
    with socket.socket() as s:  # a port nothing listens on: every first turn fails to connect
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    summary = asyncio.run(run_sessions(url, NAME, WORKLOAD, [0.0, 0.05], seed=3, duration_s=5.0, api="chat",
                                       request_timeout_s=2.0, keep_records=True))
    recs = summary.records or []
    assert [(r.request_id, r.status) for r in recs] == [(0, "disconnect"), (1, "unsent"),
                                                       (3, "disconnect"), (4, "unsent")]
    assert all("session ended: turn 0 disconnect" in (r.error or "") for r in recs if r.status == "unsent")
