"""A small OpenAI-compatible server for tests of the external backend, written independently of
the simulator: an aiohttp app on loopback in a background thread, whose faults are the ones the
validity guards exist for.

Faults (``FaultConfig``), applied to streamed requests (the load) unless ``fault_everything``:
- ``ignore_max_tokens``: replies of any length up to 3x the asked one (output_limit);
- ``frozen_output``: every reply the same words (frozen_randomness);
- ``stall_s``: each reply pauses once, mid-stream (stalls);
- ``drop_after``: after that many streamed requests the server goes bad: in-flight streams are
  cut and every later connection is closed unanswered (the server is lost);
- ``cache_hits``: reports prompt tokens as prefix-cache hits, in ``usage`` and ``/metrics``, as
  a server answering repeated prompts would (prefix_hit_rate).
The non-streamed test completion a readiness check sends is answered honestly (unless
``fault_everything``), so a fault shows under load, where the guards must catch it.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

WORDS = ("amber", "birch", "cedar", "dune", "ember", "fjord", "grove", "heath", "inlet", "juniper",
         "kelp", "lagoon", "moss", "nettle", "oak", "pine", "quartz", "reed", "sage", "tundra")


@dataclass(frozen=True)
class FaultConfig:
    model: str = "fault-model"
    ttft_s: float = 0.01  # before the first token
    tpot_s: float = 0.002  # between tokens
    ignore_max_tokens: bool = False
    frozen_output: bool = False
    stall_s: float = 0.0
    drop_after: int = 0
    cache_hits: bool = False
    fault_everything: bool = False  # faults on the readiness test completion too
    api_key: str | None = None  # require `Authorization: Bearer <key>`
    echo_auth: bool = False  # streamed requests fail with a 500 whose body echoes the request's key
    version: str | None = None  # GET /version and a vllm:build_info label
    server_header: str = "fault-server/1.0"


class FaultServer:
    """The app plus its counters; ``start()`` serves it on 127.0.0.1 in a thread."""

    def __init__(self, config: FaultConfig):
        self.config = config
        self.received = 0  # generation requests
        self.streamed = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.seen_headers: list[dict[str, str]] = []
        self.dropping = False
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="fault-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> FaultServer:
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("fault server did not start")
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> FaultServer:
        return self if self._thread.is_alive() else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(middlewares=[self._gate])
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/version", self._version)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    # -- every request ---------------------------------------------------------------------
    @web.middleware
    async def _gate(self, request: web.Request, handler) -> web.StreamResponse:
        if self.dropping:
            _cut(request)
            raise asyncio.CancelledError  # nothing is answered on a cut connection
        self.seen_headers.append(dict(request.headers))
        key = self.config.api_key
        if key is not None and request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "invalid API key"}, status=401)
        resp = await handler(request)
        resp.headers["Server"] = self.config.server_header
        return resp

    async def _models(self, request: web.Request) -> web.Response:
        m = self.config.model
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "owned_by": "fault-server", "root": m, "max_model_len": 32768}]},
            headers={"Server": self.config.server_header})

    async def _version(self, request: web.Request) -> web.Response:
        if self.config.version is None:
            raise web.HTTPNotFound()
        return web.json_response({"version": self.config.version})

    async def _metrics(self, request: web.Request) -> web.Response:
        m = self.config.model
        lines = [
            "# TYPE python_info gauge", 'python_info{version="3.11.9"} 1.0',
            "# TYPE vllm:prefix_cache_queries counter",
            f'vllm:prefix_cache_queries_total{{model_name="{m}"}} {float(self.prompt_tokens)}',
            "# TYPE vllm:prefix_cache_hits counter",
            f'vllm:prefix_cache_hits_total{{model_name="{m}"}} {float(self.cached_tokens)}',
            "# TYPE vllm:cache_config_info gauge",
            'vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="4096"} 1.0',
        ]
        if self.config.version:
            lines += ["# TYPE vllm:build_info gauge", f'vllm:build_info{{version="{self.config.version}"}} 1.0']
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    # -- generation ------------------------------------------------------------------------
    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        cfg = self.config
        body = await request.json()
        if body.get("model") != cfg.model:
            return web.json_response({"error": f"model {body.get('model')!r} not served"}, status=404)
        if chat:
            prompt = " ".join(str(msg.get("content", "")) for msg in body.get("messages", []))
        else:
            prompt = str(body.get("prompt", ""))
        stream = bool(body.get("stream"))
        faulty = stream or cfg.fault_everything
        if faulty and cfg.echo_auth:  # what a careless proxy's error page does
            self.received += 1
            sent = request.headers.get("Authorization", "").split()[-1:]
            return web.json_response({"error": f"upstream refused the key {' '.join(sent)} for this route"},
                                     status=500)
        self.received += 1
        number = self.received
        if stream:
            self.streamed += 1
        asked = int(body.get("max_tokens", 16))
        rng = random.Random(number)
        n = rng.randint(1, 3 * asked) if faulty and cfg.ignore_max_tokens else asked
        words = (list(WORDS) * (n // len(WORDS) + 1))[:n] if faulty and cfg.frozen_output else [
            rng.choice(WORDS) for _ in range(n)]
        prompt_tokens = len(prompt.split())
        cached = max(prompt_tokens - 1, 0) if faulty and cfg.cache_hits else 0
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        rid = f"cmpl-{uuid.uuid4().hex[:16]}"
        if not stream:
            await asyncio.sleep(cfg.ttft_s + cfg.tpot_s * n)
            text = " " + " ".join(words)
            choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text},
                                       "finish_reason": "length"} if chat else
                                      {"index": 0, "text": text, "finish_reason": "length"})
            return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                      "created": int(time.time()), "model": cfg.model, "choices": [choice],
                                      "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Server": cfg.server_header})
        await resp.prepare(request)
        await asyncio.sleep(cfg.ttft_s)
        for i, word in enumerate(words):
            if i and faulty and cfg.stall_s and i == n // 2:
                await asyncio.sleep(cfg.stall_s)
            elif i:
                await asyncio.sleep(cfg.tpot_s)
            if cfg.drop_after and self.streamed > cfg.drop_after:
                self.dropping = True
            if self.dropping:
                _cut(request)
                return resp
            await resp.write(_chunk(rid, cfg.model, chat, " " + word, None))
        await resp.write(_chunk(rid, cfg.model, chat, "", "length"))
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(b"data: " + json.dumps({"id": rid, "model": cfg.model, "choices": [],
                                                     "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _cut(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()


def _chunk(rid: str, model: str, chat: bool, text: str, finish: str | None) -> bytes:
    choice: dict[str, Any] = ({"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}
                              if chat else {"index": 0, "text": text, "finish_reason": finish})
    doc = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
           "created": int(time.time()), "model": model, "choices": [choice]}
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def start_fault_server(**config: Any) -> FaultServer:
    """A running fault server; ``.url`` (no /v1) and ``.stop()``."""
    return FaultServer(FaultConfig(**config)).start()


def external_plan(url_a: str, url_b: str, model: str = "fault-model", metrics: bool = True,
                  **changes: Any) -> dict[str, Any]:
    """A small external plan (as data) whose arms send load to ``url_a`` and ``url_b``: short
    prompts and replies, one class, short points, one block, no retries, the default guard
    bounds (a run's validity depends on the machine's load: tests assert on what it cannot
    change); ``changes`` replace top-level sections."""
    def arm(url: str, gpu: str) -> dict[str, Any]:
        ep: dict[str, Any] = {"url": url, "model": model}
        if metrics:
            ep["metrics_url"] = f"{url}/metrics"
        return {"endpoint": ep, "labels": {"gpu": gpu, "layout": "colocated", "replicas": 1}}

    data: dict[str, Any] = {
        "name": "external-small",
        "model": "qwen3-8b",
        "arms": {"A": arm(url_a, "H100-SXM"), "B": arm(url_b, "H200")},
        "workload": {"arrival": {"process": "poisson"},
                     "prompts": {"input_tokens": {"mean": 64, "dist": "fixed"}, "conversations": 5000},
                     "output_tokens": 16},
        "classes": ["standard"],
        "search": {"rate": {"min": 4, "max": 16}, "precision": 0.4, "point_s": 2, "warmup_s": 0.5,
                   "cooldown_s": 0.5, "max_points": 2, "use_prior": False},
        "design": {"blocks": 1, "order": "ABBA", "seed": 3, "max_retries": 0},
        "backend": "external",
    }
    data.update(changes)
    return data
