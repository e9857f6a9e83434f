"""Data files replayed as live sessions (issue 32, item 9): multi-turn ShareGPT and chat files
turn by turn, Mooncake traces by session id; malformed records named by line or element;
each later turn built from the live reply and due by the rule its data states (pure)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.errors import PlanError
from orchestrator.loadgen.session_scripts import SessionScript, point_sessions
from orchestrator.plan import plan_hash, validate_plan
from orchestrator.plan.sources import DataFileError, read_conversations, read_trace, trace_sessions

PLAN: dict[str, Any] = {
    "name": "data-sessions", "model": "qwen3-8b",
    "arms": {k: {"gpu": "H100-PCIe", "layout": "colocated", "replicas": 1} for k in ("A", "B")},
    "classes": ["standard"], "search": {"rate": {"min": 1, "max": 8}}, "backend": "sim",
}


def _sharegpt() -> list[dict]:
    """Three ShareGPT records: a system prompt and three human turns; one turn; no human turn."""
    return [
        {"id": "a1", "conversations": [
            {"from": "system", "value": "you are a terse helper"},
            {"from": "human", "value": "name three rivers"},
            {"from": "gpt", "value": "the nile the amazon the volga"},
            {"from": "human", "value": "which is longest"},
            {"from": "gpt", "value": "the nile"},
            {"from": "human", "value": "and the shortest of them"}]},
        {"id": "b2", "conversations": [{"from": "human", "value": "hello there"},
                                       {"from": "gpt", "value": "hi how can I help"}]},
        {"id": "c3", "conversations": [{"from": "gpt", "value": "an orphan reply"}]},
    ]


def _write_array(path: Path, rows: list[dict]) -> Path:
    path.write_text(json.dumps(rows, indent=1))
    return path


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _mooncake() -> list[dict]:
    """Two sessions of a multi-turn Mooncake trace (AIPerf's session_id and delay), interleaved,
    and a request of no session: each later turn's prompt holds the turn before and its reply."""
    return [
        {"session_id": "s1", "timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]},
        {"session_id": "s2", "timestamp": 200, "input_length": 300, "output_length": 10, "hash_ids": [1]},
        {"session_id": "s1", "timestamp": 3000, "input_length": 700, "output_length": 30, "hash_ids": [1, 2, 3]},
        {"timestamp": 3500, "input_length": 100, "output_length": 5, "hash_ids": [9]},
        {"session_id": "s2", "delay": 1500, "input_length": 400, "output_length": 12, "hash_ids": [1, 4]},
        {"session_id": "s1", "timestamp": 9000, "input_length": 800, "output_length": 8, "hash_ids": [1, 2, 3, 5]},
    ]


def test_a_multi_turn_sharegpt_array_is_read_turn_by_turn(tmp_path: Path) -> None:
    convs = read_conversations(_write_array(tmp_path / "sharegpt.json", _sharegpt()))
    assert len(convs) == 2  # the record with no human turn is skipped, as benchmarks do
    first = convs[0]
    assert first.at == "element 1"
    assert [t.messages for t in first.turns] == [
        (("system", "you are a terse helper"), ("user", "name three rivers")),
        (("user", "which is longest"),),
        (("user", "and the shortest of them"),)]
    # Each turn's reply length is the recorded reply's; the last has none recorded.
    assert [t.reply_tokens for t in first.turns] == [6, 2, None]
    assert [t.reply_tokens for t in convs[1].turns] == [5]


def test_a_chat_file_keeps_tool_and_greeting_messages_and_joins_consecutive_replies(tmp_path: Path) -> None:
    rows = [{"messages": [
        {"role": "assistant", "content": "welcome back"},
        {"role": "user", "content": "weather in oslo"},
        {"role": "assistant", "content": "calling the tool"},
        {"role": "assistant", "content": "one moment"},
        {"role": "tool", "content": "oslo 3 C rain"},
        {"role": "user", "content": "and tomorrow"}], "output_tokens": 40}]
    (conv,) = read_conversations(_write_jsonl(tmp_path / "chat.jsonl", rows))
    assert [t.messages for t in conv.turns] == [
        (("assistant", "welcome back"), ("user", "weather in oslo")),
        (("tool", "oslo 3 C rain"), ("user", "and tomorrow"))]
    # The two assistant messages are one reply (5 words); the line's output_tokens fills the last.
    assert [t.reply_tokens for t in conv.turns] == [5, 40]


@pytest.mark.parametrize(("text", "where"), [
    ('{"messages": [{"role": "user", "content": "a"}]}\n{"messages": [{"role": "user"}]}\n',
     "line 2: message 1 needs a string role and content"),
    ('{"messages": [{"role": "user", "content": "a"}]}\n{"messages": [\n', "line 2: not JSON"),
    ('[{"conversations": []}, {"conversations": [}]', "element 2: not JSON"),
    ('{"text": "no prompt here"}\n', "line 1: expected `prompt`, `messages` or ShareGPT `conversations`"),
])
def test_a_malformed_conversation_file_is_refused_at_its_record(tmp_path: Path, text: str, where: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(text)
    with pytest.raises(DataFileError, match=re.escape(where)):
        read_conversations(f)


def test_a_mooncake_trace_with_session_ids_is_grouped_into_sessions(tmp_path: Path) -> None:
    rows = read_trace(_write_jsonl(tmp_path / "trace.jsonl", _mooncake()), sessions=True)
    sessions = trace_sessions(rows)
    # In the order they start; the request of no session is a session of its own.
    assert [[r.input_tokens for r in s.turns] for s in sessions] == [[600, 700, 800], [300, 400], [100]]
    s1, s2, _ = sessions
    assert [r.t_s for r in s1.turns] == [0.0, 3.0, 9.0] and s1.turns[1].delay_s is None
    assert s2.turns[1].delay_s == 1.5 and s2.turns[1].t_s == pytest.approx(0.2 + 1.5)


@pytest.mark.parametrize(("row", "where"), [
    ({"session_id": "s9", "delay": 100, "input_length": 5, "output_length": 5}, "line 7: delay is the wait after"),
    ({"session_id": True, "timestamp": 9500, "input_length": 5, "output_length": 5}, "line 7: session_id must be"),
    ({"session_id": "s1", "delay": -1, "input_length": 5, "output_length": 5}, "line 7: delay must be a number"),
    ({"session_id": "s1", "timestamp": 100, "input_length": 5, "output_length": 5}, "line 7: timestamp 100 ms is earlier"),
])
def test_a_malformed_session_trace_is_refused_at_its_line(tmp_path: Path, row: dict, where: str) -> None:
    f = _write_jsonl(tmp_path / "trace.jsonl", [*_mooncake(), row])
    with pytest.raises(DataFileError, match=where):
        read_trace(f, sessions=True)


def test_a_delay_without_timestamp_is_a_sessions_only_record(tmp_path: Path) -> None:
    # Replayed as requests, every record arrives at its timestamp: a delay alone has none.
    f = _write_jsonl(tmp_path / "trace.jsonl", _mooncake())
    with pytest.raises(DataFileError, match="line 5: timestamp must be a number"):
        read_trace(f)


def _plan(path: Path, kind: str, **workload: Any):
    return validate_plan({**PLAN, "workload": {"source": {"kind": kind, "path": str(path)},
                                               "sessions": {}, **workload}})


def test_a_session_plan_over_a_file_takes_its_turns_and_counts_sessions_per_s(tmp_path: Path) -> None:
    plan = _plan(_write_array(tmp_path / "sharegpt.json", _sharegpt()), "prompts")
    w = plan.workload
    assert w.kind == "sessions" and w.rate_unit == "sessions/s"
    # Where the plan gives none, the file's: 2 conversations of 3 and 1 turns; first turns of
    # 5 + 3 words (the system prompt with the first user message) and 2; later turns of 3 and 5.
    assert w.prompts.turns == 2 and w.prompts.conversations == 2
    assert w.prompts.input_tokens.mean == pytest.approx((5 + 3 + 2) / 2)
    assert w.prompts.followup_tokens is not None and w.prompts.followup_tokens.mean == pytest.approx(4)
    assert w.output_tokens == round((6 + 2 + 5) / 3)
    trace = _plan(_write_jsonl(tmp_path / "trace.jsonl", _mooncake()), "trace")
    assert trace.workload.kind == "sessions" and trace.workload.prompts.turns == 2  # 3, 2, 1 turns
    assert plan_hash(plan) != plan_hash(_plan(tmp_path / "sharegpt.json", "prompts", api="chat"))


@pytest.mark.parametrize(("kind", "rows", "field", "says"), [
    ("prompts", [{"prompt": "one line"}, {"messages": [{"role": "user", "content": "x"}]}],
     "workload.source.path", "no conversation has a second user turn"),
    ("trace", [{"timestamp": 0, "input_length": 9, "output_length": 3}],
     "workload.source.path", "no session_id has a second turn"),
])
def test_a_file_with_no_sessions_is_refused_with_its_field_path(tmp_path: Path, kind: str, rows: list[dict],
                                                                field: str, says: str) -> None:
    with pytest.raises(PlanError) as e:
        _plan(_write_jsonl(tmp_path / "f.jsonl", rows), kind)
    assert any(p.path == field and says in p.message for p in e.value.plan_problems), e.value.plan_problems


def test_a_trace_session_plan_refuses_a_think_time(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as e:
        _plan(_write_jsonl(tmp_path / "trace.jsonl", _mooncake()), "trace", sessions={"think": {"mean_s": 1}})
    assert [p.path for p in e.value.plan_problems] == ["workload.sessions.think"]


def test_a_conversation_session_carries_the_live_reply_and_the_files_next_turn(tmp_path: Path) -> None:
    plan = _plan(_write_array(tmp_path / "sharegpt.json", _sharegpt()), "prompts", api="chat", output_tokens=9,
                 sessions={"think": {"mean_s": 0.5}})
    book = point_sessions(plan.workload, seed=7)
    assert book.stride == 3
    live = next(s for i in range(2) if (s := book.open(i)).turns == 3)
    t0 = live.first(0)
    assert t0.turn == 0 and t0.max_tokens == 6 and t0.history_tokens == 0
    (sys_role, sys_text), (user_role, user_text) = t0.messages
    # The nonce opens the first user message (after the shared system prompt).
    assert (sys_role, sys_text, user_role) == ("system", "you are a terse helper", "user")
    assert user_text.endswith("name three rivers") and len(user_text.split()) == 3 + 5
    t1 = live.after_reply("the  nile\nthe amazon", 1)
    assert t1.messages == (*t0.messages, ("assistant", "the nile the amazon"), ("user", "which is longest"))
    assert t1.history_tokens == t0.prompt_tokens + 4 and t1.prompt_tokens == t0.prompt_tokens + 4 + 3
    assert t1.prompt == " ".join(c for _, c in t1.messages) and t1.max_tokens == 2
    t2 = live.after_reply("it is", 2)
    assert t2.max_tokens == 9  # no recorded reply: the workload's
    # Due after the reply plus the plan's think time (fixed 0.5 s).
    assert live.due_s(1, prev_due_s=10.0, reply_end_s=12.0) == pytest.approx(12.5)
    # Other sessions differ by their nonce, also when the file is cycled.
    firsts = {book.open(i).first(i * 3).prompt_hash for i in range(6)}
    assert len(firsts) == 6


def test_a_trace_session_grows_by_the_recorded_new_tokens_and_keeps_its_pace(tmp_path: Path) -> None:
    plan = _plan(_write_jsonl(tmp_path / "trace.jsonl", _mooncake()), "trace")
    book = point_sessions(plan.workload, seed=3)
    s1 = book.open(0)
    t0 = s1.first(0)
    assert (t0.prompt_tokens, t0.max_tokens) == (600, 20)
    t1 = s1.after_reply(" ".join(["w"] * 20), 1)
    # 700 recorded minus the 600 before and its 20-token reply: 80 new words after the history.
    assert t1.history_tokens == 620 and t1.prompt_tokens == 700 and t1.max_tokens == 30
    assert t1.prompt.startswith(t0.prompt)
    # No delay: the recorded gap (3 s) after the turn before was due, never before the reply.
    assert s1.due_s(1, prev_due_s=100.0, reply_end_s=101.0) == pytest.approx(103.0)
    assert s1.due_s(1, prev_due_s=100.0, reply_end_s=105.0) == pytest.approx(105.0)
    # A stated delay is the wait after the reply.
    s2 = book.open(1)
    s2.first(3)
    assert s2.due_s(1, prev_due_s=100.0, reply_end_s=101.0) == pytest.approx(102.5)
    # Session starts: the trace's own, scaled so they come at the point's rate (3 sessions
    # starting at 0, 0.2 and 3.5 s: a natural 2/3.5 sessions/s), copies back to back.
    starts = book.starts(rate=2 / 3.5 * 2, duration_s=3.0)
    assert np.allclose(starts[:3], [0.0, 0.1, 1.75])
    assert book.open(3).first(9).prompt != book.open(0).first(0).prompt  # the next copy: its own blocks


def test_virtual_sessions_send_each_later_turn_after_the_reply_before_it(tmp_path: Path) -> None:
    """The engine's clock: every later turn of a replayed conversation is due after the
    reply before it has ended (plus the think time), and carries it."""
    from orchestrator.plan import MODELS, gpu
    from orchestrator.sim.engine import ClusterSpec, Windows, simulate_sessions
    from orchestrator.sim.model import WorkerModel

    plan = _plan(_write_array(tmp_path / "sharegpt.json", _sharegpt()), "prompts",
                 sessions={"think": {"mean_s": 0.25}})
    cluster = ClusterSpec(workers=(WorkerModel(gpu=gpu("H100-PCIe"), model=MODELS["qwen3-8b"]),))
    res = simulate_sessions(cluster, np.arange(8) * 0.5, SessionScript(plan.workload, 5), Windows(0, 30, 0), seed=5)
    recs = {(r.conversation_id, r.turn): r for r in res.records}
    later = [(recs[(c, t - 1)], r) for (c, t), r in recs.items() if t > 0]
    assert len(later) == 4 * 2  # 8 sessions, half of them the 3-turn conversation
    for prev, rec in later:
        assert prev.last_token_s is not None
        assert rec.scheduled_s == pytest.approx(prev.last_token_s + 0.25)
        assert rec.prompt_tokens > prev.prompt_tokens + (prev.output_tokens or 0)


@pytest.mark.parametrize(("kind", "name", "turns"), [("prompts", "sharegpt_sessions.json", 3),
                                                     ("trace", "mooncake_sessions.jsonl", 2)])
def test_the_sample_session_files_load_as_the_readme_shows(kind: str, name: str, turns: int) -> None:
    from tests.unit.test_workload_closed import ROOT

    plan = _plan(ROOT / "examples" / "data" / name, kind)
    w = plan.workload
    assert w.kind == "sessions" and w.prompts.turns == turns and w.prompts.conversations > 30
    book = point_sessions(w, seed=1)
    assert book.stride > turns and len(book.starts(rate=1.0, duration_s=30.0)) > 10


def test_a_registered_session_plan_reads_back_without_its_file(tmp_path: Path) -> None:
    """`orch status`, `orch report` and `orch verdict` read the registered plan on machines that
    may not have the data file: the pinned plan parses as it was registered."""
    from orchestrator.plan import canonical_json, plan_from_canonical

    f = _write_array(tmp_path / "sharegpt.json", _sharegpt())
    plan = _plan(f, "prompts")
    f.unlink()
    back = plan_from_canonical(canonical_json(plan))
    assert plan_hash(back) == plan_hash(plan) and back.workload.prompts.turns == 2
