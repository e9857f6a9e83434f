"""Over-saturation early stop (issue 20 item 5): is a load point already certain to fail?

Pure: records in, a decision out; no I/O. The point loop asks while the point runs and, on a
yes, stops sending: the point is recorded as a *failing* point (censored above: its rate is past
capacity), never a passing one.

The rule is deterministic, not statistical, so it cannot fire on a point that would have passed:
a point passes a class when at least ``attainment`` of the requests scheduled in its window meet
the class (DESIGN 7; unsent and unfinished requests are misses). While the point runs, a request
of the window is a *certain* miss once

- it ended in an error status (http_error, disconnect, timeout), or
- it finished and missed the class (TTFT, TPOT or a wrong token count), or
- no first token has arrived and more than the class's TTFT limit has passed since it was
  scheduled (its TTFT, measured from the schedule, is already over the limit).

When the certain misses of every class exceed ``(1 - attainment) x n_window`` (the window's
scheduled count, known from the schedule), no outcome of the rest of the window can lift the
point to the bar: it fails every class whatever happens next. Every class, because a point
measured for one class is reused by the searches of the others. Besides, the rule waits for
``min_fraction`` of the window (default 30 %) so a stopped point still holds a sample of its
own. Past the knee the queue grows and TTFT misses pile up at the arrival rate, so the bar is
crossed early; below the knee the misses stay under ``(1 - attainment) x n_window`` for good.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.analysis.metrics import miss_cause
from orchestrator.plan.catalog import ServiceClass
from orchestrator.records import ERROR_OR_TIMEOUT_STATUSES, RequestRecord

MIN_FRACTION = 0.30


@dataclass(frozen=True, slots=True)
class EarlyStop:
    """Why a point was stopped: ``at_s`` seconds after its window opened."""

    at_s: float
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"at_s": self.at_s, "reason": self.reason}


def certain_miss(r: RequestRecord, cls: ServiceClass, now_s: float) -> bool:
    """True when ``r`` has missed ``cls`` whatever happens after ``now_s``."""
    if r.status in ERROR_OR_TIMEOUT_STATUSES:
        return True
    if r.finished:
        return miss_cause(r, cls) is not None
    limit = cls.ttft_ms / 1000.0
    if r.first_token_s is not None:
        return r.first_token_s - r.scheduled_s > limit
    return now_s - r.scheduled_s > limit


class SaturationWatch:
    """:func:`past_capacity` asked again and again over one point's growing records, in time
    proportional to the requests still open: a certain miss stays one and a finished request
    stays finished, so each is counted once. ``records`` must be in schedule order (the point
    loop's list: one object per scheduled request, updated in place)."""

    def __init__(self, classes: Sequence[ServiceClass], attainment: float, window_start_s: float,
                 window_s: float, n_window: int, min_fraction: float = MIN_FRACTION):
        self.classes, self.attainment = tuple(classes), attainment
        self.window_start_s, self.window_s, self.n_window = window_start_s, window_s, n_window
        self.min_fraction = min_fraction
        self._seen = 0  # records looked at so far (a prefix of the schedule)
        self._open: list[list[RequestRecord]] = [[] for _ in self.classes]  # not yet settled, per class
        self._misses = [0] * len(self.classes)

    def __call__(self, records: Sequence[RequestRecord], now_s: float) -> EarlyStop | None:
        elapsed = now_s - self.window_start_s
        if self.n_window <= 0 or not self.classes or elapsed < self.min_fraction * self.window_s:
            return None
        while self._seen < len(records) and records[self._seen].scheduled_s <= now_s:
            r = records[self._seen]
            self._seen += 1
            if r.phase == "measure":
                for open_ in self._open:
                    open_.append(r)
        for k, cls in enumerate(self.classes):
            still = []
            for r in self._open[k]:
                if certain_miss(r, cls, now_s):
                    self._misses[k] += 1
                elif not r.finished:  # finished and not a miss: met, settled
                    still.append(r)
            self._open[k] = still
        # (n_window - misses) / n_window < attainment, in counts: the bar is out of reach.
        if any(not self.n_window - m < self.attainment * self.n_window for m in self._misses):
            return None
        allowed = (1.0 - self.attainment) * self.n_window  # misses the bar tolerates over the window
        counts = ", ".join(f"{c.name} {m}" for c, m in zip(self.classes, self._misses, strict=True))
        outstanding = sum(1 for r in records[:self._seen] if r.sent_s is not None and r.status == "unsent")
        return EarlyStop(
            at_s=round(elapsed, 3),
            reason=(f"past capacity: certain misses ({counts}) exceed the {allowed:.1f} the bar allows "
                    f"over the window's {self.n_window} requests, {outstanding} outstanding"),
        )


def past_capacity(
    records: Sequence[RequestRecord],
    classes: Sequence[ServiceClass],
    attainment: float,
    window_start_s: float,
    window_s: float,
    n_window: int,
    now_s: float,
    min_fraction: float = MIN_FRACTION,
) -> EarlyStop | None:
    """An :class:`EarlyStop` when the point is certain to fail every class (see the module),
    else None. ``records``: the point's records so far (any phase; only ``measure`` counts);
    ``window_start_s``/``now_s``: on the records' clock; ``n_window``: requests the schedule
    puts in the window."""
    ordered = sorted(records, key=lambda r: r.scheduled_s)
    watch = SaturationWatch(classes, attainment, window_start_s, window_s, n_window, min_fraction)
    return watch(ordered, now_s)
