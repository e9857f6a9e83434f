"""HTTP helpers every process-based backend shares."""

from __future__ import annotations

from collections.abc import Iterable

import httpx


def scrape_urls(urls: Iterable[str], timeout_s: float = 5.0) -> dict[str, str]:
    """Prometheus text of each URL that answers 200; one that does not is left out (a gap in
    the metrics is kept as evidence by the caller, not turned into a failed run)."""
    out: dict[str, str] = {}
    with httpx.Client(timeout=timeout_s) as client:
        for url in urls:
            try:
                r = client.get(url)
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                out[url] = r.text
    return out
