"""The null server accepts what third-party load generators send (guidellm, the OpenAI SDK)."""

from __future__ import annotations

import json

import httpx
import pytest

from orchestrator.loadgen.null_server import NullServerConfig, NullServerProcess


@pytest.fixture(scope="module")
def server():
    with NullServerProcess(NullServerConfig(record_arrivals=True)) as url:
        yield url


def _stream(url: str, path: str, body: dict) -> tuple[list[str], dict]:
    texts, usage = [], {}
    with httpx.stream("POST", url + path, json=body, timeout=10) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            doc = json.loads(line[6:])
            if doc.get("usage"):
                usage = doc["usage"]
            for c in doc["choices"]:
                texts.append(c["delta"]["content"] if "delta" in c else c["text"])
    return texts, usage


# guidellm 0.8's chat body: the reply length rides on max_completion_tokens, not max_tokens.
GUIDELLM_CHAT = {"model": "null", "messages": [{"role": "user", "content": "one two three"}],
                 "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                 "max_completion_tokens": 7, "stop": None, "ignore_eos": True}


def test_chat_reply_length_follows_max_completion_tokens(server):
    texts, usage = _stream(server, "/v1/chat/completions", GUIDELLM_CHAT)
    assert len(texts) == 7
    assert usage["completion_tokens"] == 7 and usage["prompt_tokens"] == 3


def test_max_tokens_still_wins_and_default_is_16(server):
    texts, _ = _stream(server, "/v1/completions", {"prompt": "a b", "stream": True, "max_tokens": 5,
                                                   "max_completion_tokens": 9})
    assert len(texts) == 5
    texts, _ = _stream(server, "/v1/completions", {"prompt": "a b", "stream": True})
    assert len(texts) == 16


def test_arrivals_log_each_generation_post_once_and_reset(server):
    httpx.get(server + "/arrivals", timeout=10)
    for _ in range(3):
        _stream(server, "/v1/chat/completions", GUIDELLM_CHAT)
    httpx.get(server + "/health", timeout=10)  # not a generation request: not logged
    first = httpx.get(server + "/arrivals", timeout=10).json()
    assert len(first) == 3 and first == sorted(first)
    assert httpx.get(server + "/arrivals", timeout=10).json() == []
