"""The capacity summaries keep capacity over history from every valid run (issue 32; migration
0014), on SQLite and PostgreSQL: an all-time `orch capacity` reads one summary row per group
(report.capacity_history) and answers exactly, every column and type, what the live path
(every capacity of the groups, store.capacity_runs) answers; capacity_by_config keeps its point
estimates' figures and skips a group of censored runs only; where the summaries cannot answer
(a zero point estimate, figures not computed yet) the live path does; 0014 up and down on a
stored history, its figures computed by the Store after migrating. Speed is measured by
benchmarks/store_bench.py, never asserted here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest
import sqlalchemy as sa
from alembic import command

from orchestrator.report import capacity_history as ch
from orchestrator.report.capacity_history import capacity_history, capacity_history_live
from orchestrator.store import Store
from orchestrator.store.database import (
    alembic_config,
    current_revision,
    downgrade,
    head_revision,
    upgrade,
)
from tests.integration import test_history_censored as censored
from tests.integration import test_history_groups as groups
from tests.support.runtime_role import grants_at

pytestmark = pytest.mark.integration

CASES: list[dict[str, Any]] = [
    {}, {"service_class": "standard"}, {"model": "qwen3-8b", "gpu": "H200"}, {"layout": "disaggregated"},
    {"simulated": False}, {"backend": "sim", "ttft_ms": 300.0}, {"input_tokens": (2000, 4000)},
    {"service_class": "interactive", "model": "qwen3-8b"}, {"model": "no-such-model"},
]


def _summaries(store: Store) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(
            "select * from capacity_summaries order by config_id, class_name, workload_sha256, ttft_ms, tpot_ms, "
            "backend, simulated"))]


@pytest.fixture
def history(db_url: str) -> Iterator[Store]:
    """Bulk history of every kind of run (summaries rebuilt by the Store), and test_history_censored's
    groups recorded run by run (summaries refreshed by the repository as a controller records)."""
    store = Store.open(db_url)
    groups.seed(store, mixed=True)
    censored._seed(db_url)
    yield store
    store.close()


def test_the_summary_path_equals_the_live_path_on_every_column(history: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    sig = history.workload_signatures()[0]["sha256"]
    for case in [*CASES, {"workload": sig[:8]}]:
        assert history.summarised_history(**case) is not None, case  # the summaries answer it
        got, want = capacity_history(history, **case), capacity_history_live(history, **case)
        pd.testing.assert_frame_equal(got, want, check_exact=True)
    whole = capacity_history(history)
    assert len(whole) > 100  # every kind of group is there
    for column in ("n_censored_above", "n_censored_below", "n_unconverged"):
        assert (whole[column] > 0).sum() > 10, column
    assert (whole["n_points"] == 0).sum() >= 1 and set(whole["median_censored"]) >= {None, "above"}
    # capacity_by_config still answers from the point estimates only: no group of censored runs only
    by_config = history.capacity_by_config()
    keys = ["config_id", "class", *ch.KEY_COLUMNS]
    with_points = whole[whole["n_points"] > 0].sort_values(keys).reset_index(drop=True)
    mine = by_config.sort_values(keys).reset_index(drop=True)
    assert len(mine) == len(with_points)
    assert mine["runs"].tolist() == with_points["n_points"].tolist()
    for column in ("p25", "p75", "min", "max", "spread"):
        assert mine[column].tolist() == with_points[column].tolist(), column
    # the summary path reads no capacity
    monkeypatch.setattr(Store, "capacity_runs", lambda *a, **k: pytest.fail("read every capacity"))
    pd.testing.assert_frame_equal(capacity_history(history), whole)


def test_the_repositorys_refresh_equals_a_rebuild(history: Store) -> None:
    """The rows the repository wrote run by run (and the bulk rebuild) are what a rebuild from the
    runs writes."""
    before = _summaries(history)
    history.rebuild_capacity_summaries()
    assert _summaries(history) == before


def test_a_zero_point_or_uncomputed_figures_are_read_live(db_url: str) -> None:
    censored._seed(db_url)
    with Store.open(db_url) as store:
        assert store.summarised_history() is not None
        # a zero point estimate (recorded as a point; analysis.blocks would have censored it below)
        plan = censored._plan("h200")
        run = store.start_run(store.create_experiment(store.register_plan(plan).id), "A", 7, 0, 0,
                              store.deployment_config(plan, "A"))
        store.record_capacity(run, "interactive", 0.0, 3.0, 0.0, 6)
        store.finish_run(run, "done", valid=True)
        assert store.summarised_history() is None and store.summarised_history(layout="disaggregated") is not None
        row = capacity_history(store, layout="colocated", gpu="H200").iloc[0]
        assert (row["runs"], row["n_points"], row["n_censored_below"]) == (7, 3, 1)  # read as censored below
        assert store.capacity_by_config(layout="colocated", gpu="H200").iloc[0]["runs"] == 4  # a point there
        pd.testing.assert_frame_equal(capacity_history(store), capacity_history_live(store), check_exact=True)
    with Store.open(db_url) as store:  # figures not computed (as 0014 leaves them): live, until refilled
        with store.engine.begin() as conn:
            conn.execute(sa.text("update capacity_summaries set n_points = null where runs = 0"))
        assert store.summarised_history() is None
        want = capacity_history_live(store)
        pd.testing.assert_frame_equal(capacity_history(store), want, check_exact=True)
        upgrade(store.engine)  # at the head already: only the figures are computed
        assert store.summarised_history(layout="disaggregated") is not None
        pd.testing.assert_frame_equal(capacity_history(store), want, check_exact=True)


def test_0014_up_and_down_on_a_stored_history(db_url: str) -> None:
    censored._seed(db_url)
    store = Store.open(db_url)
    engine = store.engine
    try:
        want = capacity_history_live(store)
        assert list(want["n_points"]) == [0, 2, 3]  # B (censored runs only), C, A
        rebuilt = _summaries(store)
        downgrade(engine, "0013")
        columns = {c["name"]: c for c in sa.inspect(engine).get_columns("capacity_summaries")}
        assert "npmle_median" not in columns and "n_points" not in columns
        assert not columns["median"]["nullable"] and not columns["p25"]["nullable"]
        with engine.connect() as conn:  # the point groups' rows only, as 0013 kept them
            assert conn.execute(sa.text("select runs from capacity_summaries order by runs")).scalars().all() == [2, 3]
        role = _grant_0013_role(engine)
        command.upgrade(alembic_config(engine), "head")  # the revision alone: the figures are not computed
        with engine.connect() as conn:
            got = conn.execute(sa.text("select runs, n_points, npmle_median, median is null from capacity_summaries "
                                       "order by runs")).all()
        assert [tuple(r) for r in got] == [(0, None, None, True), (2, None, None, False), (3, None, None, False)]
        assert store.summarised_history() is None  # history reads live meanwhile
        pd.testing.assert_frame_equal(capacity_history(store), want, check_exact=True)
        upgrade(engine)  # what Store.open and `orch db upgrade` run: the Store computes them
        assert current_revision(engine) == head_revision() and _summaries(store) == rebuilt
        assert store.summarised_history() is not None
        pd.testing.assert_frame_equal(capacity_history(store), want, check_exact=True)
        if role is not None:
            with engine.connect() as conn:
                assert conn.execute(sa.text(
                    f"select has_column_privilege('{role}', 'capacity_summaries', 'npmle_median', 'UPDATE'), "
                    f"has_column_privilege('{role}', 'capacity_summaries', 'last_run_measured', 'UPDATE')")).one() \
                    == (True, True)
            _drop_role(engine, role)
    finally:
        store.close()


def _grant_0013_role(engine: sa.Engine) -> str | None:
    """PostgreSQL: a runtime role granted at 0013 (UPDATE on the summaries' statistics then)."""
    if engine.dialect.name != "postgresql":
        return None
    import uuid

    role = f"orch_rt_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role}"))
        for grant in grants_at(role, "0013"):
            conn.execute(sa.text(grant))
    return role


def _drop_role(engine: sa.Engine, role: str) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP OWNED BY {role}"))
        conn.execute(sa.text(f"DROP ROLE {role}"))
