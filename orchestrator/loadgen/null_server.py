"""A null OpenAI-compatible server: streams the asked tokens at once, so the load generator
measures itself (calibration, benchmark, tests).

It speaks the same wire format as vLLM and the simulated server: POST /v1/completions and
/v1/chat/completions with ``stream: true``; SSE lines ``data: {json}`` then ``data: [DONE]``;
with ``stream_options.include_usage`` a last chunk carries ``usage`` (prompt tokens = words of
the prompt, completion tokens exact, cached tokens 0). The reply length is ``max_tokens``, or
``max_completion_tokens`` (the chat API's newer name, which guidellm sends), else 16. GET
/health, /v1/models and /metrics (vLLM metric names) answer too.

Written on asyncio's Protocol (no framework) so the server costs as little CPU as possible and
the client is what gets measured. Run it in its own process (``python -m
orchestrator.loadgen.null_server``, or ``NullServerProcess``) so it does not share the
client's event loop or GIL. Misbehaviour for tests is chosen by arrival count (every k-th
request): an HTTP 500, a reply that hangs after its first token, or a dropped connection.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import cast

from orchestrator.engines import engine_for
from orchestrator.loadgen.workloads import VOCAB


@dataclass(frozen=True)
class NullServerConfig:
    """How the null server replies; misbehaviour every k-th request (0 = never)."""

    tokens_per_chunk: int = 1  # words per SSE chunk (vLLM sends one token per chunk)
    token_delay_s: float = 0.0  # pause between chunks (0: all at once)
    first_token_delay_s: float = 0.0  # pause before the first chunk
    error_every: int = 0  # reply HTTP 500 to every k-th request
    hang_every: int = 0  # send one chunk then nothing (the client must time out or cancel)
    drop_every: int = 0  # send one chunk then close the connection
    record_arrivals: bool = False  # keep each POST's arrival time; GET /arrivals returns and resets


_COMPLETION = (
    '{"id":"cmpl-%d","object":"text_completion","created":0,"model":"%s",'
    '"choices":[{"index":0,"text":"%s","logprobs":null,"finish_reason":%s}],"usage":null}'
)
_CHAT = (
    '{"id":"chatcmpl-%d","object":"chat.completion.chunk","created":0,"model":"%s",'
    '"choices":[{"index":0,"delta":{"content":"%s"},"logprobs":null,"finish_reason":%s}],"usage":null}'
)
_USAGE = (
    '{"id":"cmpl-%d","object":"%s","created":0,"model":"%s","choices":[],'
    '"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,'
    '"prompt_tokens_details":{"cached_tokens":0}}}'
)


def _chunked(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _sse(doc: str) -> bytes:
    return _chunked(b"data: " + doc.encode() + b"\n\n")


_DONE = _chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n"
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


class _Counters:
    def __init__(self) -> None:
        self.requests = 0
        self.success = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.arrivals: list[float] = []

    def metrics(self, model: str) -> bytes:
        lab = f'{{model_name="{model}"}}'
        m = engine_for().metrics
        lines = [
            f"# HELP {m.request_success}_total Count of successfully processed requests.",
            f"# TYPE {m.request_success}_total counter",
            f"{m.request_success}_total{lab} {self.success}",
            f"# HELP {m.prompt_tokens}_total Number of prefill tokens processed.",
            f"# TYPE {m.prompt_tokens}_total counter",
            f"{m.prompt_tokens}_total{lab} {self.prompt_tokens}",
            f"# HELP {m.generation_tokens}_total Number of generation tokens processed.",
            f"# TYPE {m.generation_tokens}_total counter",
            f"{m.generation_tokens}_total{lab} {self.generation_tokens}",
            f"# HELP {m.running} Number of requests in model execution batches.",
            f"# TYPE {m.running} gauge",
            f"{m.running}{lab} 0.0",
        ]
        return ("\n".join(lines) + "\n").encode()


def _prompt_words(body: dict) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content") or "").split()) for m in body["messages"])
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        prompt = " ".join(map(str, prompt))
    return len(str(prompt).split())


class _NullProtocol(asyncio.Protocol):
    def __init__(self, cfg: NullServerConfig, counters: _Counters, model: str):
        self.cfg, self.counters, self.model = cfg, counters, model
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server's transport: asyncio's signature names the base class only.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            lines = head.split("\r\n")
            method, path = lines[0].split(" ")[:2]
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4 : head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length :]
            self._handle(method, path, body)

    def _plain(self, status: str, ctype: str, payload: bytes) -> None:
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
            % (status.encode(), ctype.encode(), len(payload), payload)
        )

    def _handle(self, method: str, path: str, body: bytes) -> None:
        path = path.split("?")[0]
        if method == "GET":
            if path == "/metrics":
                self._plain("200 OK", "text/plain; version=0.0.4", self.counters.metrics(self.model))
            elif path == "/arrivals":  # the benchmark's tool-neutral view of the sends
                doc, self.counters.arrivals = self.counters.arrivals, []
                self._plain("200 OK", "application/json", json.dumps(doc).encode())
            elif path == "/health":
                self._plain("200 OK", "text/plain", b"")
            elif path == "/v1/models":
                models = {"object": "list", "data": [{"id": self.model, "object": "model"}]}
                self._plain("200 OK", "application/json", json.dumps(models).encode())
            else:
                self._plain("404 Not Found", "application/json", b'{"error":"not found"}')
            return
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._plain("404 Not Found", "application/json", b'{"error":"not found"}')
            return
        if self.cfg.record_arrivals:
            self.counters.arrivals.append(time.time())
        try:
            req = json.loads(body)
            # Chat clients (guidellm, the OpenAI SDK) may cap the reply with max_completion_tokens.
            max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        except (ValueError, TypeError):
            self._plain("400 Bad Request", "application/json", b'{"error":"bad json"}')
            return
        self.counters.requests += 1
        n = self.counters.requests
        cfg = self.cfg
        if cfg.error_every and n % cfg.error_every == 0:
            self._plain("500 Internal Server Error", "application/json", b'{"error":"null server: injected"}')
            return
        chat = path.endswith("chat/completions")
        include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        prompt_tokens = _prompt_words(req)
        hang = bool(cfg.hang_every and n % cfg.hang_every == 0)
        drop = bool(cfg.drop_every and n % cfg.drop_every == 0)
        chunks = self._chunks(n, max_tokens, chat, include_usage, prompt_tokens)
        assert self.transport is not None
        self.transport.write(_STREAM_HEAD)
        if hang or drop:
            self.transport.write(chunks[0])
            if drop:
                self.transport.close()
            return
        if cfg.token_delay_s == 0 and cfg.first_token_delay_s == 0:
            self.transport.write(b"".join(chunks) + _DONE)
            self._count(prompt_tokens, max_tokens)
        else:
            asyncio.get_running_loop().create_task(self._paced(chunks, prompt_tokens, max_tokens))

    async def _paced(self, chunks: list[bytes], prompt_tokens: int, max_tokens: int) -> None:
        t = self.transport
        assert t is not None
        if self.cfg.first_token_delay_s:
            await asyncio.sleep(self.cfg.first_token_delay_s)
        for i, c in enumerate(chunks):
            if t.is_closing():
                return
            if i and self.cfg.token_delay_s:
                await asyncio.sleep(self.cfg.token_delay_s)
            t.write(c)
        if not t.is_closing():
            t.write(_DONE)
            self._count(prompt_tokens, max_tokens)

    def _count(self, prompt_tokens: int, max_tokens: int) -> None:
        self.counters.success += 1
        self.counters.prompt_tokens += prompt_tokens
        self.counters.generation_tokens += max_tokens

    def _chunks(self, n: int, max_tokens: int, chat: bool, usage: bool, prompt_tokens: int) -> list[bytes]:
        per = max(1, self.cfg.tokens_per_chunk)
        tmpl = _CHAT if chat else _COMPLETION
        out: list[bytes] = []
        # Words start at a per-request offset so replies differ (the frozen-randomness guard).
        words = [VOCAB[(n * 7 + i) % len(VOCAB)] for i in range(max_tokens)]
        for start in range(0, max_tokens, per):
            text = " " + " ".join(words[start : start + per])
            last = start + per >= max_tokens
            out.append(_sse(tmpl % (n, self.model, text, '"length"' if last else "null")))
        if usage:
            obj = "chat.completion.chunk" if chat else "text_completion"
            out.append(_sse(_USAGE % (n, obj, self.model, prompt_tokens, prompt_tokens + max_tokens, max_tokens)))
        return out


async def serve(host: str, port: int, cfg: NullServerConfig, model: str = "null") -> asyncio.Server:
    """Start serving on the running loop; returns the server (port 0 picks a free one)."""
    loop = asyncio.get_running_loop()
    counters = _Counters()
    return await loop.create_server(lambda: _NullProtocol(cfg, counters, model), host, port, backlog=4096)


async def _main(host: str, port: int, cfg: NullServerConfig, model: str) -> None:
    server = await serve(host, port, cfg, model)
    bound = server.sockets[0].getsockname()[1]
    sys.stdout.write(f"{bound}\n")
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m orchestrator.loadgen.null_server [--port P] [--config JSON]``; prints the port."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--model", default="null")
    ap.add_argument("--config", default="{}", help="NullServerConfig fields as JSON")
    a = ap.parse_args(argv)
    cfg = NullServerConfig(**json.loads(a.config))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(a.host, a.port, cfg, a.model))


class NullServerProcess:
    """The null server in a child process on loopback: ``with NullServerProcess(cfg) as url:``."""

    def __init__(self, cfg: NullServerConfig | None = None, model: str = "null", start_timeout_s: float = 20.0):
        self.cfg = cfg or NullServerConfig()
        self.model = model
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> str:
        cmd = [sys.executable, "-m", "orchestrator.loadgen.null_server", "--model", self.model,
               "--config", json.dumps(asdict(self.cfg))]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        assert self.proc.stdout is not None
        try:
            line = self.proc.stdout.readline()  # the port, once bound
        except BaseException:  # Ctrl-C or SIGTERM while it starts: `with` would not stop it
            self.__exit__(None, None, None)
            raise
        if not line.strip().isdigit() or time.monotonic() > deadline:
            self.__exit__(None, None, None)
            raise RuntimeError(f"null server did not start (said {line!r})")
        self.url = f"http://127.0.0.1:{int(line)}"
        return self.url

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self.proc = None


if __name__ == "__main__":
    main()
