"""A live-session plan through the executor on the sim backend: its open-loop rate starts
sessions, later turns are stored with their due times, the guards are judged on the real
history. Real time (a session's turns follow its replies over HTTP; the control logic is also
tested in virtual time, test_workload_sessions_virtual.py): it asserts what load cannot
change, not that the timing guards passed."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import run_in_process, small_plan

pytestmark = pytest.mark.timeout(300)


def test_a_session_plan_searches_capacity_and_stores_every_turn(store, state) -> None:
    plan = small_plan(
        name="e2e-sessions",
        workload={"arrival": {"process": "poisson"}, "sessions": {"think": {"mean_s": 0.1, "dist": "exponential"}},
                  "prompts": {"input_tokens": {"mean": 600}, "shared_prefix": 0.3, "conversations": 100000, "turns": 3},
                  "output_tokens": 16},
        search={"rate": {"min": 0.5, "max": 4}, "precision": 0.25, "point_s": 2, "warmup_s": 0.5,
                "cooldown_s": 0, "max_points": 2, "use_prior": False})
    out = run_in_process(store, plan, state)
    runs = store.runs(out.experiment_id)
    assert {r.arm for r in runs} == {"A", "B"} and all(r.status in ("done", "failed") for r in runs)
    caps = store.capacities(out.experiment_id)
    assert (caps.capacity[caps.valid.astype(bool)] > 0).all()  # a valid run's capacity is measured
    points = [pt for r in runs for _, pt in store.points(r.id).iterrows()]
    assert points and all(store.guard_results(r.id) for r in runs)  # every run's guards judged and stored
    for pt in points:
        assert pt.context["loop"]["kind"] == "sessions" and pt.context["loop"]["sessions_per_s"] == pt.offered_rate
        recs = {(r.conversation_id, r.turn): r for r in store.requests(int(pt.id))}
        later = [(recs[(c, t - 1)], r) for (c, t), r in recs.items() if t > 0]
        assert later  # sessions went on past their first turn
        for prev, rec in later:  # stored due time: after the previous reply arrived
            assert prev.last_token_s is not None and rec.scheduled_s >= prev.last_token_s
        assert pt.context["server_prefix_hit_rate"] > 0.3  # history and system prompt reused
