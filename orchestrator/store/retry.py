"""Riding through a database outage: every store call of a run is retried with backoff while
the database is unreachable, within a budget (DESIGN 12). Past the budget the call raises
:class:`DatabaseOutage` (an EnvironmentProblem: exit 2, one line)."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
import sqlalchemy.exc

from orchestrator import logs
from orchestrator.errors import EnvironmentProblem
from orchestrator.store.models import LoadPoint, MetricSample, Run

log = logs.get_logger(__name__)

DEFAULT_BUDGET_S = 60.0
# Calls that must fail fast: the spooling sink spools what ingest cannot write now.
NO_RETRY = frozenset({"ingest_requests", "close"})


class DatabaseOutage(EnvironmentProblem):
    """The database stayed unreachable for the whole retry budget."""


def budget_s() -> float:
    """ORCH_DB_RETRY_BUDGET_S (seconds), default 60."""
    raw = os.environ.get("ORCH_DB_RETRY_BUDGET_S")
    try:
        value = float(raw) if raw else DEFAULT_BUDGET_S
    except ValueError:
        raise EnvironmentProblem(f"ORCH_DB_RETRY_BUDGET_S={raw!r} is not a number of seconds") from None
    return value if value >= 0 and value == value and value != float("inf") else DEFAULT_BUDGET_S


def is_transient(e: BaseException) -> bool:
    """An unreachable, restarting or dropped database (not a constraint or a bug)."""
    if isinstance(e, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
        return True
    return isinstance(e, sqlalchemy.exc.DBAPIError) and bool(e.connection_invalidated)


def first_line(e: BaseException) -> str:
    text = str(getattr(e, "orig", None) or e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def retrying(fn: Callable[[], Any], what: str, budget: float, sleep: Callable[[float], None] = time.sleep,
             on_recovered: Callable[[], None] | None = None) -> Any:
    """``fn()``, retried on transient database errors with backoff (0.2 s doubling to 5 s) for
    up to ``budget`` seconds; then :class:`DatabaseOutage`."""
    deadline = time.monotonic() + budget
    delay, failed = 0.2, None
    while True:
        try:
            out = fn()
        except Exception as e:
            if not is_transient(e):
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise DatabaseOutage(
                    f"the database did not answer for {budget:.0f} s ({what}: {first_line(e)}); "
                    "the run is aborted; records taken are kept and replayed when `orch run` resumes"
                ) from None
            if failed is None:
                log.warning("database unreachable (%s during %s); retrying for up to %.0f s",
                            first_line(e), what, budget)
            failed = e
            sleep(min(delay, left))
            delay = min(delay * 2, 5.0)
            continue
        if failed is not None:
            log.warning("database back after an outage (%s)", what)
            if on_recovered is not None:
                on_recovered()
        return out


class ResilientStore:
    """A Store whose calls ride through outages (see module docstring).

    A write whose commit succeeded but whose answer was lost (the connection dropped after
    COMMIT) must not be written twice when it is retried: before each retry of a write named in
    :data:`PROBES` the store is asked whether the first try's row is there, and if it is, that
    row's result is returned instead of writing again. (Capacities are upserts and a point's
    finish an update of the same values: retrying them is harmless as it is.)"""

    def __init__(self, store: Any, budget: float | None = None, on_recovered: Callable[[], None] | None = None):
        self._store = store
        self.retry_budget_s = budget_s() if budget is None else budget
        self._on_recovered = on_recovered

    @property
    def inner(self) -> Any:
        return self._store

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name.startswith("_") or name in NO_RETRY or not callable(attr):
            return attr
        probe = PROBES.get(name)

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            tries = [0]

            def once() -> Any:
                tries[0] += 1
                if tries[0] > 1 and probe is not None:  # an earlier try may have committed
                    found = probe(self._store, *args, **kwargs)
                    if found is not _ABSENT:
                        log.info("%s: the try before the outage had committed; not written again", name)
                        return found
                return attr(*args, **kwargs)

            return retrying(once, name, self.retry_budget_s, on_recovered=self._on_recovered)

        return call


_ABSENT = object()


def _started_run(store: Any, experiment_id: int, arm: str, block: int, position: int, attempt: int,
                 config_id: int) -> Any:
    for r in store.runs(experiment_id):
        if (r.block, r.arm, r.attempt) == (block, arm, attempt):
            return int(r.id)
    return _ABSENT


def _recorded_point(store: Any, run_id: int, *, seq: int, **_: Any) -> Any:
    with store.engine.connect() as conn:
        found = conn.execute(sa.select(LoadPoint.id).where(LoadPoint.run_id == run_id, LoadPoint.seq == seq)).scalar()
    return _ABSENT if found is None else int(found)


def _finished_run(store: Any, run_id: int, status: str, *_: Any, **__: Any) -> Any:
    with store.engine.connect() as conn:
        now = conn.execute(sa.select(Run.status).where(Run.id == run_id)).scalar()
    return None if now == status else _ABSENT


def _recorded_guards(store: Any, run_id: int, point_id: int | None, results: Any) -> Any:
    names = {r[0] if isinstance(r, tuple) else r.name for r in results}
    have = {g.name for g in store.guard_results(run_id) if g.point_id == point_id}
    return None if names and names <= have else _ABSENT


def _recorded_verdict(store: Any, experiment_id: int, registration_id: int, bar_id: str, verdict: str,
                      estimate: float | None, lower: float | None, upper: float | None, blocks: int,
                      **_: Any) -> Any:
    latest = {v.bar_id: v for v in store.verdicts(experiment_id)}.get(bar_id)
    same = latest is not None and (latest.verdict, latest.estimate, latest.lower, latest.upper, latest.blocks) == (
        verdict, estimate, lower, upper, blocks)
    return None if same else _ABSENT


def _recorded_samples(store: Any, run_id: int, point_id: int | None, samples: Any) -> Any:
    samples = list(samples)
    if not samples:
        return _ABSENT
    t, name = float(samples[0][0]), samples[0][1]
    with store.engine.connect() as conn:
        n = conn.execute(sa.select(sa.func.count()).select_from(MetricSample).where(
            MetricSample.run_id == run_id, MetricSample.point_id.is_(None) if point_id is None
            else MetricSample.point_id == point_id, MetricSample.t == t, MetricSample.name == name)).scalar()
    return len(samples) if n else _ABSENT


# Write -> how to tell that an earlier try of the same call committed (its result, or _ABSENT).
PROBES: dict[str, Callable[..., Any]] = {
    "start_run": _started_run,
    "record_point": _recorded_point,
    "finish_run": _finished_run,
    "record_guards": _recorded_guards,
    "record_verdict": _recorded_verdict,
    "record_metric_samples": _recorded_samples,
}
