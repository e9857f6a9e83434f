"""Sessions in the plan language and the pure parts of a live session (think times, turns)."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.errors import PlanError
from orchestrator.loadgen.schedules import think_time
from orchestrator.loadgen.workloads import LiveSession, session_prefix_hit_rate, shared_prefix_words
from orchestrator.plan import load_plan_file, plan_hash, validate_plan
from orchestrator.plan.workload import ThinkTime, Workload
from tests.unit.test_workload_closed import ROOT, _example_data

W = {"arrival": {"process": "gamma", "burstiness": 0.5}, "sessions": {"think": {"mean_s": 2.0, "dist": "lognormal", "sigma": 0.5}},
     "prompts": {"input_tokens": {"mean": 40}, "shared_prefix": 0.4, "turns": 4}, "output_tokens": 8}


def test_sessions_need_the_open_loop_clock() -> None:
    data = _example_data()  # a closed-loop plan
    data["workload"]["sessions"] = {"think": {"mean_s": 1}}
    with pytest.raises(PlanError) as e:
        validate_plan(data)
    assert [p.path for p in e.value.plan_problems] == ["workload.sessions"]


def test_a_plan_without_sessions_keeps_its_hash() -> None:
    # Registered plans never change: an unset new field is left out of the canonical JSON.
    plan = load_plan_file(ROOT / "examples" / "quickstart.yaml")
    assert "sessions" not in plan.model_dump()["workload"] and "source" not in plan.model_dump()["workload"]
    assert plan_hash(plan) == "f83a1591c193d0f33249600bb8b412feefe9019c2aae48ec9b074f97ee0057e9"


@pytest.mark.parametrize(("dist", "sigma"), [("exponential", 0.0), ("lognormal", 0.6), ("uniform", 0.5)])
def test_think_time_has_the_registered_mean_and_is_reproducible(dist: str, sigma: float) -> None:
    think = ThinkTime(mean_s=2.0, dist=dist, sigma=sigma)  # type: ignore[arg-type]
    draws = np.array([think_time(think, 7, s, t) for s in range(800) for t in range(1, 4)])
    assert abs(draws.mean() - 2.0) < 0.15 and (draws >= 0).all() and draws.std() > 0.1
    assert think_time(think, 7, 5, 2) == think_time(think, 7, 5, 2) != think_time(think, 7, 5, 3)
    assert think_time(ThinkTime(mean_s=1.5), 7, 5, 2) == 1.5


def test_live_session_turns_carry_the_given_reply_after_the_previous_prompt() -> None:
    w = Workload.model_validate({**W, "api": "chat"})
    prefix = shared_prefix_words(w, 3)
    live = LiveSession(w, 12, 3, prefix)
    t0 = live.first(48)
    t1 = live.after_reply(" gold  iron salt", 49)
    assert (t0.turn, t1.turn, t1.conversation_id, t1.request_id) == (0, 1, 12, 49)
    assert t1.prompt.startswith(t0.prompt + " gold iron salt ")
    assert [r for r, _ in t1.messages] == ["system", "user", "assistant", "user"]
    assert t1.messages[2] == ("assistant", "gold iron salt")
    assert t1.prompt_tokens == len(t1.prompt.split()) > t0.prompt_tokens + 3
    assert t0.prompt.split()[: len(prefix)] == prefix and t1.shared_prefix_tokens == len(prefix)
    # What the server saw before: the previous prompt and its own reply (a cache of generated
    # blocks may reuse it); the repeat guard's bound counts it, in whole 16-token blocks.
    assert (t0.history_tokens, t1.history_tokens) == (0, t0.prompt_tokens + 3)
    bound = session_prefix_hit_rate([t0, t1])
    assert bound == ((t1.history_tokens // 16) * 16) / (t0.prompt_tokens + t1.prompt_tokens)
    # Another session never repeats this one's prompt beyond the prefix (the nonce).
    assert LiveSession(w, 13, 3, prefix).first(52).prompt_hash != t0.prompt_hash
