"""The in-cluster load generator's protocol (issue 29): `orch loadgen agent` runs a point sent by
``RemoteDriver`` with the runner a local point uses and streams the records back as they are
taken; a controller that goes away mid-point stops the point's sends at once. Loopback only:
the agent and a null server as child processes, every wait bounded."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from orchestrator.errors import TransientError
from orchestrator.loadgen.driver import HTTP_DRIVER
from orchestrator.loadgen.null_server import NullServerProcess
from orchestrator.loadgen.remote import RemoteDriver
from orchestrator.loadgen.workloads import RequestSpec
from orchestrator.records import RequestRecord

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@contextlib.contextmanager
def agent() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "loadgen", "agent", "--host",
                             "127.0.0.1", "--port", "0"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"(http://127\.0\.0\.1:\d+)", line)
        assert m, line
        yield m.group(1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _specs(n: int, max_tokens: int = 8) -> list[RequestSpec]:
    return [RequestSpec(request_id=i, conversation_id=i, turn=0, prompt=f"w{i} a b c", prompt_tokens=4,
                        shared_prefix_tokens=0, max_tokens=max_tokens, prompt_hash=f"h{i}",
                        messages=(("user", f"w{i} a b c"),) if i % 2 else ())
            for i in range(n)]


def _served(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    m = re.search(r"^vllm:request_success_total\S* (\d+)", text, re.M)
    assert m, text[:500]
    return int(m.group(1))


def test_a_point_sent_through_the_agent_gives_the_records_of_a_local_point() -> None:
    n = 40
    specs, offsets, phases = _specs(n), np.linspace(0.0, 1.0, n), ["warmup"] * 5 + ["measure"] * (n - 5)
    with NullServerProcess() as null, agent() as control:
        batches: list[list[RequestRecord]] = []
        kw = dict(api="completions", request_timeout_s=20.0, deadline_s=15.0, keep_records=True, headers={})
        remote = RemoteDriver(control).open_loop(null, "null", specs, offsets, phases, sink=batches.append, **kw)
        local = HTTP_DRIVER.open_loop(null, "null", specs, offsets, phases, sink=None, **kw)
        health = httpx.get(f"{control}/health", timeout=10).json()
    streamed = [r for b in batches for r in b]
    assert remote.records is not None and local.records is not None
    # Every scheduled request came back once, as it was taken, with what a local point records.
    assert sorted(r.request_id for r in streamed) == list(range(n))
    assert sorted(r.request_id for r in remote.records) == list(range(n))
    assert remote.scheduled == local.scheduled == n and remote.by_status == local.by_status
    by_id = {r.request_id: r for r in remote.records}
    for r in local.records:
        got = by_id[r.request_id]
        assert (got.phase, got.status, got.output_tokens, got.prompt_hash, got.output_tokens_asked) == (
            r.phase, r.status, r.output_tokens, r.prompt_hash, r.output_tokens_asked)
        assert got.sent_s is not None and got.first_token_s is not None and got.first_token_s >= got.sent_s
    assert health["points"] == 1 and not health["busy"]


def test_a_controller_gone_mid_point_stops_the_points_sends() -> None:
    n, span = 600, 30.0  # 20 req/s for 30 s, were it left to run
    specs, offsets = _specs(n), np.linspace(0.0, span, n)
    with NullServerProcess() as null, agent() as control:
        seen: list[int] = []

        def sink(batch: list[RequestRecord]) -> None:
            seen.extend(r.request_id for r in batch)
            if len(seen) >= 20:
                raise RuntimeError("the controller went away")  # its end of the stream closes

        with pytest.raises(RuntimeError, match="went away"):
            RemoteDriver(control).open_loop(null, "null", specs, offsets, ["measure"] * n, api="completions",
                                            sink=sink, request_timeout_s=20.0, deadline_s=span + 10,
                                            keep_records=False, headers={})
        deadline = time.monotonic() + 20
        while httpx.get(f"{control}/health", timeout=10).json()["busy"]:
            assert time.monotonic() < deadline, "the abandoned point still runs"
            time.sleep(0.2)
        served = _served(null)
        time.sleep(1.0)
        assert _served(null) == served, "the agent still sends"
        assert served < n // 2, served
        # The agent serves the next point.
        out = RemoteDriver(control).open_loop(null, "null", specs[:5], np.linspace(0, 0.2, 5), ["measure"] * 5,
                                              api="completions", sink=None, request_timeout_s=10.0,
                                              deadline_s=10.0, keep_records=False, headers={})
        assert out.by_status["ok"] == 5


def test_an_agent_that_cannot_be_reached_is_a_transient_error() -> None:
    with pytest.raises(TransientError, match="broke mid-point"):
        RemoteDriver("http://127.0.0.1:9").open_loop("http://127.0.0.1:9", "m", _specs(1), [0.0], ["measure"],
                                                      api="completions", sink=None, request_timeout_s=1.0,
                                                      deadline_s=1.0, keep_records=False, headers={})
