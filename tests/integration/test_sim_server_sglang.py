"""The sim server speaking SGLang (an arm with engine.kind sglang), over real HTTP on loopback:
SGLang's metric names from its adapter (none of vLLM's, none SGLang does not export), its
native endpoints, and the same OpenAI API."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.engines import ENGINES
from orchestrator.plan import MODELS, gpu
from orchestrator.sim.engine import ClusterSpec
from orchestrator.sim.model import WorkerModel
from orchestrator.sim.server import ServeConfig, start_sim_server

NAME = "Qwen/Qwen3-8B"
MODEL = WorkerModel(gpu=gpu("H200"), model=MODELS["qwen3-8b"])
SGLANG = ENGINES["sglang"].metrics


@pytest.fixture
def server() -> Iterator[str]:
    h = start_sim_server(ServeConfig(ClusterSpec(workers=(MODEL,)), NAME, engine="sglang"))
    try:
        yield h.url
    finally:
        h.stop()


def _samples(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_sglang_names_and_endpoints(server: str) -> None:
    prompt = " ".join(f"w{i}" for i in range(64))
    with httpx.Client(timeout=30) as c:
        for _ in range(2):
            r = c.post(f"{server}/v1/completions", json={"model": NAME, "prompt": prompt, "max_tokens": 8})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        assert c.get(f"{server}/health").status_code == 200
        info = c.get(f"{server}/get_model_info").json()
        assert info["model_path"] == NAME and info["is_generation"] is True and info["disaggregation_mode"] == "null"
        assert c.get(f"{server}/model_info").json() == info
        server_info = c.get(f"{server}/get_server_info").json()
        assert server_info["version"].startswith("sim-") and server_info["tp_size"] == 1
        assert c.get(f"{server}/version").status_code == 404  # SGLang has none
        assert c.get(f"{server}/v1/models").json()["data"][0]["owned_by"] == "sglang"
    got = _samples(server)
    names = set(got)
    assert not any(n.startswith("vllm:") for n in names)
    # SGLang's counters (exported with _total), gauges and histograms, as its server names them.
    assert got[f"{SGLANG.prompt_tokens}_total"] == 128  # also its prefix-cache queries: one series
    assert got[f"{SGLANG.prefix_hits}_total"] == 48  # the second prompt's three whole 16-token blocks
    assert got[f"{SGLANG.generation_tokens}_total"] == 16
    assert got[f"{SGLANG.request_success}_total"] == 2
    assert {SGLANG.running, SGLANG.waiting, SGLANG.kv_usage, f"{SGLANG.preemptions}_total",
            f"{SGLANG.ttft}_count", f"{SGLANG.itl}_count", f"{SGLANG.tpot}_count"} <= names
    assert got[f"{SGLANG.ttft}_count"] == 2
    # What SGLang does not export is left out (no phase histograms).
    assert not any("prefill_time" in n or "decode_time" in n for n in names)
    assert SGLANG.prefill_time == SGLANG.decode_time == SGLANG.cache_config_info == ""
