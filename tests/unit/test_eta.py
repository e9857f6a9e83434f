"""The ETA of an experiment, against figures computed by hand."""

from __future__ import annotations

import pytest

from orchestrator.control.eta import estimate, format_duration, point_seconds


def test_point_seconds_is_warmup_window_cooldown() -> None:
    assert point_seconds(120, 30, 5) == 155


def test_before_any_run_a_run_is_a_deploy_and_max_points_points() -> None:
    # 8 runs of 60 s deploy + 12 points x 155 s = 1920 s each -> 15360 s
    e = estimate(total_runs=8, done_runs=0, point_s=155, max_points=12, deploy_s=60)
    assert e.per_run_s == 1920
    assert e.remaining_s == 15360
    assert (e.done_runs, e.total_runs) == (0, 8)


def test_measured_runs_replace_the_plan_estimate() -> None:
    # runs of 1000 s and 1200 s: 1100 s a run; 8 planned, 2 done, 1 running for 300 s:
    # 5 waiting x 1100 + (1100 - 300) = 6300 s
    e = estimate(total_runs=8, done_runs=2, point_s=155, max_points=12, finished_s=[1000, 1200],
                 running=True, current_elapsed_s=300)
    assert e.per_run_s == 1100
    assert e.remaining_s == 6300


def test_a_run_past_its_expectation_still_owes_its_current_point() -> None:
    # running for 1500 s of an expected 1100 s, its point ends in 40 s: 5 x 1100 + 40 = 5540 s
    e = estimate(total_runs=8, done_runs=2, point_s=155, max_points=12, finished_s=[1000, 1200],
                 running=True, current_elapsed_s=1500, point_left_s=40)
    assert e.remaining_s == 5540


def test_nothing_left_and_done_is_capped_at_total() -> None:
    e = estimate(total_runs=2, done_runs=3, point_s=10, max_points=2)
    assert e.remaining_s == 0
    assert e.done_runs == 2


@pytest.mark.parametrize(("seconds", "text"), [
    (15360, "4h16m"), (6300, "1h45m"), (750, "12m30s"), (45, "45s"), (44.6, "45s"), (-3, "0s"),
])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
