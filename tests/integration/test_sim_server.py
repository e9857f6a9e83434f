"""The real-time sim server over real HTTP on loopback."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.plan import MODELS, gpu
from orchestrator.sim.engine import ClusterSpec
from orchestrator.sim.model import WorkerModel
from orchestrator.sim.server import Faults, ServeConfig, start_sim_server

NAME = "Qwen/Qwen3-8B"
MODEL = WorkerModel(gpu=gpu("H200"), model=MODELS["qwen3-8b"])


@pytest.fixture
def server() -> Iterator[str]:
    h = start_sim_server(ServeConfig(ClusterSpec(workers=(MODEL,)), NAME))
    try:
        yield h.url
    finally:
        h.stop()


def stream(url: str, body: dict, path: str = "/v1/completions") -> tuple[list[float], list[dict]]:
    times, docs = [], []
    with httpx.Client(timeout=30) as c, c.stream("POST", url + path, json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            docs.append(d)
            ch = d["choices"]
            if ch and (ch[0].get("text") or (ch[0].get("delta") or {}).get("content")):
                times.append(time.monotonic())
    return times, docs


def test_stream_returns_exact_tokens_at_model_step_times(server: str) -> None:
    prompt = " ".join(f"w{i}" for i in range(100))
    times, docs = stream(server, {"model": NAME, "prompt": prompt, "max_tokens": 64, "ignore_eos": True,
                                  "stream": True, "stream_options": {"include_usage": True}})
    usage = docs[-1]["usage"]
    assert usage["completion_tokens"] == 64 and usage["prompt_tokens"] == 100
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert len(times) == 64
    model_gap = np.mean([MODEL.decode_step_s(1, 100 + g) for g in range(1, 64)])
    assert abs(float(np.mean(np.diff(times))) - model_gap) < 1e-3
    # the same prompt again hits the prefix cache (whole 16-token blocks)
    _, docs = stream(server, {"model": NAME, "prompt": prompt, "max_tokens": 2, "stream": True,
                              "stream_options": {"include_usage": True}})
    assert docs[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 96


def test_chat_non_stream_models_health_and_wrong_model(server: str) -> None:
    with httpx.Client(timeout=30) as c:
        r = c.post(server + "/v1/chat/completions", json={
            "model": NAME, "messages": [{"role": "system", "content": "be brief"},
                                        {"role": "user", "content": "one two three"}], "max_tokens": 5})
        doc = r.json()
        assert doc["usage"]["prompt_tokens"] == 5 and doc["usage"]["completion_tokens"] == 5
        assert len(doc["choices"][0]["message"]["content"].split()) == 5
        assert c.get(server + "/health").status_code == 200
        assert c.get(server + "/v1/models").json()["data"][0]["id"] == NAME
        assert c.post(server + "/v1/completions", json={"model": "other", "prompt": "x"}).status_code == 404
    times, docs = stream(server, {"model": NAME, "messages": [{"role": "user", "content": "hi"}],
                                  "max_tokens": 4, "stream": True}, "/v1/chat/completions")
    assert len(times) == 4 and docs[0]["object"] == "chat.completion.chunk"


def test_metrics_parse_with_vllm_names(server: str) -> None:
    with httpx.Client(timeout=30) as c:
        c.post(server + "/v1/completions", json={"model": NAME, "prompt": "a b c", "max_tokens": 3})
        text = c.get(server + "/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens",
                 "vllm:generation_tokens", "vllm:time_to_first_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:num_preemptions"):
        assert name in fams, name
    gen = [s.value for s in fams["vllm:generation_tokens"].samples if s.name.endswith("_total")]
    assert gen == [3.0]
    # the simulator's own lateness against the model: one observation per step (3 tokens, >= 3)
    late = {s.name: s.value for s in fams["orch_sim_step_lateness_seconds"].samples
            if s.name.endswith(("_count", "_sum"))}
    assert late["orch_sim_step_lateness_seconds_count"] >= 3
    assert 0 <= late["orch_sim_step_lateness_seconds_sum"] < 1.0
    errors = {s.name: s.value for s in fams["orch_sim_step_time_error_seconds"].samples}
    assert errors["orch_sim_step_time_error_seconds_count"] >= 2  # steps 2 and 3 followed back to back


def test_spin_mode_serves_the_same_stream() -> None:
    h = start_sim_server(ServeConfig(ClusterSpec(workers=(MODEL,)), NAME, spin_ms=2.0))
    try:
        times, docs = stream(h.url, {"model": NAME, "prompt": "a b c d", "max_tokens": 16, "ignore_eos": True,
                                     "stream": True, "stream_options": {"include_usage": True}})
    finally:
        h.stop()
    assert len(times) == 16 and docs[-1]["usage"]["completion_tokens"] == 16


def test_kv_transfer_handoff_prefill_then_decode() -> None:
    pre = start_sim_server(ServeConfig(ClusterSpec(workers=(MODEL,)), NAME, role="prefill"))
    dec = start_sim_server(ServeConfig(ClusterSpec(workers=(MODEL,)), NAME, role="decode"))
    try:
        prompt = " ".join(f"p{i}" for i in range(4000))
        with httpx.Client(timeout=30) as c:
            r = c.post(pre.url + "/v1/completions", json={
                "model": NAME, "prompt": prompt, "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}).json()
            kv = r["kv_transfer_params"]
            assert kv["do_remote_prefill"] is True and len(kv["remote_block_ids"]) == 250
            d = c.post(dec.url + "/v1/completions", json={
                "model": NAME, "prompt": prompt, "max_tokens": 8, "kv_transfer_params": kv}).json()
            metrics = c.get(dec.url + "/metrics").text
        assert d["usage"]["completion_tokens"] == 8
        # The decoder skipped the 4000-token prefill (~0.12 s) and paid the transfer instead: on
        # its own step timeline (its histograms), not the wall clock, which a loaded machine moves.
        fams = {f.name: f for f in text_string_to_metric_families(metrics)}
        prefill = {x.name: x.value for x in fams["vllm:request_prefill_time_seconds"].samples}
        assert prefill["vllm:request_prefill_time_seconds_count"] == 1
        assert prefill["vllm:request_prefill_time_seconds_sum"] < MODEL.prefill_s(4000)
    finally:
        pre.stop()
        dec.stop()


def test_faults_ignore_max_tokens_and_frozen_output() -> None:
    h = start_sim_server(ServeConfig(ClusterSpec(workers=(MODEL,)), NAME,
                                     faults=Faults(ignore_max_tokens=True, frozen_output=True)))
    try:
        with httpx.Client(timeout=30) as c:
            outs = [c.post(h.url + "/v1/completions", json={"model": NAME, "prompt": f"q{i}", "max_tokens": 8}).json()
                    for i in range(6)]
        counts = [o["usage"]["completion_tokens"] for o in outs]
        assert any(n != 8 for n in counts)
        texts = {o["choices"][0]["text"] for o in outs}
        firsts = {t.split()[0] for t in texts}
        assert len(firsts) == 1  # the same "random" draws every time
    finally:
        h.stop()
