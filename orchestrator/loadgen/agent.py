"""The in-cluster load generator: `orch loadgen agent`, a pod next to an arm's router that
sends a point's load when the controller asks, so measured traffic never crosses a
port-forward or the API server (issue 29). The controller keeps only control: it sends the
point's requests and schedule, and reads the records back as they are taken.

Protocol (HTTP/1.1, JSON; ``wire`` has the encodings):

- ``GET /health``: 200 once the agent serves.
- ``GET /v1/path?url=U``: the round trip from here to ``U`` (``path.measure_path``), what the
  access_path guard judges for load sent from this pod.
- ``POST /v1/points`` (body gzip'd JSON: ``mode`` "open" or "sessions", ``url``, ``model``,
  ``send`` (the driver's keyword arguments), and ``requests``/``offsets``/``phases`` for an
  open loop or ``workload``/``starts``/``seed``/``duration_s``/``warmup_s``/``measure_s`` for
  live sessions): the point runs here with the same runner a local point uses; the answer is
  a stream of lines, ``{"records": [...]}`` per batch as the runner hands it over (when
  ``stream`` is true), then ``{"summary": {...}}`` (and ``sent``: the sessions' requests), or
  ``{"error": "..."}``. One point at a time: a second is refused with 409.

If the controller's stream breaks mid-point, an open-loop point stops sending at once (its
remaining requests are recorded unsent, in-flight ones end as at a stop) so an abandoned point
never loads the arm under the next attempt; live sessions run to their deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import signal
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from aiohttp import web

from orchestrator.loadgen.driver import HTTP_DRIVER
from orchestrator.loadgen.path import measure_path
from orchestrator.loadgen.runner import PointSummary
from orchestrator.loadgen.wire import WireError, record_rows, spec_rows, specs_from, summary_doc
from orchestrator.loadgen.workloads import RequestSpec
from orchestrator.plan.workload import Workload
from orchestrator.records import RequestRecord

AGENT_PORT = 8000
# The keyword arguments of a driver call the controller may set (``Send.kwargs``).
SEND_KEYS = ("api", "request_timeout_s", "deadline_s", "headers")
MAX_BODY = 1 << 30  # a point's requests, gzip'd: far below this


class Agent:
    """The agent's state: at most one point running."""

    def __init__(self) -> None:
        self.busy = asyncio.Lock()
        self.points = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/path", self.path)
        app.router.add_post("/v1/points", self.point)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "points": self.points, "busy": self.busy.locked()})

    async def path(self, request: web.Request) -> web.Response:
        url = request.query.get("url")
        if not url:
            return web.json_response({"error": "give ?url="}, status=400)
        samples = min(max(int(request.query.get("samples", "30")), 1), 1000)
        return web.json_response(await asyncio.to_thread(measure_path, url, samples))

    async def point(self, request: web.Request) -> web.StreamResponse:
        if self.busy.locked():
            return web.json_response({"error": "a point is running here"}, status=409)
        async with self.busy:
            try:
                doc = json.loads(gzip.decompress(await request.read()))
                call = _call(doc)
            except (OSError, ValueError, KeyError, TypeError) as e:
                return web.json_response({"error": f"not a point: {type(e).__name__}: {e}"}, status=400)
            self.points += 1
            return await _serve_point(request, call, bool(doc.get("stream", True)))


class _Call:
    """A point to run: which driver method and its arguments."""

    def __init__(self, mode: str, url: str, model: str, send: dict[str, Any], args: dict[str, Any]):
        self.mode, self.url, self.model, self.send, self.args = mode, url, model, send, args


def _call(doc: dict[str, Any]) -> _Call:
    mode = doc["mode"]
    send = {k: doc["send"][k] for k in SEND_KEYS if k in doc["send"]}
    if mode == "open":
        requests = specs_from(doc["requests"])
        offsets = np.asarray(doc["offsets"], dtype=np.float64)
        phases = [str(p) for p in doc["phases"]]
        if not len(requests) == len(offsets) == len(phases):
            raise WireError("requests, offsets and phases differ in length")
        args: dict[str, Any] = {"requests": requests, "offsets": offsets, "phases": phases}
    elif mode == "sessions":
        args = {"workload": Workload.model_validate(doc["workload"]),
                "starts": np.asarray(doc["starts"], dtype=np.float64), "seed": int(doc["seed"]),
                "duration_s": float(doc["duration_s"]), "warmup_s": float(doc["warmup_s"]),
                "measure_s": None if doc["measure_s"] is None else float(doc["measure_s"])}
    else:
        raise WireError(f"mode {mode!r}: open or sessions")
    return _Call(mode, str(doc["url"]), str(doc["model"]), send, args)


async def _serve_point(request: web.Request, call: _Call, stream: bool) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    abandoned = threading.Event()
    sent: list[RequestSpec] = []

    def sink(batch: list[RequestRecord]) -> None:  # in the runner's sink thread
        if stream and batch:
            rows = record_rows(batch)
            loop.call_soon_threadsafe(lines.put_nowait, {"records": rows})

    def stop_when(records: Sequence[RequestRecord], now: float) -> bool:
        return abandoned.is_set()

    def run() -> PointSummary:
        kw: dict[str, Any] = {**call.send, "sink": sink, "keep_records": False}
        if call.mode == "open":
            a = call.args
            return HTTP_DRIVER.open_loop(call.url, call.model, a["requests"], a["offsets"], a["phases"],
                                         stop_when=stop_when, stop_drain_s=0.0, **kw)
        return HTTP_DRIVER.sessions(call.url, call.model, call.args["workload"], call.args["starts"],
                                    seed=call.args["seed"], duration_s=call.args["duration_s"],
                                    warmup_s=call.args["warmup_s"], measure_s=call.args["measure_s"],
                                    sent=sent, **kw)

    async def runner() -> None:
        try:
            summary = await asyncio.to_thread(run)
            end: dict[str, Any] = {"summary": summary_doc(summary)}
            if call.mode == "sessions":
                end["sent"] = spec_rows(sent)
            await lines.put(end)
        except Exception as e:  # noqa: BLE001 - the controller gets the reason, the agent serves on
            await lines.put({"error": f"{type(e).__name__}: {e}"})
        await lines.put(None)

    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    task = asyncio.create_task(runner())
    try:
        while (line := await lines.get()) is not None:
            await response.write(json.dumps(line).encode() + b"\n")
        await response.write_eof()
    except (ConnectionError, asyncio.CancelledError):
        abandoned.set()  # the controller is gone: stop sending, let the runner end
        with contextlib.suppress(Exception):
            await asyncio.shield(task)
        raise
    return response


def serve(host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT (what the kubelet sends at deletion)."""

    async def main() -> None:
        runner = web.AppRunner(Agent().app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port  # port 0: the one the OS chose
        print(f"load generator agent on http://{host}:{bound}", flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="orch loadgen agent")
    p.add_argument("--host", default="0.0.0.0")  # noqa: S104 - a pod serves on its own address
    p.add_argument("--port", type=int, default=AGENT_PORT)
    args = p.parse_args(argv)
    serve(args.host, args.port)


if __name__ == "__main__":
    main()
