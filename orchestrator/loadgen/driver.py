"""How a load point's requests reach a deployment: the seam between the point runner and the
generator. The real driver sends them over HTTP on the wall clock (``runner.run_point``,
``runner.run_closed_loop``, ``sessions.run_sessions``); a virtual-time driver
(``orchestrator.backends.virtual``) produces the same records from the simulated engine on its
own clock, with no socket and no sleep. Both hand records to the sink and return a
``PointSummary`` with the same meaning, so everything after the send (metrics, guards, store,
verdicts) is the same code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from orchestrator.loadgen.client import Api
from orchestrator.loadgen.runner import PointSummary, Sink, StopCheck, run_closed_loop, run_point
from orchestrator.loadgen.sessions import run_sessions
from orchestrator.loadgen.workloads import RequestSpec
from orchestrator.plan import Workload


class LoadDriver(Protocol):
    """Sends one point's load and records every scheduled request (see the module docstring).
    ``realtime``: False when the point runs on a virtual clock (nothing to scrape during it).
    ``remote``: the load is sent by another process (``loadgen.remote``: an in-cluster load
    generator), so no Ray shards of this process and no early stop (its check would have to run
    where the records are taken)."""

    realtime: bool
    remote: bool

    def open_loop(self, url: str, model: str, requests: Sequence[RequestSpec],
                  offsets: Sequence[float] | np.ndarray, phases: Sequence[str], *, api: Api,
                  sink: Sink | None, request_timeout_s: float, deadline_s: float | None,
                  keep_records: bool, headers: Mapping[str, str] | None,
                  stop_when: StopCheck | None = None, stop_drain_s: float = 0.0) -> PointSummary:
        """``runner.run_point``'s meaning: send ``requests[i]`` at offset ``offsets[i]``."""
        ...

    def closed_loop(self, url: str, model: str, requests: Iterable[RequestSpec], *, users: int,
                    think_s: float, ramp_up_s: float, duration_s: float, warmup_s: float,
                    measure_s: float | None, api: Api, sink: Sink | None,
                    request_timeout_s: float, deadline_s: float | None, keep_records: bool,
                    headers: Mapping[str, str] | None) -> PointSummary:
        """``runner.run_closed_loop``'s meaning: ``users`` users, each waiting for its reply."""
        ...

    def sessions(self, url: str, model: str, workload: Workload, starts: Sequence[float] | np.ndarray,
                 *, seed: int, duration_s: float, warmup_s: float, measure_s: float | None, api: Api,
                 sink: Sink | None, request_timeout_s: float, deadline_s: float | None,
                 keep_records: bool, headers: Mapping[str, str] | None,
                 sent: list[RequestSpec] | None) -> PointSummary:
        """``sessions.run_sessions``'s meaning: live sessions whose turns follow the replies."""
        ...


class HttpDriver:
    """The real load generator: streaming HTTP on the wall clock, one process."""

    realtime = True
    remote = False

    def open_loop(self, url: str, model: str, requests: Sequence[RequestSpec],
                  offsets: Sequence[float] | np.ndarray, phases: Sequence[str], **kw: Any) -> PointSummary:
        return asyncio.run(run_point(url, model, requests, offsets, phases, **kw))

    def closed_loop(self, url: str, model: str, requests: Iterable[RequestSpec], **kw: Any) -> PointSummary:
        return asyncio.run(run_closed_loop(url, model, requests, **kw))

    def sessions(self, url: str, model: str, workload: Workload, starts: Sequence[float] | np.ndarray,
                 **kw: Any) -> PointSummary:
        return asyncio.run(run_sessions(url, model, workload, starts, **kw))


HTTP_DRIVER = HttpDriver()
