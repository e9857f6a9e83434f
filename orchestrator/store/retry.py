"""Riding through a database outage: every store call of a run is retried with backoff while
the database is unreachable, within a budget (DESIGN 12). Past the budget the call raises
:class:`DatabaseOutage` (an EnvironmentProblem: exit 2, one line)."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy.exc

from orchestrator import logs
from orchestrator.errors import EnvironmentProblem

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
    """A Store whose calls ride through outages (see module docstring). ``start_run`` is made
    idempotent: a retry after a commit whose answer was lost finds the run it made."""

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

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            if name == "start_run":
                return self._start_run(attr, *args, **kwargs)
            return retrying(lambda: attr(*args, **kwargs), name, self.retry_budget_s,
                            on_recovered=self._on_recovered)

        return call

    def _start_run(self, attr: Callable[..., int], experiment_id: int, arm: str, block: int, position: int,
                   attempt: int, config_id: int) -> int:
        tries = [0]

        def once() -> int:
            tries[0] += 1
            try:
                return attr(experiment_id, arm, block, position, attempt, config_id)
            except Exception as e:
                if tries[0] > 1 and not is_transient(e):
                    for r in self._store.runs(experiment_id):  # an earlier try committed
                        if (r.block, r.arm, r.attempt) == (block, arm, attempt) and r.status == "running":
                            return int(r.id)
                raise

        return int(retrying(once, "start_run", self.retry_budget_s, on_recovered=self._on_recovered))
