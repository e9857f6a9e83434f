"""A database outage during a point loses nothing: batches spool locally and are flushed, in
order, when PostgreSQL answers again. The outage is real: a TCP proxy in front of the private
PostgreSQL refuses and drops connections for a while."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from orchestrator.control.spool import SpoolingSink
from orchestrator.loadgen.null_server import NullServerConfig, NullServerProcess
from orchestrator.loadgen.runner import run_point
from orchestrator.loadgen.schedules import open_loop_offsets, point_phases
from orchestrator.loadgen.workloads import build_requests
from orchestrator.plan import OpenLoop, Workload
from orchestrator.records import RequestRecord
from orchestrator.store import Store

pytestmark = pytest.mark.timeout(180)


class FlakyProxy:
    """Forwards 127.0.0.1:port to a target; `down()` drops every connection and refuses new ones."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.loop = asyncio.new_event_loop()
        self.server: asyncio.AbstractServer | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.up()

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            w.close()
            return
        self.writers.update({w, uw})
        await asyncio.gather(self._pipe(r, uw), self._pipe(ur, w))

    def up(self) -> None:
        async def start():
            self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        self._call(start())

    def down(self) -> None:
        async def stop():
            assert self.server is not None
            self.server.close()
            for w in list(self.writers):
                w.transport.abort()
            self.writers.clear()
        self._call(stop())

    def close(self) -> None:
        self.down()
        self.loop.call_soon_threadsafe(self.loop.stop)


def _records(n: int, start: int = 0) -> list[RequestRecord]:
    return [RequestRecord(request_id=i, conversation_id=i, turn=0, phase="measure", scheduled_s=float(i),
                          status="ok", output_tokens_asked=8, output_tokens=8) for i in range(start, start + n)]


def _point(store: Store) -> int:
    from tests.e2e.helpers import small_plan

    plan = small_plan(name="spool-test")
    reg = store.register_plan(plan)
    exp = store.create_experiment(reg.id)
    run = store.start_run(exp, "A", 0, 0, 0, store.deployment_config(plan, "A"))
    return store.record_point(run, seq=0, window_start_s=0.0, window_end_s=1.0, offered_rate=1.0)


def test_batches_spool_during_an_outage_and_flush_in_order(pg_url: str, tmp_path: Path) -> None:
    proxy = FlakyProxy(make_url(pg_url).port)
    url = make_url(pg_url).set(port=proxy.port).render_as_string(hide_password=False)
    store = Store.open(url)
    try:
        point_id = _point(store)
        sink = SpoolingSink(store, point_id, tmp_path)
        sink.write(_records(100))
        proxy.down()
        sink.write(_records(100, 100))
        sink.write(_records(100, 200))
        assert sink.pending and sink.spooled_batches == 2
        proxy.up()
        sink.write(_records(100, 300))  # flushes the spool first, then writes
        assert not sink.pending
        got = store.requests(point_id)
        assert [r.request_id for r in got] == list(range(400))
    finally:
        store.close()
        proxy.close()


def test_outage_during_a_real_point_loses_no_record(pg_url: str, tmp_path: Path) -> None:
    proxy = FlakyProxy(make_url(pg_url).port)
    url = make_url(pg_url).set(port=proxy.port).render_as_string(hide_password=False)
    store = Store.open(url)
    try:
        point_id = _point(store)
        sink = SpoolingSink(store, point_id, tmp_path)
        wl = Workload.model_validate({"prompts": {"input_tokens": {"mean": 64}}, "output_tokens": 16})
        offsets = open_loop_offsets(OpenLoop(process="constant"), 40.0, 5.0, 1)
        requests = build_requests(wl, len(offsets), 1)
        phases = point_phases(offsets, 0.5, 4.0)

        def outage() -> None:
            time.sleep(1.5)
            proxy.down()
            time.sleep(2.0)
            proxy.up()

        t = threading.Thread(target=outage)
        with NullServerProcess(NullServerConfig()) as server_url:
            t.start()
            summary = asyncio.run(run_point(server_url, "null", requests, offsets, phases, sink=sink,
                                            flush_s=0.25, batch_size=20, request_timeout_s=10))
        t.join()
        assert sink.spooled_batches > 0, "the outage never hit a batch: the test proved nothing"
        assert sink.flush()
        stored = store.requests(point_id)
        assert len(stored) == summary.scheduled == len(requests)
        assert sorted(r.request_id for r in stored) == sorted(s.request_id for s in requests)
    finally:
        store.close()
        proxy.close()
