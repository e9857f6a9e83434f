"""Migrations: one head, up and down on both databases, and the models match the migrated schema."""

from __future__ import annotations

import ast
import re

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from orchestrator.store.database import (
    MIGRATIONS_DIR,
    alembic_config,
    create_engine,
    current_revision,
    downgrade,
    head_revision,
    upgrade,
)
from orchestrator.store.models import Base

TABLES = {
    "plan_registrations", "deployment_configs", "experiments", "runs", "load_points", "requests",
    "guard_results", "capacities", "bar_verdicts", "metric_samples", "capacity_summaries", "history_groups",
}


def test_there_is_exactly_one_head() -> None:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    assert len(heads) == 1, heads
    assert head_revision() == heads[0]


def test_revision_files_are_named_nnnn_slug_and_import_no_orm() -> None:
    files = sorted((MIGRATIONS_DIR / "versions").glob("*.py"))
    assert files
    for f in files:
        assert re.fullmatch(r"\d{4}_[a-z0-9_]+\.py", f.name), f.name
        imported = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(a.name for a in node.names)
        assert not any(m.startswith("orchestrator") for m in imported), (f.name, imported)


def test_upgrade_then_downgrade_then_upgrade(db_url: str) -> None:
    engine = create_engine(db_url)
    upgrade(engine)
    assert current_revision(engine) == head_revision()
    assert set(sa.inspect(engine).get_table_names()) >= TABLES
    downgrade(engine, "base")
    assert current_revision(engine) is None
    assert not TABLES & set(sa.inspect(engine).get_table_names())
    upgrade(engine)  # downgrade left nothing behind that blocks a fresh upgrade (triggers, functions)
    assert set(sa.inspect(engine).get_table_names()) >= TABLES
    engine.dispose()


def test_upgrade_to_summaries_summarises_existing_history(db_url: str) -> None:
    """0002 and 0003 on a database that already holds runs: the summaries equal the live
    aggregate, and the capacities carry their run's configuration, validity and time."""
    from orchestrator.plan import load_plan_file
    from orchestrator.store import Store

    engine = create_engine(db_url)
    upgrade(engine, "0001")
    plan = load_plan_file(MIGRATIONS_DIR.parent / "examples" / "quickstart.yaml")
    store = Store(engine)  # at 0001: write runs with plain SQL, as an older orchestrator did
    reg = store.register_plan(plan)
    exp = store.create_experiment(reg.id)
    cfg = store.deployment_config(plan, "A")
    with engine.begin() as conn:
        for i, (cap, valid) in enumerate([(100.0, True), (300.0, True), (200.0, True), (9e9, False)]):
            run = conn.execute(sa.text(
                "insert into runs (experiment_id, config_id, arm, block, position, attempt, status, valid, "
                "started_at, finished_at) values (:e, :c, 'A', :b, 0, 0, 'done', :v, :t, :t) returning id"),
                {"e": exp, "c": cfg, "b": i, "v": valid, "t": f"2026-01-0{i + 1} 10:00:00"}).scalar_one()
            conn.execute(sa.text("insert into capacities (run_id, class_name, capacity, points_used) "
                                 "values (:r, 'interactive', :cap, 5)"), {"r": run, "cap": cap})
    upgrade(engine)
    summary = store.capacity_by_config()
    live = store.capacity_by_config(since_days=10_000)
    assert summary.to_dict("records") == live.to_dict("records")
    assert (summary.loc[0, "runs"], summary.loc[0, "median"], summary.loc[0, "max"]) == (3, 200.0, 300.0)
    assert summary.loc[0, "last_measured"].day == 3
    with engine.connect() as conn:
        copied = conn.execute(sa.text(
            "select c.config_id, c.counted, c.measured_at is not null from capacities c order by c.id")).all()
    assert [tuple(r) for r in copied] == [(cfg, True, True)] * 3 + [(cfg, False, True)]
    engine.dispose()


