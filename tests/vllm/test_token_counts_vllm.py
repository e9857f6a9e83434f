"""Exact token counts against real vLLM (CPU build, tiny model; issue 19 item 4): each record's
server_prompt_tokens is what vLLM's own tokenizer counts for that prompt (its /tokenize
endpoint) and what its /metrics added up; the prompt-length guard passes on the load generator's
words (one token each under the tiny tokenizer) and voids prompts a tokenizer splits, which
pass once fitted to their length through the server's /tokenize."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from orchestrator.analysis.guards import prompt_length
from orchestrator.backends.base import Deployment
from orchestrator.backends.local import LocalBackend
from orchestrator.loadgen.client import TokenizeCounter
from orchestrator.loadgen.runner import run_point
from orchestrator.loadgen.workloads import build_requests, fit_prompts
from orchestrator.plan import Plan
from orchestrator.plan.experiment import GuardThresholds
from orchestrator.records import RequestRecord
from tests.vllm.conftest import deployed, tiny_plan
from tests.vllm.test_local_vllm import _counter

N = 8


@pytest.fixture(scope="module")
def plan() -> Plan:
    return tiny_plan({"A": {"layout": "colocated", "replicas": 1}, "B": {"layout": "colocated", "replicas": 1}})


@pytest.fixture(scope="module")
def colocated(backend: LocalBackend, plan: Plan) -> Iterator[Deployment]:
    yield from deployed(backend, plan, "A")


def _tokenize(url: str, model: str, prompt: str) -> int:
    r = httpx.post(f"{url}/tokenize", json={"model": model, "prompt": prompt}, timeout=30)
    r.raise_for_status()
    return int(r.json()["count"])


def _run(dep: Deployment, specs: list, api: str = "completions") -> list[RequestRecord]:
    s = asyncio.run(run_point(dep.endpoint.url, dep.endpoint.model, specs, np.arange(len(specs)) * 0.05,
                              ["measure"] * len(specs), api=api, keep_records=True, request_timeout_s=120))
    recs = sorted(s.records or [], key=lambda r: r.request_id)
    assert [r.status for r in recs] == ["ok"] * len(specs), recs[0].error
    return recs


def _prompt_tokens_total(backend: LocalBackend, dep: Deployment) -> float:
    return sum(_counter(t, "vllm:prompt_tokens_total") for t in backend.scrape(dep).values())


def test_records_keep_vllms_own_prompt_token_counts(backend: LocalBackend, colocated: Deployment,
                                                   plan: Plan) -> None:
    specs = build_requests(plan.workload, N, seed=21)
    before = _prompt_tokens_total(backend, colocated)
    recs = _run(colocated, specs)
    after = _prompt_tokens_total(backend, colocated)
    counted = [_tokenize(colocated.endpoint.url, colocated.endpoint.model, s.prompt) for s in specs]
    assert [r.server_prompt_tokens for r in recs] == counted
    assert after - before == sum(counted)
    # the tiny tokenizer learnt the generator's words: one token each, the asked length exactly
    assert [r.prompt_tokens for r in recs] == counted
    g = prompt_length(recs, GuardThresholds())
    assert g.passed and g.value == 0.0, g


def _foreign(plan: Plan, seed: int) -> list:
    """80-token requests of words outside the tiny tokenizer's vocabulary: the generator would
    count one token per word, the served model's tokenizer counts several."""
    rng = random.Random(seed)
    specs = []
    for s in build_requests(plan.workload, N, seed=seed):
        words = ["".join(rng.choice("qzxjkvw") for _ in range(7)) for _ in range(80)]
        specs.append(dataclasses.replace(s, prompt=" ".join(words), prompt_tokens=80, shared_prefix_tokens=0))
    return specs


def test_prompts_a_tokenizer_splits_fail_the_guard(colocated: Deployment, plan: Plan) -> None:
    specs = _foreign(plan, 22)
    recs = _run(colocated, specs)
    counted = [_tokenize(colocated.endpoint.url, colocated.endpoint.model, s.prompt) for s in specs]
    assert [r.server_prompt_tokens for r in recs] == counted
    assert all(c > 2 * r.prompt_tokens for c, r in zip(counted, recs, strict=True))
    g = prompt_length(recs, GuardThresholds())
    assert not g.passed and g.value is not None and g.value > 1.0, g


def test_prompts_fitted_with_the_servers_tokenizer_pass_the_guard(colocated: Deployment, plan: Plan) -> None:
    with TokenizeCounter(colocated.endpoint.url, colocated.endpoint.model) as count:
        specs = fit_prompts(_foreign(plan, 23), count)
    recs = _run(colocated, specs)
    assert [r.server_prompt_tokens for r in recs] == [80] * N
    g = prompt_length(recs, GuardThresholds(prompt_length_tolerance=0.0))
    assert g.passed and g.value == 0.0, g
