"""Point metrics from request records (DESIGN section 7). Pure: numpy only.

Only records whose phase is ``measure`` are judged. Unfinished and failed requests are misses,
never dropped, and count as +infinity in every latency percentile, so a tail is never
flattered by the requests that did not make it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from orchestrator.plan.catalog import ServiceClass
from orchestrator.records import ERROR_STATUSES, MEASURE, RequestRecord

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)
# Why a request missed its class, in the order a miss is charged to (one cause per miss).
# "error": a status in records.ERROR_STATUSES (a timeout is "unfinished").
MISS_CAUSES: tuple[str, ...] = ("error", "unfinished", "wrong_tokens", "ttft", "tpot")


@dataclass(frozen=True, slots=True)
class ClassMetrics:
    """One service class at one load point."""

    attainment: float  # kept / scheduled in the window
    goodput_tok_s: float  # output tokens of kept requests / window length
    kept: int
    misses: dict[str, int]  # cause -> count; sums to scheduled - kept


@dataclass(frozen=True, slots=True)
class PointMetrics:
    """What one open-loop load point measured."""

    window_s: float
    n_scheduled: int
    n_recorded: int
    n_finished: int
    offered_rate: float  # scheduled requests / window
    achieved_rate: float  # requests actually sent within the window / window
    throughput_tok_s: float  # output tokens of finished requests / window
    per_class: dict[str, ClassMetrics]
    ttft_s: dict[int, float] = field(default_factory=dict)  # percentile -> seconds (+inf allowed)
    tpot_s: dict[int, float] = field(default_factory=dict)
    max_gap_s: dict[int, float] = field(default_factory=dict)  # largest inter-token gap per request
    e2e_s: dict[int, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """Plain dict; +inf percentiles become None (JSON has no infinity)."""

        def clean(d: dict[int, float]) -> dict[str, float | None]:
            return {f"p{k}": (v if math.isfinite(v) else None) for k, v in d.items()}

        return {
            "window_s": self.window_s, "n_scheduled": self.n_scheduled,
            "n_recorded": self.n_recorded, "n_finished": self.n_finished,
            "offered_rate": self.offered_rate, "achieved_rate": self.achieved_rate,
            "throughput_tok_s": self.throughput_tok_s,
            "per_class": {
                k: {"attainment": c.attainment, "goodput_tok_s": c.goodput_tok_s, "kept": c.kept,
                    "misses": dict(c.misses)}
                for k, c in self.per_class.items()
            },
            "ttft_s": clean(self.ttft_s), "tpot_s": clean(self.tpot_s),
            "max_gap_s": clean(self.max_gap_s), "e2e_s": clean(self.e2e_s),
        }


def measured(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The records judged: phase ``measure``."""
    return [r for r in records if r.phase == MEASURE]


def window_of(records: Sequence[RequestRecord]) -> float:
    """Estimate the measurement window from scheduled times when the caller does not give it:
    the span of n sends stretched by n / (n - 1) (the span under-covers the window)."""
    t = np.array([r.scheduled_s for r in records], dtype=np.float64)
    if t.size < 2:
        return 1.0
    span = float(t.max() - t.min())
    return span * t.size / (t.size - 1) if span > 0 else 1.0


def percentiles(values: np.ndarray) -> dict[int, float]:
    """Order-statistic percentiles (no interpolation, so +inf stays +inf, never NaN)."""
    if values.size == 0:
        return {p: math.nan for p in PERCENTILES}
    return {p: float(np.percentile(values, p, method="inverted_cdf")) for p in PERCENTILES}


def miss_cause(r: RequestRecord, cls: ServiceClass) -> str | None:
    """Why ``r`` missed ``cls`` (the first of MISS_CAUSES that applies), or None if kept."""
    if r.status in ERROR_STATUSES:
        return "error"
    if not r.finished:
        return "unfinished"
    if r.output_tokens != r.output_tokens_asked:
        return "wrong_tokens"
    if r.ttft_s > cls.ttft_ms / 1000.0:
        return "ttft"
    if r.tpot_s > cls.tpot_ms / 1000.0:
        return "tpot"
    return None


def point_metrics(
    records: Sequence[RequestRecord],
    classes: Sequence[ServiceClass],
    window_s: float | None = None,
    n_scheduled: int | None = None,
) -> PointMetrics:
    """Judge the ``measure`` records of one load point against every class.

    ``window_s``: the measurement window's length (default: estimated from scheduled times).
    ``n_scheduled``: how many requests the schedule put in the window (default: the records
    counted); scheduled requests with no record at all count as unfinished misses."""
    recs = measured(records)
    w = float(window_s) if window_s else window_of(recs)
    if w <= 0:
        raise ValueError(f"window_s must be > 0 (got {window_s})")
    n_sched = max(n_scheduled if n_scheduled is not None else len(recs), len(recs))
    missing = n_sched - len(recs)

    finished = [r for r in recs if r.finished]
    throughput = sum(r.output_tokens or 0 for r in finished) / w
    start = min((r.scheduled_s for r in recs), default=0.0)
    sent_in_window = sum(1 for r in recs if r.sent_s is not None and r.sent_s - start < w)

    per_class: dict[str, ClassMetrics] = {}
    for cls in classes:
        misses = dict.fromkeys(MISS_CAUSES, 0)
        misses["unfinished"] += missing
        kept = 0
        good_tokens = 0
        for r in recs:
            cause = miss_cause(r, cls)
            if cause is None:
                kept += 1
                good_tokens += r.output_tokens or 0
            else:
                misses[cause] += 1
        per_class[cls.name] = ClassMetrics(
            attainment=kept / n_sched if n_sched else 0.0,
            goodput_tok_s=good_tokens / w,
            kept=kept,
            misses=misses,
        )

    pad = np.full(missing, np.inf)

    def col(values: list[float]) -> np.ndarray:
        return np.concatenate([np.asarray(values, dtype=np.float64), pad])

    def e2e(r: RequestRecord) -> float:
        return r.e2e_s

    def gap(r: RequestRecord) -> float:
        if not r.finished:
            return math.inf
        return r.max_gap_s if r.max_gap_s is not None else 0.0

    return PointMetrics(
        window_s=w,
        n_scheduled=n_sched,
        n_recorded=len(recs),
        n_finished=len(finished),
        offered_rate=n_sched / w,
        achieved_rate=sent_in_window / w,
        throughput_tok_s=throughput,
        per_class=per_class,
        ttft_s=percentiles(col([r.ttft_s if r.status not in ERROR_STATUSES else math.inf for r in recs])),
        tpot_s=percentiles(col([r.tpot_s for r in recs])),
        max_gap_s=percentiles(col([gap(r) for r in recs])),
        e2e_s=percentiles(col([e2e(r) for r in recs])),
    )
