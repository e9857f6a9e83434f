"""Exact token counts (issue 19 item 4): the record keeps the server's usage.prompt_tokens, and
the prompt-length guard judges it against the length the workload asked for."""

from __future__ import annotations

import pytest

from orchestrator.analysis.guards import prompt_length
from orchestrator.loadgen.client import Clock, _StreamState
from orchestrator.plan.experiment import GuardThresholds
from orchestrator.plan.loading import canonical_json, plan_from_canonical, plan_hash, validate_plan
from orchestrator.records import RequestRecord

TH = GuardThresholds()


def rec(i: int, asked: int = 500, server: int | None = 500, phase: str = "measure") -> RequestRecord:
    return RequestRecord(request_id=i, conversation_id=i, turn=0, phase=phase, scheduled_s=float(i),
                         sent_s=i + 0.001, first_token_s=i + 0.2, last_token_s=i + 1.0, prompt_tokens=asked,
                         output_tokens_asked=10, output_tokens=10, status="ok", server_prompt_tokens=server)


def test_the_tolerance_is_a_registered_guard_threshold_with_a_5_percent_default() -> None:
    assert TH.prompt_length_tolerance == 0.05
    assert GuardThresholds(prompt_length_tolerance=0.2).prompt_length_tolerance == 0.2
    with pytest.raises(ValueError):
        GuardThresholds(prompt_length_tolerance=-0.1)
    assert "prompt_length_tolerance" in GuardThresholds.model_json_schema()["properties"]


def test_prompts_within_the_tolerance_pass() -> None:
    # one BOS token more than asked (0.2%), and a few odd requests: the median is judged
    recs = [rec(i, 500, 501) for i in range(18)] + [rec(18, 500, 900), rec(19, 500, 100)]
    g = prompt_length(recs, TH)
    assert g.passed and g.name == "prompt_length"
    assert g.value == pytest.approx(0.002) and g.threshold == 0.05
    assert "2 beyond the bound" in g.detail and "over 20 requests" in g.detail


def test_prompts_beyond_the_tolerance_void_the_point() -> None:
    # a tokenizer that splits the synthetic words: 30% more tokens than the plan's lengths
    recs = [rec(i, 400 + i, round((400 + i) * 1.3)) for i in range(20)]
    g = prompt_length(recs, TH)
    assert not g.passed
    assert g.value == pytest.approx(0.3, abs=0.002)
    assert "server/asked tokens 1.300" in g.detail
    assert prompt_length(recs, GuardThresholds(prompt_length_tolerance=0.35)).passed
    # fewer tokens than asked counts the same way
    assert not prompt_length([rec(i, 500, 400) for i in range(5)], TH).passed


def test_only_measured_requests_are_judged() -> None:
    recs = [rec(i, 500, 900, phase="warmup") for i in range(10)] + [rec(10 + i) for i in range(5)]
    g = prompt_length(recs, TH)
    assert g.passed and g.value == 0.0 and "over 5 requests" in g.detail


def test_without_usage_the_guard_is_skipped_with_its_reason() -> None:
    g = prompt_length([rec(i, 500, None) for i in range(10)], TH)
    assert g.passed and g.value is None
    assert "no usage.prompt_tokens; not checked" in g.detail
    g = prompt_length([rec(i, 500, 900) for i in range(10)], TH, not_asked="a prompts file asks for no length")
    assert g.passed and g.value is None and g.detail == "a prompts file asks for no length; not checked"


def test_a_plan_registers_the_tolerance_under_guards() -> None:
    from pathlib import Path

    import yaml
    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml").read_text())
    base = plan_hash(validate_plan(data))
    data.setdefault("guards", {})["prompt_length_tolerance"] = 0.05  # the default: the same plan
    assert plan_hash(validate_plan(data)) == base
    data["guards"]["prompt_length_tolerance"] = 0.1
    plan = validate_plan(data)
    assert plan.guards.prompt_length_tolerance == 0.1 and plan_hash(plan) != base
    assert plan_from_canonical(canonical_json(plan)) == plan


def _stream(events: list[bytes]) -> RequestRecord:
    r = RequestRecord(request_id=0, conversation_id=0, turn=0, phase="measure", scheduled_s=0.0,
                      prompt_tokens=7, output_tokens_asked=2)
    st = _StreamState(r, Clock(), chat=False)
    st.feed(b"".join(b"data: " + e + b"\n\n" for e in events))
    return r


def test_the_client_keeps_the_servers_prompt_tokens_from_the_usage_chunk() -> None:
    r = _stream([b'{"choices":[{"text":" a"}]}', b'{"choices":[{"text":" b"}]}',
                 b'{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,'
                 b'"prompt_tokens_details":{"cached_tokens":4}}}', b"[DONE]"])
    assert (r.server_prompt_tokens, r.output_tokens, r.cached_tokens, r.prompt_tokens) == (9, 2, 4, 7)
    assert _stream([b'{"choices":[{"text":" a"}]}', b"[DONE]"]).server_prompt_tokens is None
