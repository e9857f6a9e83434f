"""A minimal streaming completion client for the real-engine tests (reads SSE, keeps usage)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx


@dataclass
class Streamed:
    chunks: int = 0
    text: list[str] = field(default_factory=list)
    usage: dict = field(default_factory=dict)
    finish_reason: str | None = None


def stream_completion(url: str, model: str, prompt: str, max_tokens: int) -> Streamed:
    out = Streamed()
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 1.0, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.Client(timeout=120.0) as client, client.stream(
        "POST", f"{url}/v1/completions", json=body
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if event.get("usage"):
                out.usage = event["usage"]
            for choice in event.get("choices", []):
                out.chunks += 1
                out.text.append(choice.get("text", ""))
                out.finish_reason = choice.get("finish_reason") or out.finish_reason
    return out
