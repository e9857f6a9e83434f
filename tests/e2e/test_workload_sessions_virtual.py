"""A live-session plan in virtual time (issue 28): the executor, point runner, guards and
verdicts on the virtual backend, whose sessions send each later turn when the reply before it
has ended plus the think time, carrying that reply. No socket; the outcome is exact."""

from __future__ import annotations

import pytest

from orchestrator.backends.virtual import VirtualBackend
from orchestrator.control.executor import Executor, ExecutorConfig
from orchestrator.control.progress import PlainProgress
from tests.e2e.helpers import small_plan


class _Labels(PlainProgress):
    """The point lines the run shows, kept."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def point_started(self, label: str, seconds: float) -> None:
        self.lines.append(label)

    def point_done(self, line: str) -> None:
        self.lines.append(line)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_sockets")]


def test_a_session_plan_searches_capacity_in_virtual_time(store, state) -> None:
    plan = small_plan(
        name="virtual-sessions",
        workload={"arrival": {"process": "poisson"}, "sessions": {"think": {"mean_s": 0.1, "dist": "exponential"}},
                  "prompts": {"input_tokens": {"mean": 600}, "shared_prefix": 0.3, "conversations": 100000, "turns": 3},
                  "output_tokens": 16},
        search={"rate": {"min": 0.5, "max": 4}, "precision": 0.25, "point_s": 2, "warmup_s": 0.5,
                "cooldown_s": 0, "max_points": 2, "use_prior": False})
    shown = _Labels()
    out = Executor(store, VirtualBackend(), ExecutorConfig(state_dir=state), shown).run(plan)
    # The rate a session plan searches starts sessions: its points say sessions/s, not req/s.
    assert shown.lines and all("sessions/s" in line and "req/s" not in line for line in shown.lines), shown.lines
    runs = store.runs(out.experiment_id)
    assert len(runs) == 2 and all(r.status == "done" and r.valid for r in runs), [r.invalid_reason for r in runs]
    caps = store.capacities(out.experiment_id)
    assert len(caps) == 2 and (caps.capacity > 0).all()
    for r in runs:
        for _, pt in store.points(r.id).iterrows():
            assert pt.context["loop"]["kind"] == "sessions" and pt.context["loop"]["sessions_per_s"] == pt.offered_rate
            recs = {(x.conversation_id, x.turn): x for x in store.requests(int(pt.id))}
            later = [(recs[(c, t - 1)], x) for (c, t), x in recs.items() if t > 0]
            assert later
            for prev, rec in later:  # due after the reply before it, and longer by history and reply
                assert rec.scheduled_s >= prev.last_token_s
                assert rec.prompt_tokens > prev.prompt_tokens + prev.output_tokens
            assert pt.context["server_prefix_hit_rate"] > 0.3  # history and system prompt reused


def test_the_generators_ceiling_bounds_a_session_plan_in_sessions_per_second(store, state) -> None:
    """One process holds 3 req/s; a 3-turn session brings 3 requests, so the search may ask at
    most 1 session/s (it compared sessions/s with req/s before and asked up to 3 sessions/s):
    no point above 1 session/s, and a capacity that passes there is a bound at the ceiling."""
    plan = small_plan(
        name="virtual-sessions-ceiling", design={"blocks": 1, "order": "ABBA", "seed": 3, "max_retries": 0},
        workload={"arrival": {"process": "poisson"}, "sessions": {"think": {"mean_s": 0.1, "dist": "exponential"}},
                  "prompts": {"input_tokens": {"mean": 600}, "shared_prefix": 0.3, "conversations": 100000, "turns": 3},
                  "output_tokens": 16},
        search={"rate": {"min": 0.5, "max": 4}, "precision": 0.25, "point_s": 2, "warmup_s": 0.5,
                "cooldown_s": 0, "max_points": 3, "use_prior": False})
    out = Executor(store, VirtualBackend(), ExecutorConfig(state_dir=state, generator_ceiling=3.0)).run(plan)
    runs = store.runs(out.experiment_id)
    assert runs and all(r.status == "done" and r.valid for r in runs), [r.invalid_reason for r in runs]
    rates = [float(pt.offered_rate) for r in runs for _, pt in store.points(r.id).iterrows()]
    assert rates and max(rates) <= 1.0 + 1e-9, rates
    caps = store.capacities(out.experiment_id)
    assert set(caps.censored.dropna()) <= {"at_ceiling"}
