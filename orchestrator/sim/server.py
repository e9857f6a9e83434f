"""The simulated engine server: OpenAI-compatible API over aiohttp, tokens paced by the model.

Endpoints as vLLM's: /v1/completions and /v1/chat/completions (stream and not, max_tokens,
ignore_eos, stream_options.include_usage, usage.prompt_tokens_details.cached_tokens),
/v1/models, /health, /metrics (Prometheus text, the engine adapter's names). It speaks the
arm's engine (``ServeConfig.engine``): vLLM's names and its /version, or SGLang's names and
its native endpoints (/get_model_info, /get_server_info and their newer /model_info,
/server_info), where series SGLang does not export are left out. Tokens: one word = one token
(contracts). P/D hand-off as vLLM's NixlConnector through vllm-router: a prefill-role request
carrying ``kv_transfer_params.do_remote_decode`` answers with ``kv_transfer_params`` for the
decoder; a decode-role request carrying ``do_remote_prefill`` skips the prefill and pays the
KV transfer instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from orchestrator.engines import ENGINES, EngineMetrics
from orchestrator.sim.engine import ClusterSpec, Sequence, Worker
from orchestrator.sim.engine.worker import WAITING
from orchestrator.sim.realtime import Pending, SimCluster

OUTPUT_VOCAB = ("alpha", "bravo", "delta", "echo", "gamma", "kilo", "lima", "mike", "nova",
                "oscar", "papa", "rho", "sigma", "tango", "theta", "zulu")


@dataclass(frozen=True)
class Faults:
    """Faults to inject (tests of the validity guards)."""

    ignore_max_tokens: bool = False
    ignore_max_tokens_streaming: bool = False
    stall_every: int = 0
    stall_ms: float = 0.0
    die_after: int = 0
    frozen_output: bool = False


@dataclass(frozen=True)
class ServeConfig:
    """What one sim server process serves."""

    cluster: ClusterSpec
    served_model_name: str
    role: str = "both"  # both | prefill | decode
    seed: int = 0
    faults: Faults = field(default_factory=Faults)
    spin_ms: float = 0.0  # yield-wait the last ms of each step: sub-ms step ends, costs CPU
    engine_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    engine: str = "vllm"  # the engine it speaks: an adapter's kind (its metric names, endpoints)

    @property
    def metrics(self) -> EngineMetrics:
        return ENGINES[self.engine].metrics


class _Collector:
    def __init__(self, server: SimServer):
        self.server = server

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        s = self.server
        m = s.config.metrics
        ws: list[Worker] = s.cluster.workers
        lab = ["model_name", "engine"]
        val = [s.config.served_model_name, "0"]
        seen: set[str] = set()  # SGLang's prefix queries are its prompt-token counter: once

        def family(kind: type[GaugeMetricFamily] | type[CounterMetricFamily], name: str, doc: str,
                   v: float) -> Iterator[Metric]:
            if name and name not in seen:  # an empty name: the engine exports no such series
                seen.add(name)
                f = kind(name, doc, labels=lab)
                f.add_metric(val, v)
                yield f

        yield from family(GaugeMetricFamily, m.running, "Requests in the batch.", sum(w.running for w in ws))
        yield from family(GaugeMetricFamily, m.waiting, "Requests waiting.",
                          sum(len(w.waiting) + len(w.transferring) for w in ws))
        yield from family(GaugeMetricFamily, m.kv_usage, "KV cache usage (0-1).",
                          max((w.memory.usage for w in ws), default=0.0))
        yield from family(CounterMetricFamily, m.prompt_tokens, "Prompt tokens.",
                          sum(w.prompt_tokens_total for w in ws))
        yield from family(CounterMetricFamily, m.prefix_queries, "Prompt tokens queried.",
                          sum(w.memory.queries for w in ws))
        yield from family(CounterMetricFamily, m.prefix_hits, "Prompt tokens hit.", sum(w.memory.hits for w in ws))
        yield from family(CounterMetricFamily, m.generation_tokens, "Generated tokens.",
                          sum(w.generation_tokens_total for w in ws))
        yield from family(CounterMetricFamily, m.preemptions, "Preemptions.", sum(w.preemptions for w in ws))
        yield from family(CounterMetricFamily, m.request_success, "Finished requests.", s.finished)
        # Not an engine's series: steps that ended so late the timeline restarted from then (the
        # requests in flight then ran longer than the model says: the machine was the bottleneck).
        yield from family(CounterMetricFamily, "orch_sim_timeline_restarts",
                          "Timeline restarts after falling behind the model.", s.cluster.timeline_restarts)


class SimServer:
    """The aiohttp application around a SimCluster."""

    def __init__(self, config: ServeConfig):
        self.config = config
        m = config.metrics  # the simulated engine speaks its arm's engine's names
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        # Not a vLLM series: how late each step's tokens left against the model's timeline, so
        # a user (and sim_bench) can see when the simulator itself is the bottleneck.
        timing_buckets = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)
        self.lateness = Histogram(
            "orch_sim_step_lateness_seconds", "Lateness of step ends against the model.", labels,
            registry=self.registry, buckets=timing_buckets,
        ).labels(config.served_model_name, "0")
        self.step_error = Histogram(
            "orch_sim_step_time_error_seconds",
            "|step duration - the model's| of steps that ran back to back.", labels,
            registry=self.registry, buckets=timing_buckets,
        ).labels(config.served_model_name, "0")
        self.cluster = SimCluster(config.cluster, role=config.role, seed=config.seed, on_step=self._stepped,
                                  on_timing=self._timing, spin_s=config.spin_ms / 1000.0)
        self.ttft = Histogram(m.ttft, "TTFT.", labels, registry=self.registry,
                              buckets=(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                       1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0))
        itl_buckets = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                       1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
        self.itl = Histogram(m.itl, "Inter-token latency.", labels,
                             registry=self.registry, buckets=itl_buckets)
        # vLLM v1's per-request phase histograms (vllm/v1/metrics/stats.py, 0.32), from the
        # engine's timeline as vLLM's engine-core timestamps: TPOT = (last - first token) /
        # (tokens - 1); prefill = first token - first scheduled (the start of the step that
        # admitted it; a preemption does not restart it); decode = last - first token.
        # `orch device fit --experiment` fits a device profile from them.
        phase_buckets = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                         60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
        # An engine without one of them (SGLang: no phase histograms) exports nothing under it.
        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            if not name:
                return None
            return Histogram(name, doc, labels, registry=self.registry,
                             buckets=buckets).labels(config.served_model_name, "0")

        self.tpot = histogram(m.tpot, "Histogram of time_per_output_token_seconds per request.", itl_buckets)
        self.prefill_time = histogram(m.prefill_time, "Histogram of time spent in PREFILL phase for request.",
                                      phase_buckets)
        self.decode_time = histogram(m.decode_time, "Histogram of time spent in DECODE phase for request.",
                                     phase_buckets)
        # Requests not yet scheduled, with when each was (Pending -> step start), for prefill time.
        self._unscheduled: set[Pending] = set()
        self._scheduled_at: dict[Pending, float] = {}
        self.registry.register(_Collector(self))
        self.finished = 0
        self.received = 0
        self.on_die: Callable[[], object] = lambda: os._exit(1)
        self.app = web.Application()
        self.app.router.add_get("/health", self.health)
        if config.engine == "sglang":  # SGLang's native endpoints (it has no /version)
            for path in ("/get_model_info", "/model_info"):
                self.app.router.add_get(path, self.model_info)
            for path in ("/get_server_info", "/server_info"):
                self.app.router.add_get(path, self.server_info)
        else:
            self.app.router.add_get("/version", self.version)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_get("/metrics", self.metrics)
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.on_startup.append(self._start)
        self.app.on_cleanup.append(self._stop)

    def _timing(self, late: float, step_error: float | None) -> None:
        self.lateness.observe(late)
        if step_error is not None:
            self.step_error.observe(step_error)

    def _stepped(self, worker: Worker, duration: float) -> None:
        """After a step of ``worker``: requests it admitted were scheduled at the step's start
        (only those still unscheduled are looked at: the waiting ones, not the batch)."""
        if not self._unscheduled:
            return
        start = worker.ends[-1] - duration
        for p in [p for p in self._unscheduled if p.worker is worker and p.seq.state != WAITING]:
            self._unscheduled.discard(p)
            self._scheduled_at[p] = start

    async def _start(self, app: web.Application) -> None:
        self.cluster.start()

    async def _stop(self, app: web.Application) -> None:
        await self.cluster.stop()

    # --- plain endpoints ---------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def version(self, request: web.Request) -> web.Response:
        """As vLLM's ``GET /version``: which engine answers (backends fingerprint it)."""
        from orchestrator import __version__

        return web.json_response({"version": f"sim-{__version__}"})

    async def models(self, request: web.Request) -> web.Response:
        name = self.config.served_model_name
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": int(time.time()), "owned_by": self.config.engine,
             "root": name, "parent": None, "max_model_len": 40960}]})

    def _disaggregation_mode(self) -> str:
        return {"prefill": "prefill", "decode": "decode"}.get(self.config.role, "null")

    async def model_info(self, request: web.Request) -> web.Response:
        """As SGLang's ``GET /get_model_info`` (the fields a router or a client reads)."""
        name = self.config.served_model_name
        return web.json_response({"model_path": name, "served_model_name": name, "tokenizer_path": name,
                                  "is_generation": True, "preferred_sampling_params": None,
                                  "weight_version": "default", "disaggregation_mode": self._disaggregation_mode(),
                                  "has_image_understanding": False, "has_audio_understanding": False,
                                  "model_type": None, "architectures": None})

    async def server_info(self, request: web.Request) -> web.Response:
        """As SGLang's ``GET /get_server_info``: its settings, live state and version (sim's)."""
        from orchestrator import __version__

        ws = self.cluster.workers
        return web.json_response({
            "model_path": self.config.served_model_name, "served_model_name": self.config.served_model_name,
            "tp_size": self._tp(), "disaggregation_mode": self._disaggregation_mode(),
            "max_running_requests": max((w.model.max_num_seqs for w in ws), default=None),
            "internal_states": [{"num_running_reqs": sum(w.running for w in ws),
                                 "num_queue_reqs": sum(len(w.waiting) for w in ws)}],
            "version": f"sim-{__version__}", "frontend": "python"})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain", charset="utf-8")

    # --- generation ----------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    def _error(self, status: int, message: str, kind: str) -> web.Response:
        return web.json_response({"object": "error", "message": message, "type": kind,
                                  "param": None, "code": status}, status=status)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._error(400, "request body is not JSON", "BadRequestError")
        if not isinstance(body, dict):
            return self._error(400, "request body must be an object", "BadRequestError")
        name = self.config.served_model_name
        if body.get("model", name) != name:
            return self._error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list):
                return self._error(400, "messages must be a list", "BadRequestError")
            words = []
            for m in msgs:
                c = m.get("content", "") if isinstance(m, dict) else ""
                if isinstance(c, list):
                    c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
                words.extend(str(c).split())
        else:
            prompt = body.get("prompt", "")
            if isinstance(prompt, list):
                prompt = " ".join(str(p) for p in prompt)
            words = str(prompt).split()
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return self._error(400, "max_tokens must be a positive integer", "BadRequestError")
        self.received += 1
        n = self._reply_length(max_tokens, bool(body.get("stream")))
        kv_in = body.get("kv_transfer_params") or {}
        remote = bool(kv_in.get("do_remote_prefill")) and self.config.role != "prefill"
        stream = bool(body.get("stream"))
        usage_in_stream = bool((body.get("stream_options") or {}).get("include_usage"))
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        rng = random.Random(0 if self.config.faults.frozen_output else hash((self.config.seed, rid)))
        t0 = time.monotonic()
        pending, done = await self.cluster.generate(words, n, remote=remote)
        self._unscheduled.add(pending)  # before its worker's next step can admit it
        seq = pending.seq
        first_end = last_end = None
        kv_out = self._kv_out(seq, kv_in)
        resp: web.StreamResponse | None = None
        texts: list[str] = []
        last_t: float | None = None
        try:
            if stream:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                   "Cache-Control": "no-cache"})
                await resp.prepare(request)
            first = True
            while True:
                item = await pending.queue.get()
                if item is None:
                    break
                k, last_end = item
                first_end = last_end if first_end is None else first_end
                now = time.monotonic()
                if last_t is None:
                    self.ttft.labels(name, "0").observe(now - t0)
                else:
                    self.itl.labels(name, "0").observe(now - last_t)
                last_t = now
                piece = " " + " ".join(rng.choice(OUTPUT_VOCAB) for _ in range(k))
                texts.append(piece)
                if resp is not None:
                    await resp.write(self._chunk(rid, created, chat, piece, None, first))
                    first = False
        finally:
            done()
            self._unscheduled.discard(pending)
            scheduled = self._scheduled_at.pop(pending, None)
        self.finished += 1
        if first_end is not None and last_end is not None:
            if scheduled is not None and self.prefill_time is not None:
                self.prefill_time.observe(max(0.0, first_end - scheduled))
            if self.decode_time is not None:
                self.decode_time.observe(last_end - first_end)
            if self.tpot is not None:
                self.tpot.observe((last_end - first_end) / (seq.generated - 1) if seq.generated > 1 else 0.0)
        usage = {"prompt_tokens": seq.prompt_tokens, "total_tokens": seq.prompt_tokens + seq.generated,
                 "completion_tokens": seq.generated,
                 "prompt_tokens_details": {"cached_tokens": seq.cached_tokens or 0}}
        if self.config.faults.die_after and self.finished >= self.config.faults.die_after:
            asyncio.get_running_loop().call_later(0.05, self.on_die)
        if resp is not None:
            final = json.loads(self._chunk(rid, created, chat, "", "length", False)[6:-2])
            if kv_out is not None:
                final["kv_transfer_params"] = kv_out
            await resp.write(f"data: {json.dumps(final)}\n\n".encode())
            if usage_in_stream:
                u = {"id": rid, "object": final["object"], "created": created, "model": name,
                     "choices": [], "usage": usage}
                await resp.write(f"data: {json.dumps(u)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        text = "".join(texts)
        if chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": "length"}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        out = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
               "model": name, "choices": [choice], "usage": usage, "kv_transfer_params": kv_out}
        return web.json_response(out)

    def _reply_length(self, max_tokens: int, stream: bool) -> int:
        f = self.config.faults
        if not (f.ignore_max_tokens or (f.ignore_max_tokens_streaming and stream)):
            return max_tokens
        # An ignored limit: the reply ends where the "model" would, anywhere up to 4x. Only on
        # the streaming path (the load's) passes readiness, which does not stream, and reaches
        # the output_limit guard; on every path readiness refuses the server at once.
        return random.Random(self.received).randint(1, 4 * max_tokens)

    def _kv_out(self, seq: Sequence, kv_in: dict) -> dict | None:
        if not kv_in.get("do_remote_decode"):
            return None
        blocks = max(1, -(-seq.prompt_tokens // 16))
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_block_ids": list(range(blocks)), "remote_engine_id": self.config.engine_id,
                "remote_host": "127.0.0.1", "remote_port": 5600,
                "tp_size": self._tp(), "remote_request_id": f"sim-{seq.key}"}

    def _tp(self) -> int:
        c = self.config.cluster
        ws = c.workers or c.prefill or c.decode
        return ws[0].tp if ws else 1

    def _chunk(self, rid: str, created: int, chat: bool, text: str, finish: str | None, first: bool) -> bytes:
        name = self.config.served_model_name
        if chat:
            delta: dict[str, Any] = {"content": text}
            if first:
                delta["role"] = "assistant"
            choice: dict[str, Any] = {"index": 0, "delta": delta if text or first else {},
                                      "logprobs": None, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        doc = {"id": rid, "object": obj, "created": created, "model": name, "choices": [choice]}
        return f"data: {json.dumps(doc)}\n\n".encode()


class SimServerHandle:
    """A sim server running in a background thread (tests, in-process use)."""

    def __init__(self, config: ServeConfig, host: str = "127.0.0.1", port: int = 0):
        self.config = config
        self.host = host
        self._port = port
        self.server: SimServer | None = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="sim-server", daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """Base URL (no /v1)."""
        return f"http://{self.host}:{self.port}"

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as e:  # noqa: BLE001 - reported to the starting thread
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup() if self._runner else asyncio.sleep(0))
        self._loop.close()

    async def _serve(self) -> None:
        self.server = SimServer(self.config)
        self.server.on_die = lambda: asyncio.ensure_future(self._die())
        self._runner = web.AppRunner(self.server.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self._port)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the one site's first socket: (host, port, ...)

    async def _die(self) -> None:
        if self._runner:
            await self._runner.cleanup()
            self._runner = None

    def start(self) -> SimServerHandle:
        self._thread.start()
        self._ready.wait(30)
        if self._error:
            raise self._error
        return self

    def stop(self) -> None:
        """Stop serving and join the thread; idempotent."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


def start_sim_server(config: ServeConfig, host: str = "127.0.0.1", port: int = 0) -> SimServerHandle:
    """Start a sim server in a background thread; ``.url`` and ``.stop()`` on the handle."""
    return SimServerHandle(config, host, port).start()
