"""The round trip a load's path to the router adds (``GET /health``, p50/p99 in ms): what a
port-forward or an ingress adds to every TTFT, measured before the points from where the load
is sent (the controller, or the in-cluster load generator)."""

from __future__ import annotations

import time
from typing import Any

import httpx


def measure_path(url: str, samples: int = 30) -> dict[str, Any]:
    """``samples`` round trips of ``GET {url}/health``; failed ones are left out of the figures."""
    rtts = []
    with httpx.Client(timeout=10.0) as http:
        for _ in range(samples):
            t0 = time.perf_counter()
            try:
                http.get(f"{url}/health")
            except httpx.HTTPError:
                continue
            rtts.append((time.perf_counter() - t0) * 1000)
    if not rtts:
        return {"rtt_p50_ms": None, "rtt_p99_ms": None, "samples": 0}
    rtts.sort()
    return {"rtt_p50_ms": round(rtts[len(rtts) // 2], 3),
            "rtt_p99_ms": round(rtts[min(len(rtts) - 1, int(0.99 * len(rtts)))], 3), "samples": len(rtts)}
