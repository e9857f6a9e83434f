"""Data files replayed as live sessions through `orch run --backend virtual` (issue 32, items 9
and 8), from a plan file as a user runs it: a multi-turn ShareGPT array and a Mooncake trace
with session ids, each later turn sent only after the reply before it (exact: virtual time), and
every place a point's rate is shown saying sessions/s (the live lines, the summary, the status
of a running experiment, the report)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.plan import load_plan_file
from orchestrator.plan.sources import read_trace, trace_sessions
from orchestrator.store import Store
from tests.e2e.helpers import orch_here

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("no_sockets")]

WORDS = ("river", "city", "train", "code", "bug", "test", "plan", "table", "query", "index", "cache", "model",
         "token", "reply", "user", "time", "north", "light", "paper", "green")


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def sharegpt_file(path: Path, conversations: int = 30, seed: int = 3) -> Path:
    """A ShareGPT-shaped JSON array: 1 to 4 human turns each, every one answered by gpt."""
    rng = random.Random(seed)
    rows = []
    for i in range(conversations):
        turns: list[dict[str, str]] = []
        for _ in range(rng.randint(1, 4)):
            turns.append({"from": "human", "value": _text(rng, rng.randint(20, 120))})
            turns.append({"from": "gpt", "value": _text(rng, rng.randint(8, 40))})
        rows.append({"id": f"conv-{i}", "conversations": turns})
    path.write_text(json.dumps(rows, indent=1))
    return path


def mooncake_file(path: Path, sessions: int = 24, seed: int = 4) -> Path:
    """A Mooncake trace with AIPerf's session ids: each session's later turns hold its history
    (input_length grows by the reply and new words, hash_ids extend the earlier ones); every
    other session states its users' `delay`, the rest only their turns' timestamps."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for s in range(sessions):
        t, ids, length = s * 400.0 + rng.uniform(0, 300), [1000 * s], 300 + rng.randint(0, 300)
        for k in range(rng.randint(1, 3)):
            out = rng.randint(10, 30)
            row: dict[str, Any] = {"session_id": f"chat-{s}", "input_length": length, "output_length": out,
                                   "hash_ids": list(ids)}
            if k and s % 2:  # an odd session's users state their waits
                row["delay"] = rng.randint(200, 800)
            else:
                row["timestamp"] = round(t)
            rows.append(row)
            t += rng.uniform(1500, 3000)
            length += out + rng.randint(40, 120)
            ids.append(1000 * s + k + 1)
    # File order: by arrival, each delay-only turn after its session's first (its only timed) one.
    out_rows: list[dict[str, Any]] = []
    for r in sorted((r for r in rows if "timestamp" in r), key=lambda r: r["timestamp"]):
        out_rows.append(r)
        out_rows.extend(x for x in rows if "delay" in x and x["session_id"] == r["session_id"])
    path.write_text("".join(json.dumps(r) + "\n" for r in out_rows))
    return path


def _plan(tmp_path: Path, source: dict, sessions: dict) -> Path:
    plan = {
        "name": f"data-sessions-{source['kind']}", "model": "qwen3-8b",
        "arms": {k: {"gpu": "H100-PCIe", "layout": "colocated", "replicas": 1,
                     "engine": {"max_num_seqs": 32, "max_num_batched_tokens": 2048}} for k in ("A", "B")},
        "workload": {"sessions": sessions, "source": source, "api": "chat"},
        "classes": ["standard"],
        "search": {"rate": {"min": 0.25, "max": 4}, "precision": 0.25, "point_s": 4, "warmup_s": 0.5,
                   "cooldown_s": 0, "max_points": 2, "use_prior": False},
        "bars": [{"id": "attainment-at-1", "metric": "attainment_at", "class": "standard", "rate": 1,
                  "compare": "B/A", "at_least": 0.9}],
        "design": {"blocks": 1, "order": "ABBA", "seed": 9},
        "backend": "sim",
    }
    f = tmp_path / "plan.yaml"
    f.write_text(yaml.safe_dump(plan))
    return f


