"""A prompts file and a trace each drive a capacity search (short, in virtual time on the virtual
backend: no socket): every point valid, a capacity stored per arm, the requests sent being the
file's."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.plan.sources import read_prompts, read_trace
from tests.e2e.helpers import ROOT, run_virtual, small_plan

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_sockets")]
SEARCH = {"rate": {"min": 0.5, "max": 16}, "precision": 0.25, "point_s": 1.5, "warmup_s": 0.25,
          "cooldown_s": 0, "max_points": 2, "use_prior": False}


def _run(store, state, kind: str):
    plan = small_plan(name=f"data-{kind}", search=SEARCH,
                      workload={"source": {"kind": kind, "path": f"examples/data/{kind}.jsonl"}})
    out = run_virtual(store, plan, state)
    runs = store.runs(out.experiment_id)
    assert len(runs) == 2 and all(r.valid for r in runs), [r.invalid_reason for r in runs]
    caps = store.capacities(out.experiment_id)
    assert len(caps) == 2 and (caps.capacity > 0).all() and (caps.points_used == 2).all()
    return plan, runs


def test_a_prompts_file_drives_a_capacity_search(store, state, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    plan, runs = _run(store, state, "prompts")
    pts = store.points(runs[0].id)
    assert pts.valid.all() and len(pts) == 2
    recs = [r for pid in pts.id for r in store.requests(int(pid))]
    lines = read_prompts(ROOT / "examples" / "data" / "prompts.jsonl")
    # Each prompt is a line of the file plus its 5-word nonce; replies as the line asks (its
    # output_tokens or ShareGPT reply length), the plan's (the file's mean) otherwise.
    assert {r.prompt_tokens - 5 for r in recs} <= {len(e.prompt.split()) for e in lines}
    asked = {e.output_tokens for e in lines} | {plan.workload.output_tokens}
    assert {r.output_tokens_asked for r in recs} <= asked and len({r.output_tokens_asked for r in recs}) > 1
    assert len({r.prompt_hash for r in recs}) == len(recs)


def test_a_trace_drives_a_capacity_search_with_its_own_arrivals(store, state, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    plan, runs = _run(store, state, "trace")
    trace = read_trace(ROOT / "examples" / "data" / "trace.jsonl")
    for _, pt in store.points(runs[0].id).iterrows():
        recs = sorted(store.requests(int(pt.id)), key=lambda r: r.request_id)
        sched = np.array([r.scheduled_s for r in recs])
        gaps = np.diff(sched)
        want = np.diff([row.t_s for row in trace[: len(recs)]])
        scale = float(np.median(gaps[want > 0] / want[want > 0]))
        # The trace's own gaps, scaled by one factor: its mean rate over the point's rate.
        natural = (len(trace) - 1) / trace[-1].t_s
        assert scale == pytest.approx(natural / pt.offered_rate, rel=1e-3)
        assert np.allclose(gaps, want * scale, atol=1e-4)
        assert [r.prompt_tokens for r in recs] == [row.input_tokens for row in trace[: len(recs)]]
        assert [r.output_tokens_asked for r in recs] == [row.output_tokens for row in trace[: len(recs)]]
    # The trace's shared blocks (its hash_ids) hit the servers' prefix caches: over the run's
    # points the server reports more than a tenth of the prompt tokens cached.
    pts = store.points(runs[0].id)
    cached = sum((r.cached_tokens or 0) for pid in pts.id for r in store.requests(int(pid)))
    prompt = sum(r.prompt_tokens for pid in pts.id for r in store.requests(int(pid)))
    assert cached / prompt > 0.1 and max(pt.context["server_prefix_hit_rate"] for _, pt in pts.iterrows()) > 0.1
