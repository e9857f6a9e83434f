"""Progress of an experiment for people: a live display with an ETA on a TTY, plain lines otherwise.

Every line is an INFO record of the ``orchestrator.progress`` logger, carrying the run's context
(``orchestrator.logs``); the terminal handler prints it on stderr (so --json stdout stays
clean), above the live display when it is shown.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from rich.console import Console
from rich.live import Live
from rich.text import Text

from orchestrator import logs
from orchestrator.analysis.metrics import miss_cause
from orchestrator.control.eta import Estimate, estimate, format_duration, point_seconds
from orchestrator.plan import ServiceClass
from orchestrator.records import RequestRecord

log = logs.get_logger("orchestrator.progress")


@dataclass(frozen=True, slots=True)
class SoFar:
    """A running point's measure window so far: requests ended (finished, failed or cancelled:
    every record the load generator has handed over), of ``scheduled`` (None when a closed loop
    or live sessions do not know it ahead), and per class how many of them kept it."""

    ended: int
    scheduled: int | None
    kept: tuple[tuple[str, int], ...]

    def attainment(self, name: str) -> float | None:
        """Kept / ended so far (None before any request of the window has ended). The point's
        own attainment divides by every scheduled request: requests still in flight at the end
        count as misses there, so this can only be read as "so far"."""
        k = dict(self.kept).get(name)
        return None if k is None or self.ended == 0 else k / self.ended

    def text(self) -> str:
        """``window so far: 412/900 ended | attainment interactive 0.97, batch 1.00``."""
        of = f"/{self.scheduled}" if self.scheduled is not None else ""
        head = f"window so far: {self.ended}{of} ended"
        if not self.ended:
            return head
        return head + " | attainment " + ", ".join(f"{name} {k / self.ended:.2f}" for name, k in self.kept)

    def compact(self) -> str:
        """``so far: 412/900 | interactive 0.97, batch 1.00`` (a narrow terminal's)."""
        of = f"/{self.scheduled}" if self.scheduled is not None else ""
        head = f"so far: {self.ended}{of}"
        if not self.ended:
            return head
        return head + " | " + ", ".join(f"{name} {k / self.ended:.2f}" for name, k in self.kept)


class AttainmentTally:
    """Counts a point's measure-window records as the load generator hands them over (its sink
    thread adds, the display's thread reads the frozen ``SoFar``): the same keep rule as the
    point's metrics (analysis.metrics.miss_cause)."""

    def __init__(self, classes: Sequence[ServiceClass], scheduled: int | None = None):
        self.classes = tuple(classes)
        self.scheduled = scheduled
        self.ended = 0
        self.kept = dict.fromkeys((c.name for c in self.classes), 0)
        self._lock = threading.Lock()

    def add(self, records: Iterable[RequestRecord]) -> SoFar:
        with self._lock:
            for r in records:
                if r.phase != "measure":
                    continue
                self.ended += 1
                for c in self.classes:
                    if miss_cause(r, c) is None:
                        self.kept[c.name] += 1
            return SoFar(self.ended, self.scheduled, tuple(self.kept.items()))


class ProgressSink(Protocol):
    def blocks(self, total: int) -> None: ...
    def schedule(self, total_runs: int, done_runs: int, point_s: float, max_points: int) -> None: ...
    def run_started(self, block: int, arm: str, attempt: int) -> None: ...
    def point_started(self, label: str, seconds: float) -> None: ...
    def point_progress(self, so_far: SoFar) -> None: ...
    def point_done(self, line: str) -> None: ...
    def run_done(self, line: str) -> None: ...
    def block_done(self) -> None: ...
    def note(self, line: str) -> None: ...
    def close(self) -> None: ...


class PlainProgress:
    """One line per event, for logs and pipes."""

    def __init__(self) -> None:
        logs.ensure_configured()

    def _say(self, line: str) -> None:
        log.info(line)

    def blocks(self, total: int) -> None:
        self._say(f"{total} block(s) to run")

    def schedule(self, total_runs: int, done_runs: int, point_s: float, max_points: int) -> None:
        """The runs planned (``done_runs`` of them already done), for an ETA; no line."""

    def run_started(self, block: int, arm: str, attempt: int) -> None:
        self._say(f"block {block} arm {arm}" + (f" (attempt {attempt})" if attempt else "") + ": deploying")

    def point_started(self, label: str, seconds: float) -> None:
        self._say(f"  point {label} ({seconds:.0f}s)")

    def point_progress(self, so_far: SoFar) -> None:
        """The running point's attainment so far: no line (one line per point stays the rule
        off a terminal)."""

    def point_done(self, line: str) -> None:
        self._say(f"    {line}")

    def run_done(self, line: str) -> None:
        self._say(f"  {line}")

    def block_done(self) -> None:
        pass

    def note(self, line: str) -> None:
        self._say(line)

    def close(self) -> None:
        pass


class RichProgress(PlainProgress):
    """A live display on stderr (up to three lines), event lines printed above it:

    ``runs 3/8 done, ETA 42m10s | block 2 arm B (attempt 1), 7m12s in this run`` (the attempt as stored: the summary says the same)
    ``point 1.5 req/s: 63/155s [#####.....] | last: 1.2 req/s: attainment interactive 0.95``
    ``window so far: 412/900 ended | attainment interactive 0.97`` (as the point's requests end)

    The ETA (``control.eta``) starts from the plan (deploy estimate + max_points points per run)
    and follows the mean duration of this process's valid runs once there are some.
    """

    def __init__(self, console: Console | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console or Console(stderr=True)
        super().__init__()
        self.clock = clock
        self.total_runs = 0
        self.done_at_start = 0
        self.point_s = 0.0
        self.max_points = 0
        self.ended: set[tuple[int, str]] = set()
        self.finished_s: list[float] = []
        self.current: tuple[int, str, int] | None = None  # block, arm, attempt
        self.run_t0 = 0.0
        self.point: tuple[str, float, float] | None = None  # label, seconds, started
        self.so_far: SoFar | None = None  # the running point's window so far
        self.last_point = ""
        self.live = Live(self, console=self.console, transient=True, refresh_per_second=2,
                         redirect_stderr=True)
        self.live.start()

    def schedule(self, total_runs: int, done_runs: int, point_s: float, max_points: int) -> None:
        self.total_runs, self.done_at_start = total_runs, done_runs
        self.point_s, self.max_points = point_s, max_points

    def run_started(self, block: int, arm: str, attempt: int) -> None:
        super().run_started(block, arm, attempt)
        self.current = (block, arm, attempt)
        self.ended.discard((block, arm))
        self.run_t0 = self.clock()
        self.point = None

    def point_started(self, label: str, seconds: float) -> None:
        super().point_started(label, seconds)
        self.point = (label, seconds, self.clock())
        self.so_far = None

    def point_progress(self, so_far: SoFar) -> None:
        if self.point is not None:  # a late batch of an ended point is not the next one's
            self.so_far = so_far

    def point_done(self, line: str) -> None:
        super().point_done(line)
        self.last_point = line.strip()
        self.point = None
        self.so_far = None

    def run_done(self, line: str) -> None:
        super().run_done(line)
        if self.current is not None:
            block, arm, _ = self.current
            self.ended.add((block, arm))
            if ": valid;" in line:  # the executor's line for a valid run; others end early
                self.finished_s.append(self.clock() - self.run_t0)
        self.current = None
        self.point = None
        self.so_far = None

    def estimate(self) -> Estimate:
        now = self.clock()
        point, current = self.point, self.current  # the display's thread reads while events come
        point_left = 0.0 if point is None else max(0.0, point[1] - (now - point[2]))
        return estimate(
            total_runs=self.total_runs, done_runs=self.done_at_start + len(self.ended),
            point_s=self.point_s, max_points=self.max_points, finished_s=list(self.finished_s),
            running=current is not None, current_elapsed_s=now - self.run_t0 if current else 0.0,
            point_left_s=point_left,
        )

    def lines(self, width: int | None = None) -> list[str]:
        """What the display shows now (three lines at most), each within ``width`` columns when
        given (the terminal's): a compact form of a line that does not fit, cut last."""
        now = self.clock()
        est = self.estimate()
        point, current, so_far = self.point, self.current, self.so_far
        runs = f"runs {est.done_runs}/{est.total_runs} done, ETA {format_duration(est.remaining_s)}"
        head = [runs]
        if current is not None:
            block, arm, attempt = current
            took = format_duration(now - self.run_t0)
            head = [runs + f" | block {block} arm {arm}" + (f" (attempt {attempt})" if attempt else "")
                    + f", {took} in this run",
                    f"runs {est.done_runs}/{est.total_runs}, ETA {format_duration(est.remaining_s)} | block {block} "
                    f"arm {arm}" + (f" #{attempt}" if attempt else "") + f", {took}",
                    runs]
        out = [_fit(head, width)]
        last = f" | last: {self.last_point}" if self.last_point else ""
        if point is not None:
            label, seconds, t0 = point
            done = max(0.0, min(now - t0, seconds))
            fraction = done / seconds if seconds else 1.0
            at = f"point {label}: {done:.0f}/{seconds:.0f}s "
            out.append(_fit([at + _bar(fraction) + last, at + _bar(fraction, 10) + last, at + _bar(fraction, 10)],
                            width))
            if so_far is not None:
                out.append(_fit([so_far.text(), so_far.compact()], width))
        elif current is not None:
            out.append(_fit(["deploying" if not self.last_point else f"last: {self.last_point}"], width))
        return out

    def __rich__(self) -> Text:
        return Text("\n".join(self.lines(self.console.width)))

    def close(self) -> None:
        self.live.stop()


def _fit(forms: Sequence[str], width: int | None) -> str:
    """The first of a line's ``forms`` (longest first) that fits ``width``; else the last, cut
    with an ellipsis (a live line never wraps: the display redraws whole lines)."""
    if width is None:
        return forms[0]
    for form in forms:
        if len(form) <= width:
            return form
    return forms[-1][: max(0, width - 1)] + "…"


def _bar(fraction: float, width: int = 20) -> str:
    full = int(round(max(0.0, min(1.0, fraction)) * width))
    return "[" + "#" * full + "." * (width - full) + "]"


def progress_for_terminal() -> ProgressSink:
    """The live display when stderr is a terminal, plain lines otherwise."""
    return RichProgress() if sys.stderr.isatty() else PlainProgress()


# -- an experiment's progress read from the store (`orch status --watch`) ---------------------


@dataclass(frozen=True, slots=True)
class StoredProgress:
    """Where an experiment stands, from its stored runs and points."""

    name: str
    id: int
    status: str
    estimate: Estimate
    valid_runs: int
    current: str | None  # "block 2 arm B (attempt 2): 3 point(s), last 1.5 req/s attainment 0.93"

    @property
    def running(self) -> bool:
        return self.status in ("queued", "running")

    def line(self) -> str:
        """The progress line (without the time-dependent ETA, see ``eta_line``)."""
        e = self.estimate
        head = f"{self.name} (id {self.id}): {self.status}, runs {e.done_runs}/{e.total_runs} done"
        return head + (f" | {self.current}" if self.current else "")

    def eta_line(self) -> str:
        return self.line() + f" | ETA {format_duration(self.estimate.remaining_s)}"


def stored_progress(store: Any, key: int | str, now: datetime | None = None) -> StoredProgress:
    """The experiment's progress (raises the store's NotFound for an unknown one). Total runs:
    two per planned block; done: the (block, arm) pairs with a valid run; the ETA is
    ``control.eta`` over the finished valid runs' measured durations."""
    from orchestrator.plan import plan_from_canonical

    now = now or datetime.now(UTC)
    exp = store.get_experiment(key)
    plan = plan_from_canonical(store.get_registration(exp.registration_id).canonical_json)
    runs = store.runs(exp.id)
    valid = [r for r in runs if r.status == "done" and r.valid]
    finished_s = [(_aware(r.finished_at) - _aware(r.started_at)).total_seconds() for r in valid if r.finished_at]
    running = [r for r in runs if r.status == "running"]
    current: str | None = None
    elapsed = 0.0
    if running and exp.status in ("queued", "running"):
        r = running[-1]
        elapsed = max(0.0, (now - _aware(r.started_at)).total_seconds())
        pts = store.points(r.id)
        current = (f"block {r.block} arm {r.arm}" + (f" (attempt {r.attempt})" if r.attempt else "")
                   + f": {len(pts)} point(s)")
        rows = [row.to_dict() for _, row in pts.iterrows()]
        measured = [(row, att) for row in rows if (att := _attainment(row))]
        unit = plan.workload.rate_unit
        if rows and not _attainment(rows[-1]):  # opened, its records not in yet
            current += f", measuring {_point_name(rows[-1], unit)}"
        if measured:
            current += f", last {_point_name(measured[-1][0], unit)}: attainment {measured[-1][1]}"
        if not rows:
            current += ", deploying"
    s = plan.search
    est = estimate(total_runs=plan.planned_runs,
                   done_runs=len({(r.block, r.arm) for r in valid}),
                   point_s=point_seconds(s.point_s, s.warmup_s, s.cooldown_s), max_points=s.max_points,
                   finished_s=finished_s, running=current is not None, current_elapsed_s=elapsed)
    return StoredProgress(exp.name, exp.id, exp.status, est, len(valid), current)


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _point_name(p: dict[str, Any], unit: str) -> str:
    rate, users = p.get("offered_rate"), p.get("users")
    if isinstance(rate, int | float) and rate == rate:  # NaN: a closed-loop point
        return f"{rate:.3g} {unit}"
    return f"{int(users)} users" if isinstance(users, int | float) and users == users else "point"


def _attainment(p: dict[str, Any]) -> str:
    """"interactive 0.93, batch 1.00"; empty while the point is being measured."""
    per_class = p.get("per_class") or {}
    return ", ".join(f"{k} {v['attainment']:.2f}" for k, v in per_class.items()
                     if isinstance(v, dict) and isinstance(v.get("attainment"), int | float))
