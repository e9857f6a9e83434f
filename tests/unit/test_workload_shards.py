"""How many generator processes a point needs (pure) and the ceiling a search may reach."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.control.executor import Executor, ExecutorConfig
from orchestrator.loadgen.schedules import shards_needed
from orchestrator.plan import Workload
from orchestrator.store import Store


def test_one_process_while_it_holds_the_rate_then_enough_shards() -> None:
    assert shards_needed(1.4, 1.5, 4) == 1
    assert shards_needed(1.6, 1.5, 4) == 2
    assert shards_needed(100, 1.5, 4) == 4  # capped: the search never asks above 4 x 1.5
    assert shards_needed(100, 1.5, 1) == 1


def test_the_search_ceiling_is_one_process_times_the_shards(tmp_path: Path) -> None:
    from tests.e2e.helpers import small_plan

    ex = Executor(None, None, ExecutorConfig(state_dir=tmp_path, generator_ceiling=1.5, max_shards=3))  # type: ignore[arg-type]
    plan = small_plan()
    assert ex._ceiling(plan) == 4.5
    sessions = small_plan(workload={**plan.workload.model_dump(), "sessions": {"think": {"mean_s": 1}}})
    assert isinstance(sessions.workload, Workload) and ex._ceiling(sessions) == 1.5  # sessions: one process
    # A session brings its turns: 4 turns a session hold 1.5 req/s at 0.375 sessions/s, the
    # ceiling in the plan's unit (it compared sessions/s with req/s before).
    doc = sessions.workload.model_dump()
    four = small_plan(workload={**doc, "prompts": {**doc["prompts"], "turns": 4}})
    assert four.workload.rate_unit == "sessions/s" and ex._ceiling(four) == pytest.approx(0.375)
    assert Executor(None, None, ExecutorConfig(state_dir=tmp_path))._ceiling(plan) is None  # type: ignore[arg-type]


def test_shards_are_chosen_on_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: Store) -> None:
    """Issue 32: `orch run --shards N` bounds the generator processes a point may use (1: one
    process, Ray never starts); without it ORCH_LOADGEN_MAX_SHARDS, else one per core."""
    from orchestrator.cli.main import main
    from orchestrator.control.progress import PlainProgress
    from orchestrator.control.session import build_executor, max_shards
    from tests.e2e.helpers import small_plan

    monkeypatch.setenv("ORCH_SKIP_CALIBRATION", "1")
    plan = small_plan()
    assert build_executor(plan, store, "virtual", tmp_path, PlainProgress(), shards=1).config.max_shards == 1
    assert build_executor(plan, store, "virtual", tmp_path, PlainProgress()).config.max_shards == max_shards()
    monkeypatch.setenv("ORCH_LOADGEN_MAX_SHARDS", "3")
    assert build_executor(plan, store, "virtual", tmp_path, PlainProgress(), shards=2).config.max_shards == 2
    assert main(["run", str(tmp_path / "none.yaml"), "--shards", "0"]) == 1  # out of range: the input is wrong
