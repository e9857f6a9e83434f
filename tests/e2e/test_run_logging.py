"""A run's log records say which experiment, block, arm and attempt they are about, and the
terminal shows the progress lines it always has (orchestrator.logs)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from orchestrator import logs
from tests.e2e.helpers import BASE, run_in_process, small_plan


@pytest.fixture(autouse=True)
def own_logging(monkeypatch: pytest.MonkeyPatch):
    """The run installs the terminal handler at DEBUG here; later tests get logging as it was."""
    monkeypatch.delenv(logs.ENV, raising=False)
    logger = logging.getLogger(logs.ROOT)
    level, handlers = logger.level, list(logger.handlers)
    for h in handlers:
        logger.removeHandler(h)
    yield
    for h in list(logger.handlers):
        logger.removeHandler(h)
    for h in handlers:
        logger.addHandler(h)
    logger.setLevel(level)


def test_a_runs_records_carry_experiment_block_arm_attempt(
    store, state: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = small_plan(name="e2e-logging", search={**BASE["search"], "point_s": 2, "max_points": 2})
    with caplog.at_level(logging.DEBUG, logger=logs.ROOT):
        out = run_in_process(store, plan, state)

    def ctx(r: logging.LogRecord) -> tuple:
        return tuple(vars(r).get(k) for k in ("experiment", "block", "arm", "attempt"))

    progress = [r for r in caplog.records if r.name == "orchestrator.progress"]
    first = progress[0]
    assert first.getMessage().startswith(f"experiment {out.experiment_name} (id {out.experiment_id})")
    assert ctx(first) == (out.experiment_name, None, None, None)
    for arm in ("A", "B"):
        deploying = [r for r in progress if r.getMessage() == f"block 0 arm {arm}: deploying"]
        # The first attempt, then any retry (a timing guard on a loaded machine) with its own.
        assert [ctx(r) for r in deploying] == [(out.experiment_name, 0, arm, k) for k in range(len(deploying))]
        assert deploying
    points = [r for r in progress if r.getMessage().lstrip().startswith("point ")]
    assert points and all(ctx(r)[:2] == (out.experiment_name, 0) and ctx(r)[2] in "AB" for r in points)
    # the sim backend's processes (DEBUG, orchestrator.backends.processes) carry the run too
    started = [r for r in caplog.records if r.name == "orchestrator.backends.processes"
               and r.getMessage().startswith("started ")]
    assert started and {ctx(r)[2] for r in started} == {"A", "B"}
    assert logs.current() == logs.NONE  # the run's context ended with it
    # at DEBUG the terminal lines say it too
    err = capsys.readouterr().err
    assert f"orchestrator.progress [experiment {out.experiment_name} block 0 arm A attempt 0]: block 0 arm A: deploying\n" in err
