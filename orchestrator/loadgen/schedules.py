"""Arrival schedules: absolute send times drawn from a seed (pure).

An open-loop point is a fixed list of send offsets (seconds from the point's start), generated
up front so it can be stored and replayed exactly; the runner sleeps *to* each offset
rather than by accumulated intervals, so one late send never shifts the ones after it.
A different block gets a different seed (``derive_seed``); the two arms of a block may share
one so they face the same arrivals.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np

from orchestrator.plan.workload import OpenLoop, ThinkTime
from orchestrator.records import COOLDOWN, MEASURE, WARMUP


def derive_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed from a base seed and labels (block, arm, rate...): stable across runs and
    machines (sha256, not Python's salted ``hash``)."""
    text = "\x1f".join([str(seed), *(repr(p) for p in parts)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def open_loop_offsets(arrival: OpenLoop, rate: float, duration_s: float, seed: int) -> np.ndarray:
    """Absolute send offsets in seconds from the point start, sorted, all in [0, duration_s).

    poisson: exponential gaps of mean 1/rate; gamma: gamma gaps of shape ``burstiness`` and the
    same mean (below 1 burstier, as vllm bench means it); constant: one every 1/rate from 0.
    """
    if rate <= 0:
        raise ValueError(f"rate must be > 0 (got {rate})")
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0 (got {duration_s})")
    if arrival.process == "constant":
        return np.arange(0.0, duration_s, 1.0 / rate, dtype=np.float64)
    rng = np.random.default_rng(seed)
    expected = rate * duration_s
    parts: list[np.ndarray] = []
    t = 0.0
    # Draw gaps in chunks comfortably above the expected count; rarely more than one chunk.
    chunk = int(expected + 6 * np.sqrt(expected / min(arrival.burstiness, 1.0)) + 16)
    while t < duration_s:
        if arrival.process == "poisson":
            gaps = rng.exponential(1.0 / rate, size=chunk)
        else:
            shape = arrival.burstiness
            gaps = rng.gamma(shape, 1.0 / (rate * shape), size=chunk)
        times = t + np.cumsum(gaps)
        parts.append(times)
        t = float(times[-1])
    offsets = np.concatenate(parts)
    return offsets[offsets < duration_s]


def think_time(think: ThinkTime, seed: int, session: int, turn: int) -> float:
    """A session's pause before ``turn``, s: drawn from (seed, session, turn) alone, so it does not
    depend on the order in which replies happened to arrive."""
    if think.mean_s == 0 or think.dist == "fixed":
        return think.mean_s
    rng = np.random.default_rng(derive_seed(seed, "think", session, turn))
    if think.dist == "exponential":
        return float(rng.exponential(think.mean_s))
    if think.dist == "lognormal":
        mu = np.log(think.mean_s) - think.sigma**2 / 2
        return float(rng.lognormal(mu, think.sigma))
    return float(rng.uniform(think.mean_s * (1 - think.sigma), think.mean_s * (1 + think.sigma)))


def point_phases(offsets: Sequence[float] | np.ndarray, warmup_s: float, measure_s: float) -> list[str]:
    """Phase of each scheduled send: warm-up before ``warmup_s``, measured in the window of
    ``measure_s`` after it, cool-down after that. Every request is recorded; only ``measure``
    is judged."""
    if warmup_s < 0 or measure_s <= 0:
        raise ValueError("warmup_s must be >= 0 and measure_s > 0")
    arr = np.asarray(offsets, dtype=np.float64)
    end = warmup_s + measure_s
    out = np.where(arr < warmup_s, WARMUP, np.where(arr < end, MEASURE, COOLDOWN))
    return [str(p) for p in out]


def phase_at(offset: float, warmup_s: float, measure_s: float) -> str:
    """The phase of one offset (closed loop decides phases as it goes)."""
    if offset < warmup_s:
        return WARMUP
    return MEASURE if offset < warmup_s + measure_s else COOLDOWN


def shards_needed(rate: float, ceiling_rate: float, max_shards: int) -> int:
    """Generator processes that hold ``rate`` when one holds ``ceiling_rate``, at most
    ``max_shards`` (here, not in ``loadgen.shards``, which needs Ray to import)."""
    if ceiling_rate <= 0 or max_shards <= 1:
        return 1
    return max(1, min(max_shards, math.ceil(rate / ceiling_rate)))


def split_shards(n: int, shards: int) -> list[list[int]]:
    """Request indices for each shard: every ``shards``-th request, so each shard carries the
    same rate and the same process thinned (sorted offsets stay sorted within a shard)."""
    if shards < 1:
        raise ValueError("shards must be >= 1")
    return [list(range(k, n, shards)) for k in range(shards)]
