"""Prometheus scraping of a target's ``/metrics``: before and after a point and every N seconds
during it, parsed into samples for the store."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample of one metric family (histograms give their _bucket/_sum/_count samples)."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Snapshot:
    """The samples of one scrape, with when (wall clock) and why (before / during / after)."""

    at: float
    when: str
    samples: list[Sample]
    error: str | None = None


def parse_metrics(text: str) -> list[Sample]:
    """Samples from Prometheus text exposition format."""
    return [
        Sample(s.name, dict(s.labels), float(s.value))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]


def metrics_url(url: str) -> str:
    """The target's ``/metrics`` (a base URL gets the path appended)."""
    return url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"


async def scrape(url: str, client: httpx.AsyncClient | None = None, timeout_s: float = 5.0) -> list[Sample]:
    """GET ``/metrics`` and parse it; raises ``httpx.HTTPError`` when the target does not answer."""
    own = client is None
    c = client or httpx.AsyncClient(timeout=timeout_s)
    try:
        resp = await c.get(metrics_url(url), timeout=timeout_s)
        resp.raise_for_status()
        return parse_metrics(resp.text)
    finally:
        if own:
            await c.aclose()


@dataclass
class PeriodicScraper:
    """``async with PeriodicScraper(url, every_s=5) as s: <run the point>`` scrapes before,
    every ``every_s`` during, and after; ``s.snapshots`` holds them in order. A failed scrape
    is kept as a snapshot with its error (a gap in metrics is evidence too)."""

    url: str
    every_s: float = 5.0
    timeout_s: float = 5.0
    snapshots: list[Snapshot] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _client: httpx.AsyncClient | None = None

    async def _one(self, when: str) -> None:
        assert self._client is not None
        at = time.time()
        try:
            samples = await scrape(self.url, self._client, self.timeout_s)
            self.snapshots.append(Snapshot(at, when, samples))
        except httpx.HTTPError as e:
            self.snapshots.append(Snapshot(at, when, [], f"{type(e).__name__}: {e}"))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self._one("during")

    async def __aenter__(self) -> PeriodicScraper:
        self._client = httpx.AsyncClient(timeout=self.timeout_s)
        await self._one("before")
        if self.every_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._one("after")
        assert self._client is not None
        await self._client.aclose()