def test_0005_moves_a_points_context_to_its_column_and_back(db_url: str) -> None:
    """0005 on a database that holds points and capacities: each point's context leaves its
    percentiles for the context column (infinities kept as stored), capacities stored before
    count as converged and uncensored; the downgrade puts every context back."""
    import json

    from orchestrator.plan import load_plan_file
    from orchestrator.store import Store

    engine = create_engine(db_url)
    upgrade(engine, "0004")
    plan = load_plan_file(MIGRATIONS_DIR.parent / "examples" / "quickstart.yaml")
    store = Store(engine)
    reg = store.register_plan(plan)
    exp = store.create_experiment(reg.id)
    cfg = store.deployment_config(plan, "A")
    ctx = {"server_prefix_hit_rate": 0.61, "send_lag_p99_s": "Infinity", "seed": 7}
    pct = {"ttft_s": {"99": "Infinity"}, "context": ctx}
    with engine.begin() as conn:
        run = conn.execute(sa.text(
            "insert into runs (experiment_id, config_id, arm, block, position, attempt, status, valid, started_at) "
            "values (:e, :c, 'A', 0, 0, 0, 'done', true, '2026-01-01 10:00:00') returning id"),
            {"e": exp, "c": cfg}).scalar_one()
        for seq, doc in enumerate([pct, {"ttft_s": {}}]):
            conn.execute(sa.text(
                "insert into load_points (run_id, seq, window_start_s, window_end_s, per_class, percentiles, valid, "
                "created_at) values (:r, :s, 0, 1, '{}', :p, true, '2026-01-01 10:00:00')"),
                {"r": run, "s": seq, "p": json.dumps(doc)})
        conn.execute(sa.text("insert into capacities (run_id, class_name, capacity, points_used) "
                             "values (:r, 'interactive', 100, 5)"), {"r": run})
    upgrade(engine)

    def points(columns: str = "percentiles, context") -> list[tuple[object, ...]]:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(f"select {columns} from load_points order by seq")).all()
        return [tuple(json.loads(v) if isinstance(v, str) else v for v in r) for r in rows]

    assert points() == [({"ttft_s": {"99": "Infinity"}}, ctx), ({"ttft_s": {}}, None)]
    with engine.connect() as conn:
        cap = conn.execute(sa.text("select censored, converged, upper from capacities")).one()
    assert (cap[0], bool(cap[1]), cap[2]) == (None, True, None)
    downgrade(engine, "0004")
    assert points("percentiles") == [(pct,), ({"ttft_s": {}},)]
    engine.dispose()


def test_models_match_the_migrated_schema(db_url: str) -> None:
    engine = create_engine(db_url)
    upgrade(engine)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        diff = compare_metadata(ctx, Base.metadata)
    engine.dispose()
    assert diff == []


def test_0010_numbers_the_groups_of_a_0009_database(db_url: str) -> None:
    """A history written before 0010 (the groups' table and column dropped by its downgrade)
    gets every group numbered by the upgrade, once, and the same answers as before."""
    import pandas as pd
    import yaml

    from orchestrator.plan import validate_plan
    from orchestrator.store import Store
    from orchestrator.store.models import Capacity, HistoryGroup
    from tests.integration.test_history_groups import CASES, QUICKSTART, seed

    engine = create_engine(db_url)
    upgrade(engine)
    store = Store(engine)
    seed(store, runs=150, seed_=11)
    before = {str(c): store.capacity_by_config(**c) for c in CASES}
    downgrade(engine, "0009")
    assert "history_groups" not in sa.inspect(engine).get_table_names()
    upgrade(engine)
    with engine.connect() as conn:
        groups = conn.execute(sa.select(sa.func.count()).select_from(HistoryGroup)).scalar_one()
        counted = conn.execute(sa.select(sa.func.count()).select_from(Capacity).where(Capacity.group_id.is_(None))).scalar_one()
        mismatched = conn.execute(
            sa.select(sa.func.count()).select_from(Capacity).join(HistoryGroup, HistoryGroup.id == Capacity.group_id)
            .where(sa.or_(HistoryGroup.config_id != Capacity.config_id, HistoryGroup.class_name != Capacity.class_name,
                          HistoryGroup.workload_sha256 != sa.func.coalesce(Capacity.workload_sha256, ""),
                          HistoryGroup.ttft_ms != sa.func.coalesce(Capacity.ttft_ms, 0.0),
                          HistoryGroup.backend != sa.func.coalesce(Capacity.backend, ""),
                          HistoryGroup.simulated != sa.func.coalesce(Capacity.simulated, sa.false())))
        ).scalar_one()
        distinct = conn.execute(sa.select(sa.func.count(sa.distinct(Capacity.group_id)))).scalar_one()
    assert (counted, mismatched) == (0, 0)  # every capacity numbered, by its own keys
    assert groups == distinct > 10
    for c in CASES:
        pd.testing.assert_frame_equal(store.capacity_by_config(**c), before[str(c)], check_exact=True)
    # a run finished after the upgrade joins its group (the repository numbers it)
    plan = validate_plan(yaml.safe_load(QUICKSTART.read_text()))
    exp = store.create_experiment(store.register_plan(plan).id)
    cfg = store.deployment_config(plan, "A")
    run = store.start_run(exp, "A", 0, 0, 0, cfg)
    store.record_capacity(run, "interactive", 123.0, 2.0, 0.92, 5)
    store.finish_run(run, "done", valid=True)
    got = store.capacity_by_config(config_id=cfg, since_days=1)
    assert got[["runs", "median"]].values.tolist() == [[1, 123.0]]
    engine.dispose()