def _run(tmp_path: Path, plan_file: Path, monkeypatch, capsys) -> tuple[Store, str, str]:
    monkeypatch.chdir(tmp_path)
    env = {"ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}", "ORCH_STATE_DIR": str(tmp_path / "state"),
           "ORCH_SKIP_CALIBRATION": "1"}
    code, out, err = orch_here("run", str(plan_file), "--backend", "virtual", "--allow-low-power", env=env,
                               monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err[-3000:]
    return Store.open(env["ORCH_DATABASE_URL"]), out, err


def _later_turns(store: Store, pid: int) -> list[tuple[Any, Any]]:
    recs = {(r.conversation_id, r.turn): r for r in store.requests(pid)}
    return [(recs[(c, t - 1)], r) for (c, t), r in recs.items() if t > 0]


def test_a_multi_turn_sharegpt_file_is_replayed_as_sessions(tmp_path: Path, monkeypatch, capsys) -> None:
    data = sharegpt_file(tmp_path / "sharegpt.json")
    plan_file = _plan(tmp_path, {"kind": "prompts", "path": data.name}, {"think": {"mean_s": 0.3}})
    store, out, err = _run(tmp_path, plan_file, monkeypatch, capsys)
    try:
        (exp,) = store.list_experiments()
        runs = store.runs(exp.id)
        assert len(runs) == 2 and all(r.status == "done" for r in runs), [r.invalid_reason for r in runs]
        reached = 0
        for r in runs:
            for _, pt in store.points(r.id).iterrows():
                loop = pt.context["loop"]
                assert loop["kind"] == "sessions" and loop["sessions_per_s"] == pt.offered_rate
                later = _later_turns(store, int(pt.id))
                for prev, rec in later:
                    # Due when the reply before it ended plus the plan's think time, and
                    # longer by that reply and the file's next user turn.
                    assert rec.scheduled_s == pytest.approx(prev.last_token_s + 0.3)
                    assert rec.prompt_tokens >= prev.prompt_tokens + prev.output_tokens + 20
                    assert rec.turn <= 3  # the file has at most 4 turns a conversation
                reached = max([reached, *(rec.turn for _, rec in later)])
        assert reached >= 2  # sessions went past their second turn
        # Item 8: the points' lines, the verdict at its rate and the report say sessions/s.
        assert "sessions/s" in err and "req/s" not in err, err
        assert "attainment_at at 1 sessions/s" in out and "req/s" not in out, out
        code, _, rerr = orch_here("report", exp.name, "--out", str(tmp_path / "report"), env={},
                                  monkeypatch=monkeypatch, capsys=capsys)
        assert code == 0, rerr
        page = (tmp_path / "report" / "index.html").read_text()
        assert "at 1.0 sessions/s" in page and "<th>at, sessions/s</th>" in page and "req/s" not in page
        assert "<th>rate, sessions/s</th>" in page  # the report's Pareto table of this workload
        # History's Pareto table and the dry run name the unit too.
        code, pout, _ = orch_here("capacity", "--pareto", env={"COLUMNS": "250"}, monkeypatch=monkeypatch,
                                  capsys=capsys)
        assert code == 0 and "sessions/s" in pout and "req/s" not in pout, pout
        code, sout, serr = orch_here("plan", "simulate", str(plan_file), "--replications", "3", env={},
                                     monkeypatch=monkeypatch, capsys=capsys)
        assert code == 0, serr
        assert "tok/s at" in sout and "sessions/s" in sout and "req/s" not in sout, sout
    finally:
        store.close()


def test_status_names_a_running_session_point_in_sessions_per_s(tmp_path: Path, sqlite_url: str) -> None:
    from orchestrator.control.progress import stored_progress

    data = sharegpt_file(tmp_path / "sharegpt.json")
    plan = load_plan_file(_plan(tmp_path, {"kind": "prompts", "path": str(data)}, {}))
    with Store.open(sqlite_url) as st:
        exp = st.create_experiment(st.register_plan(plan).id, name="watched")
        st.set_experiment_status(exp, "running")
        b = st.start_run(exp, "B", 0, 1, 0, st.deployment_config(plan, "B"))
        st.record_point(b, seq=0, window_start_s=0, window_end_s=1, offered_rate=1.5,
                        per_class={"standard": {"attainment": 0.9}})
        st.record_point(b, seq=1, window_start_s=1, window_end_s=2, offered_rate=3.0)  # records not in yet
        p = stored_progress(st, "watched")
    assert p.current == "block 0 arm B: 2 point(s), measuring 3 sessions/s, last 1.5 sessions/s: attainment standard 0.90"


def test_a_mooncake_trace_with_session_ids_is_replayed_at_its_own_pace(tmp_path: Path, monkeypatch, capsys) -> None:
    data = mooncake_file(tmp_path / "mooncake.jsonl")
    sessions = trace_sessions(read_trace(data, sessions=True))
    assert any(len(s.turns) > 1 and s.turns[1].delay_s is not None for s in sessions)
    plan_file = _plan(tmp_path, {"kind": "trace", "path": data.name, "block_tokens": 64}, {})
    store, out, _ = _run(tmp_path, plan_file, monkeypatch, capsys)
    try:
        (exp,) = store.list_experiments()
        n = len(sessions)
        checked = 0
        for r in store.runs(exp.id):
            for _, pt in store.points(r.id).iterrows():
                for prev, rec in _later_turns(store, int(pt.id)):
                    row = sessions[rec.conversation_id % n].turns[rec.turn]
                    before = sessions[rec.conversation_id % n].turns[rec.turn - 1]
                    if row.delay_s is not None:  # the user's stated wait after the reply
                        want = prev.last_token_s + row.delay_s
                    else:  # the trace's own gap, never before the reply
                        want = max(prev.last_token_s, prev.scheduled_s + row.t_s - before.t_s)
                    assert rec.scheduled_s == pytest.approx(want, abs=1e-6)
                    assert rec.prompt_tokens == row.input_tokens and rec.output_tokens_asked == row.output_tokens
                    checked += 1
        assert checked > 0
        assert "attainment_at at 1 sessions/s" in out
    finally:
        store.close()
