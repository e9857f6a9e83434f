"""Streaming OpenAI-API client: one request in, one filled ``RequestRecord`` out.

Two transports behind one shape, so the benchmark can measure both: ``httpx`` (the design
card's choice) and ``aiohttp``. The runner's default is whichever the benchmark measured
faster on the hot path (see ``DEFAULT_CLIENT`` and benchmarks/loadgen_bench.py).

Times in a record are wall-clock seconds (epoch) read through ``Clock``: one anchor of
``time.time()`` against ``time.perf_counter()`` per process, so readings are monotonic and
precise, and shards on one machine agree on the epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Mapping, Sequence, Sized
from typing import Any, Literal, Protocol

import aiohttp
import httpx
import orjson

from orchestrator.errors import EnvironmentProblem
from orchestrator.loadgen.workloads import RequestSpec
from orchestrator.records import RequestRecord

ClientKind = Literal["aiohttp", "httpx"]
Api = Literal["completions", "chat"]
ERROR_TEXT_MAX = 300


class Clock:
    """Wall-clock seconds from a perf_counter anchor (monotonic, sub-microsecond)."""

    def __init__(self) -> None:
        self.wall0 = time.time()
        self.perf0 = time.perf_counter()

    def now(self) -> float:
        return self.wall0 + (time.perf_counter() - self.perf0)

    def perf_at(self, wall: float) -> float:
        """The perf_counter reading at which the wall clock will read ``wall``."""
        return self.perf0 + (wall - self.wall0)


def request_body(spec: RequestSpec, model: str, api: Api) -> bytes:
    """The JSON body vLLM expects: streamed, usage included, exact length (ignore_eos)."""
    doc: dict[str, Any] = {
        "model": model,
        "max_tokens": spec.max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 1.0,
    }
    if api == "chat":
        msgs = spec.messages or (("user", spec.prompt),)
        doc["messages"] = [{"role": r, "content": c} for r, c in msgs]
    else:
        doc["prompt"] = spec.prompt
    return orjson.dumps(doc)


def endpoint_path(api: Api) -> str:
    return "/v1/chat/completions" if api == "chat" else "/v1/completions"


class _StreamState:
    """Parses SSE lines into the record as they arrive."""

    __slots__ = ("rec", "clock", "chat", "done", "last", "max_gap", "hasher", "tail", "text")

    def __init__(self, rec: RequestRecord, clock: Clock, chat: bool, text: list[str] | None = None):
        self.rec, self.clock, self.chat = rec, clock, chat
        self.text = text  # the returned text's pieces, when the caller keeps them (sessions)
        self.done = False
        self.last: float | None = None
        self.max_gap = 0.0
        self.hasher = hashlib.blake2b(digest_size=8)
        self.tail = b""

    def feed(self, data: bytes) -> None:
        """Bytes as they arrive (any split): complete lines are parsed, the rest is kept.
        Reading whole network reads and splitting here costs far less than a line iterator;
        events that arrived in one read share its timestamp, which is when they arrived."""
        if self.tail:
            data = self.tail + data
        lines = data.split(b"\n")
        self.tail = lines.pop()
        now = self.clock.now()
        for raw in lines:
            if raw.startswith(b"data:"):
                self.event(raw[5:].strip(), now)

    def event(self, data: bytes, now: float) -> None:
        if data == b"[DONE]":
            self.done = True
            return
        doc = orjson.loads(data)
        choices = doc.get("choices") or ()
        if choices:
            c0 = choices[0]
            text = (c0.get("delta") or {}).get("content") if self.chat else c0.get("text")
            if text:
                rec = self.rec
                if rec.first_token_s is None:
                    rec.first_token_s = now
                elif self.last is not None and now - self.last > self.max_gap:
                    self.max_gap = now - self.last
                self.last = now
                rec.last_token_s = now
                rec.chunks += 1
                self.hasher.update(text.encode())
                if self.text is not None:
                    self.text.append(text)
        usage = doc.get("usage")
        if usage:
            self.rec.output_tokens = usage.get("completion_tokens")
            self.rec.server_prompt_tokens = usage.get("prompt_tokens")
            details = usage.get("prompt_tokens_details") or {}
            self.rec.cached_tokens = details.get("cached_tokens")

    def finish(self) -> None:
        rec = self.rec
        rec.max_gap_s = self.max_gap if rec.chunks > 1 else (0.0 if rec.chunks else None)
        rec.output_hash = self.hasher.hexdigest() if rec.chunks else ""
        if self.done:
            rec.status = "ok"
        else:
            rec.status = "disconnect"
            rec.error = rec.error or "stream ended before [DONE]"

    def http_error(self, text: str, reason: str | None) -> None:
        """The server answered with an error status: its body (else the reason) is the error."""
        self.rec.status, self.rec.error = "http_error", text[:ERROR_TEXT_MAX] or reason

    def broken(self, e: BaseException) -> None:
        """The connection failed mid-request: what arrived is kept, the exception is the error."""
        self.finish()
        self.rec.status, self.rec.error = "disconnect", f"{type(e).__name__}: {e}"[:ERROR_TEXT_MAX]


class StreamingClient(Protocol):
    """What the runner needs from a transport."""

    async def stream(self, spec: RequestSpec, rec: RequestRecord, text: list[str] | None = None) -> None: ...

    async def warm(self, connections: int) -> None: ...

    async def close(self) -> None: ...


class _Base:
    def __init__(self, base_url: str, model: str, api: Api, clock: Clock, max_connections: int,
                 headers: Mapping[str, str] | None = None):
        self.url = base_url.rstrip("/") + endpoint_path(api)
        # Extra headers (e.g. an API key) ride on every request; the body type is ours.
        self.headers = {**(headers or {}), "Content-Type": "application/json"}
        self.health_url = base_url.rstrip("/") + "/health"
        self.model, self.api, self.clock = model, api, clock
        self.chat = api == "chat"
        self.max_connections = max_connections

    def _begin(self, spec: RequestSpec, rec: RequestRecord, text: list[str] | None) -> tuple[bytes, _StreamState]:
        """The request's body and the state its stream fills; the record is sent now."""
        body = request_body(spec, self.model, self.api)
        st = _StreamState(rec, self.clock, self.chat, text)
        rec.sent_s = self.clock.now()
        return body, st


