"""The sim server exports vLLM v1's per-request phase histograms (TPOT, prefill and decode time)
on the engine's timeline, as `orch device fit --experiment` reads them (issue 21)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.plan import MODELS, gpu
from orchestrator.sim.engine import ClusterSpec
from orchestrator.sim.model import WorkerModel
from orchestrator.sim.server import ServeConfig, start_sim_server

pytestmark = pytest.mark.integration

NAME = "Qwen/Qwen3-8B"
MODEL = WorkerModel(gpu=gpu("H200"), model=MODELS["qwen3-8b"])


def test_one_requests_tpot_prefill_and_decode_time_are_the_models() -> None:
    h = start_sim_server(ServeConfig(ClusterSpec(workers=(MODEL,)), NAME))
    try:
        with httpx.Client(timeout=30) as c:
            r = c.post(h.url + "/v1/completions", json={"model": NAME, "prompt": " ".join(f"w{i}" for i in range(1000)),
                                                        "max_tokens": 64})
            assert r.status_code == 200
            text = c.get(h.url + "/metrics").text
    finally:
        h.stop()
    got = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    tpot = float(np.mean([MODEL.decode_step_s(1, 1000 + g) for g in range(1, 64)]))
    for name, want in (("vllm:request_time_per_output_token_seconds", tpot),
                       ("vllm:request_prefill_time_seconds", MODEL.prefill_s(1000)),
                       ("vllm:request_decode_time_seconds", 63 * tpot)):
        assert got[name + "_count"] == 1
        assert got[name + "_sum"] == pytest.approx(want, rel=1e-6)
