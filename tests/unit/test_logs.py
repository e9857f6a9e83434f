"""Logging with the run's context (orchestrator.logs): the adapter, the terminal lines, the level
(`orch --log-level`, ORCH_LOG_LEVEL) and the progress sink's lines as records."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import logs
from orchestrator.cli.main import main
from orchestrator.control.progress import PlainProgress

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts without our handler and leaves the process's logging as it found it."""
    monkeypatch.delenv(logs.ENV, raising=False)
    logger = logging.getLogger(logs.ROOT)
    level, handlers = logger.level, list(logger.handlers)
    for h in handlers:
        logger.removeHandler(h)
    try:
        yield
    finally:
        for h in list(logger.handlers):
            logger.removeHandler(h)
        for h in handlers:
            logger.addHandler(h)
        logger.setLevel(level)


def _in_own_context(fn, *args):
    return contextvars.copy_context().run(fn, *args)


def _context(r: logging.LogRecord) -> tuple:
    """(experiment, block, arm, attempt) of a record (attributes the adapter adds)."""
    return tuple(vars(r)[k] for k in ("experiment", "block", "arm", "attempt"))


def test_records_carry_the_context_bound_when_they_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    log = logs.get_logger("orchestrator.test")

    def body() -> None:
        log.warning("before")
        logs.bind(experiment="exp-1")
        log.warning("experiment known")
        logs.bind(block=2, arm="B", attempt=1)
        log.warning("in a run", extra={"arm": "A"})  # an explicit extra wins

    with caplog.at_level(logging.INFO, logger=logs.ROOT):
        _in_own_context(body)
    got = [(r.getMessage(), *_context(r)) for r in caplog.records]
    assert got == [("before", None, None, None, None), ("experiment known", "exp-1", None, None, None),
                   ("in a run", "exp-1", 2, "A", 1)]
    assert logs.current() == logs.NONE  # bound inside its own context: nothing leaked


def test_terminal_lines_are_the_message_alone_unless_detailed(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("INFO")
    log = logs.get_logger("orchestrator.test")

    def body() -> None:
        logs.bind(experiment="exp-1", block=0, arm="A", attempt=0)
        log.info("block 0 arm A: deploying")
        log.debug("hidden at INFO")
        logs.configure("DEBUG")
        log.debug("waiting for 2 server(s)")

    _in_own_context(body)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "block 0 arm A: deploying"
    assert len(lines) == 2
    assert lines[1].endswith("DEBUG   orchestrator.test [experiment exp-1 block 0 arm A attempt 0]: "
                             "waiting for 2 server(s)")
    assert len([h for h in logging.getLogger(logs.ROOT).handlers if isinstance(h, logs.TerminalHandler)]) == 1


def test_level_from_argument_environment_or_info(monkeypatch: pytest.MonkeyPatch) -> None:
    assert logs.configure() == logging.INFO
    monkeypatch.setenv(logs.ENV, "warning")
    assert logs.configure() == logging.WARNING
    assert logs.configure("debug") == logging.DEBUG
    assert logging.getLogger("orchestrator.control.executor").getEffectiveLevel() == logging.DEBUG
    with pytest.raises(ValueError, match="'loud': one of DEBUG, INFO"):
        logs.parse_level("loud")


def test_a_bad_environment_level_outside_the_cli_falls_back_to_info(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(logs.ENV, "loud")
    # A fresh process: no terminal handler and no level yet (an earlier test in this process
    # may have configured them, e.g. through the CLI).
    root = logging.getLogger(logs.ROOT)
    for h in [h for h in root.handlers if isinstance(h, logs.TerminalHandler)]:
        monkeypatch.setattr(root, "handlers", [x for x in root.handlers if x is not h])
    monkeypatch.setattr(root, "level", logging.NOTSET)
    logs.ensure_configured()  # as a Ray worker's progress sink does
    assert logging.getLogger(logs.ROOT).level == logging.INFO
    assert "ORCH_LOG_LEVEL=loud ignored" in capsys.readouterr().err


def test_progress_lines_are_info_records_printed_as_before(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    def body() -> None:
        p = PlainProgress()
        logs.bind(experiment="exp-1", block=1, arm="B", attempt=1)
        p.run_started(1, "B", 1)
        p.point_started("2 req/s", 5.5)
        p.point_done("2 req/s: attainment standard 0.99")
        p.run_done("block 1 arm B: valid")

    with caplog.at_level(logging.INFO, logger=logs.ROOT):
        _in_own_context(body)
    assert capsys.readouterr().err.splitlines() == [
        "block 1 arm B (attempt 1): deploying", "  point 2 req/s (6s)",
        "    2 req/s: attainment standard 0.99", "  block 1 arm B: valid",
    ]
    assert {(r.name, r.levelno, *_context(r)) for r in caplog.records} == {
        ("orchestrator.progress", logging.INFO, "exp-1", 1, "B", 1)}


def test_cli_log_level_option(capsys: pytest.CaptureFixture[str]) -> None:
    example = str(ROOT / "examples" / "quickstart.yaml")
    assert main(["--log-level", "DEBUG", "plan", "validate", example]) == 0
    assert logging.getLogger(logs.ROOT).level == logging.DEBUG
    capsys.readouterr()
    assert main(["--log-level", "nonsense", "plan", "validate", example]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == ["--log-level: log level 'nonsense': one of DEBUG, INFO, WARNING, ERROR, CRITICAL"]
