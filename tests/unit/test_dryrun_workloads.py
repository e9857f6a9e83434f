"""A dry run and a power check simulate the plan's own workload (issue 28): a prompts file's
prompts, a trace's prompts and arrivals, drawn reply lengths in the drain, and a live
sessions plan as sessions (later turns after their replies), never as another workload."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.control import dryrun, load_kinds
from orchestrator.control.points import drain_seconds
from orchestrator.plan import Plan, validate_plan
from orchestrator.plan.sources import read_prompts, read_trace
from tests.e2e.helpers import BASE, ROOT

BAR = [{"id": "win", "metric": "capacity", "class": "standard", "at_least": 0.5, "confidence": 0.9}]


def _plan(workload: dict[str, Any], name: str) -> Plan:
    d = copy.deepcopy(BASE)
    d["name"] = name
    d["workload"] = workload
    d["bars"] = BAR
    d["search"] = {**d["search"], "max_points": 2}
    d["design"] = {"blocks": 2, "order": "ABBA", "seed": 5, "max_retries": 1}
    return validate_plan(d)


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[tuple[np.ndarray, list[Any], float]]:
    """Every (offsets, requests, drain) the dry run hands the virtual engine."""
    calls: list[tuple[np.ndarray, list[Any], float]] = []
    real = load_kinds.simulate_open_loop

    def spy(cluster, requests, offsets, windows, *, drain_s, seed):  # type: ignore[no-untyped-def]
        calls.append((np.asarray(offsets), list(requests), drain_s))
        return real(cluster, requests, offsets, windows, drain_s=drain_s, seed=seed)

    monkeypatch.setattr(load_kinds, "simulate_open_loop", spy)
    monkeypatch.chdir(ROOT)  # the examples' data paths are relative to the checkout
    return calls


def _search(plan: Plan) -> None:
    windows = dryrun.DryWindows.for_plan(plan, 2.0, 0.25, 0.0)
    dryrun.ArmSimulator(plan, "A", windows, seed=1).search("standard")


def test_a_prompts_file_plan_is_dry_run_on_its_prompts(seen) -> None:
    plan = _plan({"source": {"kind": "prompts", "path": "examples/data/prompts.jsonl"}}, "dry-prompts")
    _search(plan)
    lines = {len(e.prompt.split()) for e in read_prompts(ROOT / "examples" / "data" / "prompts.jsonl")}
    assert seen
    for _, requests, _ in seen:
        # Each is a line of the file plus its 5-word nonce (synthetic prompts are ~4,000 words).
        assert {r.prompt_tokens - 5 for r in requests} <= lines


def test_a_trace_plan_is_dry_run_on_its_arrivals_and_lengths(seen) -> None:
    plan = _plan({"source": {"kind": "trace", "path": "examples/data/trace.jsonl"}}, "dry-trace")
    _search(plan)
    trace = read_trace(ROOT / "examples" / "data" / "trace.jsonl")
    assert seen
    for offsets, requests, _ in seen:
        n = min(len(trace), len(requests))
        assert [r.prompt_tokens for r in requests[:n]] == [row.input_tokens for row in trace[:n]]
        gaps, want = np.diff(offsets[:n]), np.diff([row.t_s for row in trace[:n]])
        scale = float(np.median(gaps[want > 0] / want[want > 0]))
        assert np.allclose(gaps, want * scale, atol=1e-6)  # the trace's own gaps, scaled


def test_the_dry_run_drains_as_long_as_the_point_runner(seen) -> None:
    d = copy.deepcopy(BASE["workload"])
    d.pop("output_tokens")
    d["output_dist"] = {"mean": 32, "dist": "lognormal", "sigma": 0.5, "max": 400}
    plan = _plan(d, "dry-output-dist")
    _search(plan)
    assert {drain for _, _, drain in seen} == {drain_seconds(plan)}
    assert drain_seconds(plan) > drain_seconds(_plan(BASE["workload"], "dry-fixed"))


def test_the_power_check_simulates_a_trace_plan(seen, tmp_path: Path) -> None:
    plan = _plan({"source": {"kind": "trace", "path": "examples/data/trace.jsonl"}}, "power-trace")
    check = dryrun.power_check(plan, tmp_path)
    assert check.skipped is None and check.gpu_hours > 0
    trace = read_trace(ROOT / "examples" / "data" / "trace.jsonl")
    assert all(r.prompt_tokens == trace[i % len(trace)].input_tokens
               for _, requests, _ in seen for i, r in enumerate(requests[: len(trace)]))


def test_a_sessions_plan_is_dry_run_as_sessions(seen, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    d = copy.deepcopy(BASE["workload"])
    d["prompts"] = {**d["prompts"], "turns": 3}
    d["sessions"] = {"think": {"mean_s": 0.5}}
    plan = _plan(d, "dry-sessions")
    runs: list[Any] = []
    real = load_kinds.simulate_sessions

    def spy(cluster, starts, script, windows, *, drain_s, seed):  # type: ignore[no-untyped-def]
        res = real(cluster, starts, script, windows, drain_s=drain_s, seed=seed)
        runs.append(res)
        return res

    monkeypatch.setattr(load_kinds, "simulate_sessions", spy)
    _search(plan)
    assert runs and not seen  # sessions, not an open loop of first turns
    later = []
    for res in runs:
        recs = {(r.conversation_id, r.turn): r for r in res.records}
        later += [(recs[(c, t - 1)], r) for (c, t), r in recs.items() if t > 0]
    assert later  # sessions went on past their first turn (an overloaded point's may not)
    for prev, rec in later:  # due when the reply before it ended, plus the think time
        assert rec.scheduled_s == pytest.approx(prev.last_token_s + 0.5)
        assert rec.prompt_tokens > prev.prompt_tokens + prev.output_tokens  # history + reply + new words
    check = dryrun.power_check(plan, tmp_path)
    assert check.skipped is None and check.gpu_hours > 0
    assert dryrun.predicted_capacity_rates(plan)["A"]["standard"] > 0
