"""The load generator records the server's usage.prompt_tokens over real HTTP/SSE (both clients,
both APIs), and the prompt-length guard passes on a server that counts as the workload does."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from orchestrator.analysis.guards import prompt_length
from orchestrator.loadgen.null_server import NullServerProcess
from orchestrator.loadgen.runner import run_point
from orchestrator.loadgen.workloads import build_requests
from orchestrator.plan import Workload
from orchestrator.plan.experiment import GuardThresholds


@pytest.mark.parametrize("client", ["aiohttp", "httpx"])
def test_records_keep_the_servers_prompt_tokens(client: str) -> None:
    with NullServerProcess() as url:  # usage.prompt_tokens = the prompt's words
        for api in ("completions", "chat"):
            wl = Workload.model_validate({"prompts": {"input_tokens": {"mean": 64, "dist": "uniform", "sigma": 0.5},
                                                      "conversations": 100, "turns": 2},
                                          "output_tokens": 4, "api": api})
            reqs = build_requests(wl, 12, seed=7)
            s = asyncio.run(run_point(url, "null", reqs, np.arange(12) * 0.01, ["measure"] * 12,
                                      api=api, client=client, keep_records=True))
            recs = s.records or []
            assert s.by_status["ok"] == 12
            assert all(r.server_prompt_tokens == r.prompt_tokens for r in recs), api
            assert len({r.server_prompt_tokens for r in recs}) > 1  # per request, not one number
            g = prompt_length(recs, GuardThresholds())
            assert g.passed and g.value == 0.0, g
