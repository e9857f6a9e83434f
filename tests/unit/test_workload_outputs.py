"""Reply lengths from a distribution: drawn per request, reproducible, mean = output_tokens."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.errors import PlanError
from orchestrator.loadgen.workloads import build_requests
from orchestrator.plan import validate_plan
from orchestrator.plan.workload import Workload
from tests.unit.test_workload_data import PLAN

W = {"prompts": {"input_tokens": {"mean": 30}, "turns": 2, "conversations": 50},
     "output_dist": {"mean": 100, "dist": "lognormal", "sigma": 0.6, "min": 4, "max": 1000}}


def test_reply_lengths_follow_the_distribution_and_are_reproducible() -> None:
    w = Workload.model_validate(W)
    assert w.output_tokens == 100  # filled in from the distribution's mean
    reqs = build_requests(w, 3000, seed=4)
    asked = np.array([r.max_tokens for r in reqs])
    assert 90 < asked.mean() < 110 and asked.min() >= 4 and asked.max() <= 1000 and asked.std() > 30
    assert [r.max_tokens for r in build_requests(w, 50, seed=4)] == list(asked[:50])
    assert [r.max_tokens for r in build_requests(w, 50, seed=5)] != list(asked[:50])


def test_output_tokens_must_be_the_distributions_mean() -> None:
    with pytest.raises(PlanError) as e:
        validate_plan({**PLAN, "workload": {**W, "output_tokens": 64}})
    assert [p.path for p in e.value.plan_problems] == ["workload.output_tokens"]
    assert validate_plan({**PLAN, "workload": {**W, "output_tokens": 100}}).workload.output_dist is not None


def test_fixed_output_tokens_unchanged_without_a_distribution() -> None:
    w = Workload.model_validate({"prompts": W["prompts"], "output_tokens": 33})
    assert {r.max_tokens for r in build_requests(w, 40, seed=1)} == {33}
