"""Workload synthesis: exact word counts, unique prompts, growing histories, hit-rate estimate."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.loadgen.workloads import (
    build_requests,
    expected_prefix_hit_rate,
    ideal_prefix_hit_rate,
    sample_lengths,
)
from orchestrator.plan import LengthDist, Workload


def _workload(**prompts) -> Workload:
    p = {"input_tokens": {"mean": 120, "dist": "lognormal", "sigma": 0.4}, "shared_prefix": 0.5,
         "conversations": 20, "turns": 3}
    p.update(prompts.pop("prompts", {}))
    return Workload.model_validate({"prompts": p, "output_tokens": 32, **prompts})


def test_token_counts_are_exact_words_and_max_tokens_fixed():
    reqs = build_requests(_workload(), 200, seed=1)
    system = reqs[0].prompt.split()[: reqs[0].shared_prefix_tokens]
    assert len(system) == 60  # 0.5 x mean 120
    for r in reqs:
        assert len(r.prompt.split()) == r.prompt_tokens
        assert r.max_tokens == 32
        assert r.prompt.split()[: r.shared_prefix_tokens] == system


def test_same_seed_same_requests_other_seed_other_prompts():
    a = build_requests(_workload(), 100, seed=5)
    assert a == build_requests(_workload(), 100, seed=5)
    b = build_requests(_workload(), 100, seed=6)
    assert {r.prompt_hash for r in a}.isdisjoint({r.prompt_hash for r in b})


def test_prompts_are_unique_beyond_the_shared_prefix():
    # Fixed lengths make accidental repeats likeliest; the nonce must still separate them.
    wl = _workload(prompts={"input_tokens": {"mean": 20}, "shared_prefix": 0.5, "turns": 1,
                            "conversations": 3000})
    reqs = build_requests(wl, 3000, seed=2)
    shared = reqs[0].shared_prefix_tokens
    assert shared == 10
    beyond = {" ".join(r.prompt.split()[shared:]) for r in reqs}
    assert len(beyond) == len(reqs)
    assert len({r.prompt_hash for r in reqs}) == len(reqs)
    assert len({" ".join(r.prompt.split()[:shared]) for r in reqs}) == 1


def test_conversation_turns_carry_their_history():
    reqs = build_requests(_workload(), 60, seed=3)  # 20 conversations x 3 turns
    by_conv: dict[int, dict[int, str]] = {}
    for r in reqs:
        by_conv.setdefault(r.conversation_id, {})[r.turn] = r.prompt
    assert len(by_conv) == 20
    for turns in by_conv.values():
        assert sorted(turns) == [0, 1, 2]
        for t in (1, 2):
            prev, cur = turns[t - 1].split(), turns[t].split()
            assert cur[: len(prev)] == prev
            # the synthetic assistant reply (max_tokens words) follows, then new user words
            assert len(cur) > len(prev) + 32


def test_turns_are_sent_in_order_and_interleaved():
    reqs = build_requests(_workload(), 120, seed=4)
    seen: dict[int, int] = {}
    for r in reqs:
        assert r.turn == seen.get(r.conversation_id, -1) + 1
        seen[r.conversation_id] = r.turn
    # after conversations x turns requests, new conversations start
    assert {r.conversation_id for r in reqs[60:]}.isdisjoint({r.conversation_id for r in reqs[:60]})


def test_chat_messages_rebuild_the_prompt():
    reqs = build_requests(_workload(api="chat"), 60, seed=5)
    for r in reqs:
        assert " ".join(c for _, c in r.messages) == r.prompt
        roles = [role for role, _ in r.messages]
        assert roles[0] == "system" and roles[1] == "user"
        assert len(roles) == 2 + 2 * r.turn
    assert build_requests(_workload(), 1, seed=5)[0].messages == ()


def test_length_distribution_has_the_registered_mean_and_clip():
    rng = np.random.default_rng(0)
    x = sample_lengths(LengthDist(mean=500, dist="lognormal", sigma=0.5, min=10, max=3000), 20000, rng)
    assert x.mean() == pytest.approx(500, rel=0.03)
    assert x.min() >= 10 and x.max() <= 3000


def test_round_robin_hit_rate_follows_the_seed_formula_single_turn():
    wl = _workload(prompts={"input_tokens": {"mean": 1600}, "shared_prefix": 0.5, "turns": 1,
                            "conversations": 400})
    reqs = build_requests(wl, 400, seed=6)
    # one turn: only the shared prefix is reusable, on every worker once warmed up
    h = expected_prefix_hit_rate(reqs, 4, "round_robin")
    assert h == pytest.approx(0.5, abs=0.02)


def test_cache_aware_beats_round_robin_on_conversations():
    wl = _workload(prompts={"input_tokens": {"mean": 800}, "shared_prefix": 0.5, "turns": 4,
                            "conversations": 100})
    reqs = build_requests(wl, 400, seed=7)
    rr = expected_prefix_hit_rate(reqs, 4, "round_robin")
    aware = expected_prefix_hit_rate(reqs, 4, "cache_aware")
    ideal = ideal_prefix_hit_rate(reqs)
    assert rr < aware <= ideal
    assert aware == pytest.approx(ideal, abs=0.01)
    with pytest.raises(ValueError):
        expected_prefix_hit_rate(reqs, 4, "nonsense")
