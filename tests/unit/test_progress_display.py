"""The live display of `orch run` (a fake clock, a terminal console writing to a buffer) and the
plain lines kept when stderr is not a terminal."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console

from orchestrator.control import progress as progress_mod
from orchestrator.control.progress import PlainProgress, RichProgress, progress_for_terminal


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_display_lines_follow_runs_points_and_eta() -> None:
    clock = Clock()
    buf = io.StringIO()
    p = RichProgress(console=Console(file=buf, force_terminal=True, width=200), clock=clock)
    try:
        # 4 runs, 1 already done; a run is expected at 60 s deploy + 3 points x 100 s = 360 s
        p.schedule(4, 1, 100.0, 3)
        p.run_started(1, "B", 1)
        clock.t = 50
        # 2 waiting x 360 + (360 - 50) = 1030 s
        assert p.lines() == ["runs 1/4 done, ETA 17m10s | block 1 arm B (attempt 1), 50s in this run",
                             "deploying"]
        p.point_started("2 req/s", 100)
        clock.t = 80
        # 720 + max(360 - 80, 100 - 30) = 1000 s
        assert p.lines() == ["runs 1/4 done, ETA 16m40s | block 1 arm B (attempt 1), 1m20s in this run",
                             "point 2 req/s: 30/100s [######..............]"]
        p.point_done("2 req/s: attainment interactive 0.95")
        p.point_started("3 req/s", 100)
        clock.t = 180
        assert p.lines()[1] == ("point 3 req/s: 100/100s [####################]"
                                " | last: 2 req/s: attainment interactive 0.95")
        clock.t = 400
        p.run_done("block 1 arm B: valid; capacity 2 req/s (2 points)")
        # measured: 400 s a run; 2 runs left -> 800 s
        assert p.lines() == ["runs 2/4 done, ETA 13m20s"]
        p.run_started(2, "A", 0)
        clock.t = 500
        p.run_done("block 2 arm A: INVALID (guard); will retry if allowed")
        assert p.estimate().per_run_s == 400  # an invalid run's duration does not count
        p.run_started(2, "A", 1)
        # a retry: its (block, arm) is not done
        assert p.lines()[0] == "runs 2/4 done, ETA 13m20s | block 2 arm A (attempt 1), 0s in this run"
    finally:
        p.close()


def test_plain_lines_are_unchanged_and_schedule_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    p = PlainProgress()
    with caplog.at_level(logging.INFO, logger="orchestrator.progress"):
        p.blocks(2)
        p.schedule(4, 0, 155.0, 12)
        p.run_started(0, "A", 0)
        p.point_started("2 req/s", 155)
        p.point_done("2 req/s: attainment interactive 0.95")
        p.run_done("block 0 arm A: valid; x (1 points)")
    assert [r.getMessage() for r in caplog.records if r.name == "orchestrator.progress"] == [
        "2 block(s) to run", "block 0 arm A: deploying", "  point 2 req/s (155s)",
        "    2 req/s: attainment interactive 0.95", "  block 0 arm A: valid; x (1 points)",
    ]


def test_not_a_terminal_gets_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_mod.sys.stderr, "isatty", lambda: False, raising=False)
    assert type(progress_for_terminal()) is PlainProgress


# -- the running point's attainment so far (issue 20 item 6) -----------------------------------


def _record(i: int, phase: str = "measure", ttft_s: float = 0.1, tpot_s: float = 0.01, ok: bool = True):
    from orchestrator.records import RequestRecord

    r = RequestRecord(request_id=i, conversation_id=i, turn=0, phase=phase, scheduled_s=100.0 + i,
                      sent_s=100.0 + i, output_tokens_asked=11)
    if ok:
        r.first_token_s = r.scheduled_s + ttft_s
        r.last_token_s = r.first_token_s + tpot_s * 10
        r.output_tokens, r.status = 11, "ok"
    else:
        r.status, r.error = "http_error", "500"
    return r


def test_display_shows_the_running_points_attainment_so_far() -> None:
    from orchestrator.control.progress import AttainmentTally
    from orchestrator.plan import SERVICE_CLASSES

    clock = Clock()
    p = RichProgress(console=Console(file=io.StringIO(), force_terminal=True, width=200), clock=clock)
    # interactive: TTFT <= 300 ms, TPOT <= 10 ms; standard: 1 s, 50 ms
    tally = AttainmentTally([SERVICE_CLASSES["interactive"], SERVICE_CLASSES["standard"]], scheduled=10)
    try:
        p.schedule(2, 0, 100.0, 3)
        p.run_started(0, "A", 0)
        p.point_started("2 req/s [interactive]", 100)
        clock.t = 30
        p.point_progress(tally.add([_record(0, phase="warmup")]))  # warm-up: not the window
        assert p.lines()[2] == "window so far: 0/10 ended"
        # 4 ended: one misses interactive's TTFT, one fails outright (a miss of every class).
        p.point_progress(tally.add([_record(1), _record(2, ttft_s=0.5), _record(3), _record(4, ok=False)]))
        assert p.lines() == ["runs 0/2 done, ETA 11m30s | block 0 arm A, 30s in this run",
                             "point 2 req/s [interactive]: 30/100s [######..............]",
                             "window so far: 4/10 ended | attainment interactive 0.50, standard 0.75"]
        p.point_progress(tally.add([_record(5, tpot_s=0.02)]))  # misses interactive's TPOT only
        assert p.lines()[2] == "window so far: 5/10 ended | attainment interactive 0.40, standard 0.80"
        p.point_done("2 req/s: attainment interactive 0.40, standard 0.80")
        assert len(p.lines()) == 2  # the ended point's figure is gone; its line says the result
        p.point_progress(tally.add([_record(6)]))  # a late batch is not the next point's
        p.point_started("3 req/s [interactive]", 100)
        assert len(p.lines()) == 2
    finally:
        p.close()


def test_attainment_so_far_without_a_known_count_and_plain_lines_say_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    from orchestrator.control.progress import AttainmentTally
    from orchestrator.plan import SERVICE_CLASSES

    tally = AttainmentTally([SERVICE_CLASSES["standard"]])  # a closed loop: the count is not known ahead
    so_far = tally.add([_record(1), _record(2, ok=False)])
    assert so_far.text() == "window so far: 2 ended | attainment standard 0.50"
    assert so_far.attainment("standard") == 0.5 and so_far.attainment("batch") is None
    p = PlainProgress()
    with caplog.at_level(logging.INFO, logger="orchestrator.progress"):
        p.point_started("2 req/s", 155)
        p.point_progress(so_far)
        p.point_done("2 req/s: attainment standard 0.50")
    # Off a terminal: still one line per point, nothing per batch.
    assert [r.getMessage() for r in caplog.records if r.name == "orchestrator.progress"] == [
        "  point 2 req/s (155s)", "    2 req/s: attainment standard 0.50"]
