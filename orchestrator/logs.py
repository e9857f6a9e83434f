"""Logging with the run's context: which experiment, block, arm and attempt a record is about.

Every part logs through ``get_logger(__name__)``: an adapter that puts the current context
(``experiment``, ``arm``, ``block``, ``attempt`` attributes, None where not known yet) on each
record. The executor sets the context (``bind``) when an experiment and each attempt start; it is
a context variable, so concurrent experiments (threads of the Ray controller) keep their own.

The terminal sees one handler on the ``orchestrator`` logger (``configure``): at INFO and above
it prints each message alone, the lines ``orch run`` has always printed; at DEBUG it adds the
time, level, logger and the context. It writes to ``sys.stderr`` as it is when a record comes,
so a live progress display (which redirects stderr) prints the lines above its bars. The level:
``orch --log-level``, else ``ORCH_LOG_LEVEL``, else INFO.

Standard library only: every layer may import it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from contextvars import ContextVar
from dataclasses import asdict, dataclass, replace
from typing import Any

from orchestrator.secrets import scrub

ROOT = "orchestrator"
ENV = "ORCH_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FIELDS = ("experiment", "block", "arm", "attempt")


@dataclass(frozen=True)
class RunContext:
    """What the records logged now are about (None: not known at this point)."""

    experiment: str | None = None
    arm: str | None = None
    block: int | None = None
    attempt: int | None = None  # as stored: 0 for a run's first attempt

    def label(self) -> str:
        """E.g. ``experiment exp-1 block 2 arm B attempt 0`` (only the fields known)."""
        return " ".join(f"{k} {getattr(self, k)}" for k in FIELDS if getattr(self, k) is not None)


NONE = RunContext()
_CURRENT: ContextVar[RunContext | None] = ContextVar("orchestrator_run_context", default=None)


def current() -> RunContext:
    return _CURRENT.get() or NONE


def bind(**fields: Any) -> RunContext:
    """Set fields of the current context (``bind(experiment=name, arm=None, ...)``)."""
    ctx = replace(current(), **fields)
    _CURRENT.set(ctx)
    return ctx


class RunLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger whose records carry the current run context as attributes."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**asdict(current()), **(kwargs.get("extra") or {})}
        return msg, kwargs


def get_logger(name: str) -> RunLogger:
    return RunLogger(logging.getLogger(name), {})


def parse_level(text: str) -> int:
    """A level name (any case) as logging's number; ValueError names the choices."""
    name = text.strip().upper()
    if name not in LEVELS:
        raise ValueError(f"log level {text!r}: one of {', '.join(LEVELS)}")
    return int(logging.getLevelName(name))


class TerminalHandler(logging.Handler):
    """One line per record on the process's stderr as it is at the time (see the module)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)


class LineFormatter(logging.Formatter):
    """The message alone; ``detailed``: time, level, logger and the run's context before it."""

    def __init__(self, detailed: bool = False):
        super().__init__("%(message)s")
        self.detailed = detailed

    def format(self, record: logging.LogRecord) -> str:
        line = scrub(super().format(record))
        if not self.detailed:
            return line
        ctx = " ".join(f"{k} {getattr(record, k)}" for k in FIELDS
                       if getattr(record, k, None) is not None)
        return (f"{self.formatTime(record)} {record.levelname:<7} {record.name}"
                + (f" [{ctx}]" if ctx else "") + f": {line}")


def _handler() -> TerminalHandler | None:
    return next((h for h in logging.getLogger(ROOT).handlers if isinstance(h, TerminalHandler)), None)


def configure(level: str | int | None = None, detailed: bool | None = None) -> int:
    """Set the ``orchestrator`` loggers' level (``level``, else ORCH_LOG_LEVEL, else INFO) and
    the one terminal handler (added once per process); ``detailed`` defaults to level <= DEBUG.
    Returns the level. ValueError for a level that is not one of LEVELS."""
    number = level if isinstance(level, int) else parse_level(level or os.environ.get(ENV) or "INFO")
    logging.getLogger(ROOT).setLevel(number)
    _install(number <= logging.DEBUG if detailed is None else detailed)
    return number


def ensure_configured() -> None:
    """The terminal handler, unless this process has it (the CLI adds it first; a Ray worker
    or a test running the executor directly gets it here); the level from ORCH_LOG_LEVEL (else
    INFO) only where none was set (a test's caplog.at_level stands). A bad ORCH_LOG_LEVEL falls
    back to INFO, said once, rather than failing the run."""
    if _handler() is not None:
        return
    logger = logging.getLogger(ROOT)
    if logger.level == logging.NOTSET:
        try:
            logger.setLevel(parse_level(os.environ.get(ENV) or "INFO"))
        except ValueError as e:
            logger.setLevel(logging.INFO)
            _install(False)
            get_logger(__name__).warning("%s=%s ignored (%s); logging at INFO", ENV, os.environ.get(ENV), e)
            return
    _install(logger.getEffectiveLevel() <= logging.DEBUG)


def _install(detailed: bool) -> None:
    handler = _handler()
    if handler is None:
        handler = TerminalHandler()
        logging.getLogger(ROOT).addHandler(handler)
    handler.setFormatter(LineFormatter(detailed))
