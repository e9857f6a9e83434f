"""A workload's own data: prompts files (completion, chat, ShareGPT) and traces (Mooncake
shape), pinned by sha256 in the registered plan, turned into requests and arrivals (pure)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from orchestrator.errors import PlanError
from orchestrator.loadgen.datasets import (
    content_prefix_hit_rate,
    point_load,
    requests_iter,
    trace_offsets,
    verified,
)
from orchestrator.plan import plan_hash, validate_plan
from orchestrator.plan.sources import DataFileError, read_prompts, read_trace
from tests.unit.test_workload_closed import ROOT

DATA = ROOT / "examples" / "data"
PLAN = {
    "name": "data", "model": "qwen3-8b",
    "arms": {k: {"gpu": "H100-PCIe", "layout": "colocated", "replicas": 1} for k in ("A", "B")},
    "classes": ["standard"], "search": {"rate": {"min": 1, "max": 8}}, "backend": "sim",
}


def _plan(tmp_path: Path, kind: str, lines: list[dict] | None = None, **workload):
    f = tmp_path / f"{kind}.jsonl"
    if lines is None:
        shutil.copy(DATA / f"{kind}.jsonl", f)
    else:
        f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return validate_plan({**PLAN, "workload": {"source": {"kind": kind, "path": str(f)}, **workload}}), f


def test_the_sample_files_are_what_the_project_script_makes(tmp_path: Path) -> None:
    import runpy

    gen = runpy.run_path(str(DATA / "make_samples.py"))
    import random

    for name, rows in (("prompts", gen["prompts"](random.Random(19))), ("trace", gen["trace"](random.Random(20)))):
        gen["write"](tmp_path / f"{name}.jsonl", rows)
        assert (tmp_path / f"{name}.jsonl").read_bytes() == (DATA / f"{name}.jsonl").read_bytes(), name
    gen["write_array"](tmp_path / "sharegpt_sessions.json", gen["sessions"](random.Random(21)))
    gen["write"](tmp_path / "mooncake_sessions.jsonl", gen["trace_sessions"](random.Random(22)))
    for name in ("sharegpt_sessions.json", "mooncake_sessions.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name


def test_sha256_is_pinned_and_a_changed_file_is_a_changed_plan(tmp_path: Path) -> None:
    plan, f = _plan(tmp_path, "prompts")
    src = plan.workload.source
    assert src is not None and src.sha256 is not None and len(src.sha256) == 64
    assert plan.workload.prompts.conversations == 60 and plan.workload.output_tokens > 1  # from the file
    before = plan_hash(plan)
    assert verified(src) == src.sha256
    f.write_text(f.read_text() + json.dumps({"prompt": "one more line"}) + "\n")
    assert plan_hash(_plan_again(plan, f)) != before
    with pytest.raises(DataFileError, match="changed since the plan was registered"):
        verified(src)  # the registered plan's run refuses the edited file


def _plan_again(plan, f: Path):
    data = plan.model_dump(mode="json", by_alias=True)
    data["workload"]["source"] = {"kind": "prompts", "path": str(f)}
    return validate_plan(data)


def test_a_missing_or_broken_file_is_refused_at_its_field(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as e:
        validate_plan({**PLAN, "workload": {"source": {"kind": "trace", "path": str(tmp_path / "nope.jsonl")}}})
    assert [p.path for p in e.value.plan_problems] == ["workload.source.path"]
    assert "no such file" in str(e.value.plan_problems[0])
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(PlanError) as e:
        validate_plan({**PLAN, "workload": {"source": {"kind": "prompts", "path": str(tmp_path / "bad.jsonl")}}})
    assert "line 2: not JSON" in str(e.value.plan_problems[0])


def test_prompt_formats_completion_chat_and_sharegpt(tmp_path: Path) -> None:
    lines = [
        {"prompt": "alpha beta gamma", "output_tokens": 7},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]},
        {"conversations": [{"from": "system", "value": "sys"}, {"from": "human", "value": "q one two"},
                           {"from": "gpt", "value": "a b c d e f"}, {"from": "human", "value": "later"}]},
        {"conversations": [{"from": "gpt", "value": "no human turn"}]},  # skipped
    ]
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    got = read_prompts(f)
    assert [(e.prompt, e.output_tokens) for e in got] == [
        ("alpha beta gamma", 7), ("be brief hello there", None), ("sys q one two", 6)]
    assert got[2].messages == (("system", "sys"), ("user", "q one two"))


def test_prompt_requests_keep_the_files_sharing_and_never_repeat(tmp_path: Path) -> None:
    system = " ".join(f"s{i}" for i in range(40))
    lines = [{"prompt": f"{system} " + " ".join(f"u{k}x{i}" for i in range(30))} for k in range(4)]
    lines.append({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "solo question"}]})
    plan, _ = _plan(tmp_path, "prompts", lines, output_tokens=9, api="chat")
    it = requests_iter(plan.workload, 3)
    reqs = [next(it) for _ in range(15)]  # the file three times over
    assert len({r.prompt_hash for r in reqs}) == 15
    for r in reqs:
        assert r.prompt.startswith(system + " ")  # the shared system prompt is kept whole
        assert r.max_tokens == 9
    chat = [r for r in reqs if r.messages and r.messages[0][0] == "system"]
    assert chat and all(r.messages[0] == ("system", system) for r in chat)
    # A second point (another seed) sends the same lines with other nonces: what it shares
    # with the first is the file's shared part only (the system prompt), never a whole line.
    others = [next(it) for it in [requests_iter(plan.workload, 4)] for _ in range(5)]
    nonces = {tuple(r.prompt.split()[40:45]) for r in reqs}
    assert all(tuple(r.prompt.split()[40:45]) not in nonces for r in others)


def test_trace_arrivals_are_the_traces_own_pattern_scaled_to_the_rate(tmp_path: Path) -> None:
    trace = read_trace(DATA / "trace.jsonl")
    t = np.array([r.t_s for r in trace])
    natural = (len(t) - 1) / t[-1]
    offs, rows, copies = trace_offsets(trace, 2 * natural, 10.0)
    # Same gaps as the trace, half as long; rows in the trace's order.
    n = min(len(offs), len(t))
    assert np.allclose(offs[:n], t[:n] / 2)
    assert list(rows[:n]) == list(range(n)) and set(copies[:n]) == {0}
    # A point longer than the scaled trace plays it again, back to back.
    offs, rows, copies = trace_offsets(trace, natural / 4, 300.0)
    assert copies.max() >= 1 and np.all(np.diff(offs) >= 0) and offs.max() < 300.0
    assert abs(len(offs) / 300.0 - natural / 4) / (natural / 4) < 0.1


def test_trace_requests_share_exactly_their_common_hash_ids(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 1200, "output_length": 5, "hash_ids": [1, 2, 3]},
        {"timestamp": 100, "input_length": 1100, "output_length": 6, "hash_ids": [1, 2, 9]},
        {"timestamp": 250, "input_length": 700, "output_length": 7, "hash_ids": [4, 5]},
    ]
    plan, _ = _plan(tmp_path, "trace", rows)
    assert plan.workload.output_tokens == 6  # the trace's mean
    offs, reqs = point_load(plan.workload, 8.0, 1.0, seed=5)
    a, b, c = reqs[:3]
    assert [r.prompt_tokens for r in (a, b, c)] == [1200, 1100, 700]
    assert [r.max_tokens for r in (a, b, c)] == [5, 6, 7]  # output lengths from the trace
    wa, wb, wc = a.prompt.split(), b.prompt.split(), c.prompt.split()
    assert wa[:1024] == wb[:1024] and wa[1024:1100] != wb[1024:1100]  # blocks 1 and 2 shared
    assert wa[:16] != wc[:16]
    assert len({r.prompt_hash for r in reqs}) == len(reqs)
    rate = content_prefix_hit_rate(reqs[:3])
    assert rate == pytest.approx(1024 / 3000)  # b reuses a's two blocks, nothing else


def test_a_sharegpt_json_array_is_read_as_the_jsonl_lines_are(tmp_path: Path) -> None:
    """Issue 32: ShareGPT ships one JSON array of conversations, not JSONL; it reads the same,
    and a bad element is named by its number."""
    convs = [{"id": "a", "conversations": [{"from": "human", "value": "q one two"}, {"from": "gpt", "value": "r s t"}]},
             {"id": "b", "conversations": [{"from": "gpt", "value": "no human turn"}]},  # skipped
             {"id": "c", "conversations": [{"from": "human", "value": "second question"}]}]
    arr, jsonl = tmp_path / "sharegpt.json", tmp_path / "sharegpt.jsonl"
    arr.write_text(json.dumps(convs, indent=2))
    jsonl.write_text("".join(json.dumps(c) + "\n" for c in convs))
    assert read_prompts(arr) == read_prompts(jsonl)
    assert [(e.prompt, e.output_tokens) for e in read_prompts(arr)] == [("q one two", 3), ("second question", None)]
    plan = validate_plan({**PLAN, "workload": {"source": {"kind": "prompts", "path": str(arr)}}})
    assert plan.workload.prompts.conversations == 2
    (tmp_path / "bad.json").write_text(json.dumps([convs[0], 7]))
    with pytest.raises(DataFileError, match="element 2: expected a JSON object"):
        read_prompts(tmp_path / "bad.json")
    (tmp_path / "open.json").write_text(json.dumps(convs)[:-1])
    with pytest.raises(DataFileError, match="not closed"):
        read_prompts(tmp_path / "open.json")


def test_a_trace_whose_timestamps_go_back_is_refused_at_the_line(tmp_path: Path) -> None:
    """Issue 32: a trace is replayed in its own order; sorting one silently replays another."""
    rows = [{"timestamp": 0, "input_length": 10, "output_length": 5},
            {"timestamp": 300, "input_length": 10, "output_length": 5},
            {"timestamp": 100, "input_length": 10, "output_length": 5}]
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataFileError, match="line 3: timestamp 100 ms is earlier than line 2's 300 ms"):
        read_trace(f)
    f.write_text("".join(json.dumps(r) + "\n" for r in sorted(rows, key=lambda r: r["timestamp"])))
    assert [t.t_s for t in read_trace(f)] == [0.0, 0.1, 0.3]
