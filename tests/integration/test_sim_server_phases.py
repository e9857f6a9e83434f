"""The sim server exports vLLM v1's per-request phase histograms (TPOT, prefill and decode time)
on the engine's timeline, as `orch device fit --experiment` reads them (issue 21)."""

from __future__ import annotations

import time

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
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    got = {s.name: s.value for s in samples}
    tpot = float(np.mean([MODEL.decode_step_s(1, 1000 + g) for g in range(1, 64)]))
    # The server's own account of its timeline: a step that ended more than MAX_CATCH_UP_S
    # late (a loaded machine) restarts the timeline from then (counted), and that request's
    # phases are longer than the model's by the stall; otherwise they are the model's exactly.
    on_time = got["orch_sim_timeline_restarts_total"] == 0
    for name, want in (("vllm:request_time_per_output_token_seconds", tpot),
                       ("vllm:request_prefill_time_seconds", MODEL.prefill_s(1000)),
                       ("vllm:request_decode_time_seconds", 63 * tpot)):
        assert got[name + "_count"] == 1
        if on_time:
            assert got[name + "_sum"] == pytest.approx(want, rel=1e-6)
        else:
            assert got[name + "_sum"] >= want * (1 - 1e-6)  # a stall only lengthens a phase


def test_a_stall_of_the_server_restarts_its_timeline_and_says_so() -> None:
    # The server's loop is held for 0.3 s mid-decode (far past MAX_CATCH_UP_S; the decode lasts
    # ~4 s, so the hold lands inside it however late this thread runs): the restart is counted
    # and the request's decode time carries the stall.
    h = start_sim_server(ServeConfig(ClusterSpec(workers=(MODEL,)), NAME))
    try:
        with httpx.Client(timeout=30) as c, c.stream(
                "POST", h.url + "/v1/completions",
                json={"model": NAME, "prompt": "w " * 200, "max_tokens": 1000, "stream": True}) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            h._loop.call_soon_threadsafe(time.sleep, 0.3)
            assert any(line == "data: [DONE]" for line in lines)
        text = httpx.get(h.url + "/metrics", timeout=30).text
    finally:
        h.stop()
    got = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert got["orch_sim_timeline_restarts_total"] >= 1
    decode = sum(MODEL.decode_step_s(1, 200 + g) for g in range(1, 1000))
    assert got["vllm:request_decode_time_seconds_sum"] >= decode + 0.25
