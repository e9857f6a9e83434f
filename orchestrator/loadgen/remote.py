"""The controller's side of an in-cluster load generator (``loadgen.agent``): a ``LoadDriver``
whose points run in the agent's pod, next to the router, while this process keeps control.

Each call sends the point (its requests and schedule, or its sessions' workload and starts) to
the agent over ``control_url`` (a port-forward of the agent pod, from a workstation) and hands
every batch of records the agent streams back to the point's sink as it arrives, so the store,
spool and live display see the same batches a local point gives them. The records' times are
the agent's wall clock (the cluster's nodes are NTP-synchronised, as the store's history across
machines already assumes).

A control stream that breaks mid-point keeps every record received (already in the sink) and
raises a TransientError: the run is retried, and the agent stops sending the abandoned point.
"""

from __future__ import annotations

import gzip
import inspect
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx
import numpy as np

from orchestrator.errors import PermanentError, TransientError
from orchestrator.loadgen.client import Api
from orchestrator.loadgen.runner import PointSummary, Sink, StopCheck
from orchestrator.loadgen.wire import WireError, records_from, spec_rows, specs_from, summary_from
from orchestrator.loadgen.workloads import RequestSpec
from orchestrator.plan import Workload
from orchestrator.records import RequestRecord

# Past the point's own deadline, how long the answer may take (the drain, the last batches).
GRACE_S = 120.0


class RemoteDriver:
    """Sends each point through the agent at ``control_url`` (see the module docstring)."""

    realtime = True
    remote = True

    def __init__(self, control_url: str, where: str = "the in-cluster load generator") -> None:
        self.control_url = control_url.rstrip("/")
        self.where = where

    def open_loop(self, url: str, model: str, requests: Sequence[RequestSpec],
                  offsets: Sequence[float] | np.ndarray, phases: Sequence[str], *, api: Api,
                  sink: Sink | None, request_timeout_s: float, deadline_s: float | None,
                  keep_records: bool, headers: Mapping[str, str] | None,
                  stop_when: StopCheck | None = None, stop_drain_s: float = 0.0) -> PointSummary:
        if stop_when is not None:  # the check would have to run where the records are taken
            raise ValueError("an in-cluster point does not stop early")
        offs = np.asarray(offsets, dtype=np.float64)
        doc = {"mode": "open", "requests": spec_rows(list(requests)), "offsets": offs.tolist(),
               "phases": list(phases)}
        wait = (deadline_s if deadline_s is not None else (float(offs[-1]) if len(offs) else 0.0) + request_timeout_s)
        return self._point(url, model, doc, api, request_timeout_s, deadline_s, headers, sink, keep_records,
                           wait, None)

    def sessions(self, url: str, model: str, workload: Workload, starts: Sequence[float] | np.ndarray,
                 *, seed: int, duration_s: float, warmup_s: float, measure_s: float | None, api: Api,
                 sink: Sink | None, request_timeout_s: float, deadline_s: float | None,
                 keep_records: bool, headers: Mapping[str, str] | None,
                 sent: list[RequestSpec] | None) -> PointSummary:
        doc = {"mode": "sessions", "workload": workload.model_dump(mode="json", by_alias=True),
               "starts": np.asarray(starts, dtype=np.float64).tolist(), "seed": seed, "duration_s": duration_s,
               "warmup_s": warmup_s, "measure_s": measure_s}
        wait = deadline_s if deadline_s is not None else duration_s + request_timeout_s
        return self._point(url, model, doc, api, request_timeout_s, deadline_s, headers, sink, keep_records,
                           wait, sent)

    def closed_loop(self, url: str, model: str, requests: Iterable[RequestSpec], *, users: int,
                    think_s: float, ramp_up_s: float, duration_s: float, warmup_s: float,
                    measure_s: float | None, api: Api, sink: Sink | None,
                    request_timeout_s: float, deadline_s: float | None, keep_records: bool,
                    headers: Mapping[str, str] | None) -> PointSummary:
        # The backend refuses such a plan before deploying (KubernetesBackend.deploy); this is
        # the last line, never reached through orch.
        raise PermanentError("a closed-loop point is not run by the in-cluster load generator: run the plan "
                             "from inside the cluster (orch submit, or kubernetes.access: service)")

    # -- one point --------------------------------------------------------------------------

    def _point(self, url: str, model: str, doc: dict[str, Any], api: Api, request_timeout_s: float,
               deadline_s: float | None, headers: Mapping[str, str] | None, sink: Sink | None,
               keep_records: bool, wait_s: float, sent: list[RequestSpec] | None) -> PointSummary:
        body = gzip.compress(json.dumps({
            **doc, "url": url, "model": model, "stream": sink is not None or keep_records,
            "send": {"api": api, "request_timeout_s": request_timeout_s, "deadline_s": deadline_s,
                     "headers": dict(headers or {})},
        }).encode(), compresslevel=3)
        kept: list[RequestRecord] = []
        received = 0
        timeout = httpx.Timeout(connect=30.0, read=wait_s + GRACE_S, write=120.0, pool=30.0)
        try:
            with httpx.Client(timeout=timeout) as http, http.stream(
                    "POST", f"{self.control_url}/v1/points", content=body,
                    headers={"Content-Type": "application/gzip"}) as r:
                if r.status_code != 200:
                    raise TransientError(f"{self.where} refused the point: HTTP {r.status_code} "
                                         f"{r.read().decode(errors='replace')[:300]}", delay=5.0)
                for raw in r.iter_lines():
                    if not raw.strip():
                        continue
                    line = json.loads(raw)
                    if "records" in line:
                        batch = records_from(line["records"])
                        received += len(batch)
                        if keep_records:
                            kept.extend(batch)
                        if sink is not None and batch:
                            _call_sink(sink, batch)
                    elif "summary" in line:
                        if sent is not None:
                            sent.extend(specs_from(line.get("sent") or []))
                        return summary_from(line["summary"], kept if keep_records else None)
                    elif "error" in line:
                        raise TransientError(f"{self.where} failed the point: {line['error']}", delay=5.0)
        except (httpx.HTTPError, WireError, ValueError) as e:
            raise TransientError(f"the control stream to {self.where} broke mid-point ({type(e).__name__}: {e}); "
                                 f"the {received} records received are kept", delay=5.0) from e
        raise TransientError(f"{self.where} ended the point without its summary; the {received} records "
                             "received are kept", delay=5.0)

    def path(self, url: str, samples: int = 30) -> dict[str, Any]:
        """The round trip from the agent to ``url`` (what the access_path guard judges)."""
        try:
            r = httpx.get(f"{self.control_url}/v1/path", params={"url": url, "samples": samples}, timeout=120.0)
            r.raise_for_status()
            doc: dict[str, Any] = r.json()
            return doc
        except (httpx.HTTPError, ValueError) as e:
            raise TransientError(f"{self.where} could not measure its path to the router: {e}", delay=5.0) from e


def _call_sink(sink: Sink, batch: list[RequestRecord]) -> None:
    out = sink(batch)
    if inspect.isawaitable(out):  # the point runner's sinks are sync; an async one is a bug here
        raise TypeError("RemoteDriver needs a sync sink")
