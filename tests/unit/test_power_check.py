"""The pre-run power check (issue 21): a plan's dry run, cached by plan hash, reduced to the
bars it predicts too weak to judge with the plan's blocks."""

from __future__ import annotations

import copy
from pathlib import Path

from orchestrator.control.dryrun import LOW_POWER, power_check
from orchestrator.plan import Plan, validate_plan
from tests.e2e.helpers import BASE


def plan(at_least: float, blocks: int = 2, bars: bool = True) -> Plan:
    d = copy.deepcopy(BASE)
    d["name"] = "power-check"
    d["design"] = {"blocks": blocks, "order": "ABBA", "seed": 5, "max_retries": 1}
    if bars:
        d["bars"] = [{"id": "win", "metric": "capacity", "class": "standard", "at_least": at_least,
                      "confidence": 0.9}]
    return validate_plan(d)


def test_an_a_a_plan_asking_for_a_win_is_low_power_with_what_it_would_cost(tmp_path: Path) -> None:
    check = power_check(plan(1.3), tmp_path)
    assert not check.ok and not check.cached
    (bar,) = check.low
    assert bar["id"] == "win" and bar["power"] < LOW_POWER
    msg = check.message()
    assert "\n" not in msg
    assert "bar win: predicted power 0% with 2 block(s)" in msg and "against >= 1.3" in msg
    assert "no number of blocks reaches 80% power" in msg and f"this run: {check.gpu_hours:.2f} GPU-hours" in msg
    assert check.gpu_hours > 0


def test_the_dry_run_is_cached_by_plan_hash(tmp_path: Path) -> None:
    first = power_check(plan(1.3), tmp_path)
    (path,) = tmp_path.glob(f"{first.sha256}-*.json")
    again = power_check(plan(1.3), tmp_path)
    assert again.cached and again.low == first.low
    path.write_text("{half a fi")  # a torn cache file is recomputed, not trusted
    assert not power_check(plan(1.3), tmp_path).cached
    other = power_check(plan(1.3, blocks=3), tmp_path)  # another plan, another hash
    assert not other.cached and other.sha256 != first.sha256


def test_a_bar_the_design_can_judge_passes_and_a_plan_without_bars_is_not_simulated(tmp_path: Path) -> None:
    assert power_check(plan(0.5, blocks=4), tmp_path).ok
    none = power_check(plan(1.3, bars=False), tmp_path)
    assert none.ok and none.skipped == "the plan has no bars"
    assert list(tmp_path.glob(f"{none.sha256}-*")) == []


def test_an_interactive_terminal_asks_and_yes_skips_the_question(tmp_path: Path, monkeypatch) -> None:
    import pytest
    import typer

    from orchestrator.cli import run_cmd
    from orchestrator.control import dryrun
    from orchestrator.errors import UserError

    low = power_check(plan(1.3), tmp_path)
    monkeypatch.setattr(dryrun, "power_check", lambda p: low)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    answers: list[bool] = []
    monkeypatch.setattr(typer, "confirm", lambda *a, **k: answers.pop())
    answers.append(True)
    run_cmd._check_power(plan(1.3), yes=False, allow_low_power=False)  # asked, said yes
    answers.append(False)
    with pytest.raises(UserError, match="--yes runs it anyway"):
        run_cmd._check_power(plan(1.3), yes=False, allow_low_power=False)
    run_cmd._check_power(plan(1.3), yes=True, allow_low_power=False)  # not asked: answers is empty
    assert answers == []
