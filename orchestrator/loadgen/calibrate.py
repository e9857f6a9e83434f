"""Self-calibration: the generator's own ceiling against a null server on loopback.

The ceiling is the highest open-loop request rate (and the streamed chunks/s it implies) at
which p99 send lag stays under ``max_lag_p99_s`` and the achieved rate is within
``rate_tolerance`` of the scheduled one. Search: double the rate from ``start_rate`` until a
step fails, then bisect between the last pass and the first failure. The executor stores the
result with every run and refuses a point whose offered load exceeds it.
"""

from __future__ import annotations

import asyncio
import math
import os
import platform
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from typing import Any, ParamSpec

from orchestrator.loadgen.client import Api, ClientKind
from orchestrator.loadgen.null_server import NullServerConfig, NullServerProcess
from orchestrator.loadgen.runner import DEFAULT_CLIENT, PointSummary, run_point
from orchestrator.loadgen.schedules import derive_seed, open_loop_offsets
from orchestrator.loadgen.workloads import build_requests
from orchestrator.plan.workload import OpenLoop, Workload

P = ParamSpec("P")
MAX_STEP_S = 8.0

@dataclass
class CalibrationStep:
    rate: float
    requests: int
    achieved_ratio: float
    send_lag_p99_s: float
    chunks_per_s: float
    passed: bool
    failures: int  # requests that did not end ok (the null server should never fail)


@dataclass
class Calibration:
    """The generator's ceiling on this machine, with the steps that found it."""

    ceiling_rate: float  # requests/s (0 when even the first step failed)
    ceiling_chunks_per_s: float
    output_tokens: int
    prompt_tokens: int
    tokens_per_chunk: int
    client: str
    api: str
    max_lag_p99_s: float
    rate_tolerance: float
    cpus: int
    host: str
    steps: list[CalibrationStep] = field(default_factory=list)
    capped_at: float | None = None  # the ladder stopped at this rate, which held: the ceiling is at least it

    def to_dict(self) -> dict:
        return asdict(self)


def _passes(s: PointSummary, max_lag: float, tol: float) -> bool:
    failures = s.scheduled - s.by_status.get("ok", 0)
    return (
        failures == 0
        and s.send_lag_p99_s < max_lag
        and not math.isnan(s.achieved_ratio)
        and abs(s.achieved_ratio - 1.0) <= tol
    )


async def calibrate_async(
    *,
    output_tokens: int = 256,
    prompt_tokens: int = 128,
    tokens_per_chunk: int = 1,
    api: Api = "completions",
    client: ClientKind = DEFAULT_CLIENT,
    arrival: OpenLoop | None = None,
    step_s: float = 3.0,
    min_requests: int = 200,
    start_rate: float = 25.0,
    max_rate: float = 20000.0,
    bisections: int = 4,
    max_lag_p99_s: float = 0.001,
    rate_tolerance: float = 0.01,
    seed: int = 0,
    retries: int = 1,
    min_rate_share: float = 1 / 16,
) -> Calibration:
    """Run the ladder against a fresh null server (its own process); returns the ceiling.

    ``max_rate`` caps the ladder: a plan that never offers more than R req/s needs only to
    know R holds (``capped_at``), not how far above it the generator would go. A step lasts
    ``min_requests / rate`` seconds, at least ``step_s`` and at most ``MAX_STEP_S`` (a step
    down the ladder on a busy machine would otherwise run a minute).

    Up from ``start_rate`` by doubling, then bisection. A failed step is run again up to
    ``retries`` times before it counts: with a few hundred requests the p99 lag is nearly the
    maximum, and one OS hiccup on a shared machine must not set the ceiling. When even
    ``start_rate`` fails, the ladder goes down by halving to ``start_rate * min_rate_share``;
    a ceiling of 0 means no step down there held."""
    arrival = arrival or OpenLoop()
    wl = Workload.model_validate(
        {"prompts": {"input_tokens": {"mean": prompt_tokens}, "conversations": 100000},
         "output_tokens": output_tokens, "api": api}
    )
    steps: list[CalibrationStep] = []
    cfg = NullServerConfig(tokens_per_chunk=tokens_per_chunk)
    with NullServerProcess(cfg) as url:

        async def attempt(rate: float, n: int) -> bool:
            duration = max(step_s, min(min_requests / rate, MAX_STEP_S))
            offs = open_loop_offsets(arrival, rate, duration, derive_seed(seed, "calibrate", rate, n))
            reqs = build_requests(wl, len(offs), derive_seed(seed, "calibrate-prompts", rate, n))
            s = await run_point(url, "null", reqs, offs, ["measure"] * len(offs), api=api,
                                client=client, request_timeout_s=30.0)
            ok = _passes(s, max_lag_p99_s, rate_tolerance)
            steps.append(CalibrationStep(rate, s.scheduled, s.achieved_ratio, s.send_lag_p99_s,
                                         s.chunks_per_s, ok, s.scheduled - s.by_status.get("ok", 0)))
            return ok

        async def step(rate: float) -> bool:
            for n in range(1 + retries):
                if await attempt(rate, n):
                    return True
            return False

        good, bad = 0.0, math.inf
        rate = min(start_rate, max_rate)
        while True:
            if not await step(rate):
                bad = rate
                break
            good = rate
            if rate >= max_rate:
                break
            rate = min(rate * 2, max_rate)
        rate = start_rate / 2
        while good == 0 and rate >= start_rate * min_rate_share:
            if await step(rate):
                good = rate
            else:
                bad = rate
                rate /= 2
        if good > 0 and math.isfinite(bad):
            for _ in range(bisections):
                mid = (good + bad) / 2
                if await step(mid):
                    good = mid
                else:
                    bad = mid
    chunks_per_request = math.ceil(output_tokens / max(1, tokens_per_chunk))
    return Calibration(
        ceiling_rate=good,
        ceiling_chunks_per_s=good * chunks_per_request,
        output_tokens=output_tokens,
        prompt_tokens=prompt_tokens,
        tokens_per_chunk=tokens_per_chunk,
        client=client,
        api=api,
        max_lag_p99_s=max_lag_p99_s,
        rate_tolerance=rate_tolerance,
        cpus=os.cpu_count() or 1,
        host=platform.node(),
        steps=steps,
        capped_at=good if good > 0 and good >= max_rate else None,
    )


def _blocking(fn: Callable[P, Coroutine[Any, Any, Calibration]]) -> Callable[P, Calibration]:
    def run(*args: P.args, **kwargs: P.kwargs) -> Calibration:
        return asyncio.run(fn(*args, **kwargs))

    run.__doc__ = f"Blocking ``{fn.__name__}`` (same arguments)."
    return run


calibrate = _blocking(calibrate_async)
