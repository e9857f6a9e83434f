"""Prometheus text exposition parsed into samples for the store (the backends fetch the text:
``Backend.scrape``; the point runner scrapes before, during and after each point)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample of one metric family (histograms give their _bucket/_sum/_count samples)."""

    name: str
    labels: dict[str, str]
    value: float


def parse_metrics(text: str) -> list[Sample]:
    """Samples from Prometheus text exposition format."""
    return [
        Sample(s.name, dict(s.labels), float(s.value))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]