class AiohttpClient(_Base):
    """aiohttp transport: a TCP pool sized by the caller, SSE read line by line."""

    def __init__(self, base_url: str, model: str, api: Api, clock: Clock, max_connections: int = 0,
                 headers: Mapping[str, str] | None = None):
        super().__init__(base_url, model, api, clock, max_connections, headers)
        self.session: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self.session is None:
            conn = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0, keepalive_timeout=60)
            self.session = aiohttp.ClientSession(
                connector=conn, timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
        return self.session

    async def warm(self, connections: int) -> None:
        s = self._session()

        async def one() -> None:
            try:
                async with s.get(self.health_url, headers=self.headers) as r:
                    await r.read()
            except aiohttp.ClientError:
                pass

        await asyncio.gather(*(one() for _ in range(connections)))

    async def stream(self, spec: RequestSpec, rec: RequestRecord, text: list[str] | None = None) -> None:
        body, st = self._begin(spec, rec, text)
        try:
            async with self._session().post(
                self.url, data=body, headers=self.headers
            ) as resp:
                rec.http_status = resp.status
                if resp.status != 200:
                    st.http_error(await resp.text(errors="replace"), resp.reason)
                    return
                async for data in resp.content.iter_any():
                    st.feed(data)
        except (aiohttp.ClientError, ConnectionError) as e:
            st.broken(e)
            return
        st.finish()

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None


class HttpxClient(_Base):
    """httpx transport (the design card's choice)."""

    def __init__(self, base_url: str, model: str, api: Api, clock: Clock, max_connections: int = 0,
                 headers: Mapping[str, str] | None = None):
        super().__init__(base_url, model, api, clock, max_connections, headers)
        limits = httpx.Limits(
            max_connections=max_connections or None, max_keepalive_connections=max_connections or None
        )
        self.client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None))

    async def warm(self, connections: int) -> None:
        async def one() -> None:
            with contextlib.suppress(httpx.HTTPError):
                await self.client.get(self.health_url, headers=self.headers)

        await asyncio.gather(*(one() for _ in range(connections)))

    async def stream(self, spec: RequestSpec, rec: RequestRecord, text: list[str] | None = None) -> None:
        body, st = self._begin(spec, rec, text)
        try:
            async with self.client.stream(
                "POST", self.url, content=body, headers=self.headers
            ) as resp:
                rec.http_status = resp.status_code
                if resp.status_code != 200:
                    st.http_error((await resp.aread()).decode(errors="replace"), resp.reason_phrase)
                    return
                async for data in resp.aiter_raw():
                    st.feed(data)
        except (httpx.TransportError, ConnectionError) as e:
            st.broken(e)
            return
        st.finish()

    async def close(self) -> None:
        await self.client.aclose()


def make_client(
    kind: ClientKind, base_url: str, model: str, api: Api, clock: Clock, max_connections: int = 0,
    headers: Mapping[str, str] | None = None,
) -> StreamingClient:
    """A transport by name; ``max_connections`` 0 means as many as the load needs."""
    if kind == "aiohttp":
        return AiohttpClient(base_url, model, api, clock, max_connections, headers)
    if kind == "httpx":
        return HttpxClient(base_url, model, api, clock, max_connections, headers)
    raise ValueError(f"unknown client {kind!r} (aiohttp or httpx)")


def new_record(spec: RequestSpec, phase: str, scheduled_s: float) -> RequestRecord:
    """The record of a scheduled request before it is sent (status ``unsent``)."""
    return RequestRecord(
        request_id=spec.request_id,
        conversation_id=spec.conversation_id,
        turn=spec.turn,
        phase=phase,
        scheduled_s=scheduled_s,
        prompt_tokens=spec.prompt_tokens,
        output_tokens_asked=spec.max_tokens,
        prompt_hash=spec.prompt_hash,
    )


def check_lengths(requests: Sequence[RequestSpec], offsets: Sized, phases: Sequence[str]) -> None:
    if not (len(requests) == len(offsets) == len(phases)):
        raise ValueError(
            f"requests ({len(requests)}), offsets ({len(offsets)}) and phases ({len(phases)}) differ in length"
        )


class TokenizeCounter:
    """A prompt's token count by the served model's own tokenizer: vLLM's ``POST /tokenize``
    (``{"model", "prompt"}`` in, ``{"count", ...}`` out). A ``TokenCounter`` for
    ``workloads.fit_prompts``; close it (or use it as a context manager) when done."""

    def __init__(self, base_url: str, model: str, headers: Mapping[str, str] | None = None,
                 timeout_s: float = 30.0, transport: httpx.BaseTransport | None = None):
        self.model = model
        self._client = httpx.Client(base_url=base_url, headers=dict(headers or {}), timeout=timeout_s,
                                    transport=transport)

    def __call__(self, text: str) -> int:
        r = self._client.post("/tokenize", json={"model": self.model, "prompt": text})
        if r.status_code != 200:
            raise EnvironmentProblem(f"POST /tokenize answered HTTP {r.status_code}: {r.text[:ERROR_TEXT_MAX]} "
                                     "(a vLLM server has it; the simulated and null servers do not)")
        return int(r.json()["count"])

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> TokenizeCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
