"""Triggers no one can shadow, and no record added to a finished run (migration 0011; issue 30
part B), as the runtime role on PostgreSQL and on SQLite; a run's digest covers its outcome.

The attack the migration closes: the runtime role may create temporary tables, and PostgreSQL
searches the session's temporary schema first for an unqualified table name. With the trigger
functions of 0006 (unqualified names, no pinned search_path) a ``CREATE TEMP TABLE runs`` with
a 'running' row let the role change a finished run's points and capacities, and a
``CREATE TEMP TABLE pg_class`` naming it the owner of ``runs`` opened the maintenance escape to
it (a finished run's status, validity and reason)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from orchestrator.cli.main import main
from orchestrator.store import Store
from orchestrator.store.appendonly import maintenance
from orchestrator.store.database import (
    create_engine,
    current_revision,
    downgrade,
    head_revision,
    upgrade,
)
from orchestrator.store.ingest import RecordsRefused
from tests.integration.test_append_only import _experiment, _records
from tests.support.runtime_role import runtime_url

REFUSED = (sa.exc.IntegrityError, sa.exc.DatabaseError)
FUNCTIONS = ("orch_maintenance", "orch_refuse_measurement_change", "orch_run_forward_only",
             "orch_point_while_running", "orch_capacity_while_running", "orch_delete_point_requests",
             "orch_refuse_registration_change", "orch_requests_of_running_runs", "orch_point_of_running_run")


@pytest.fixture
def rt(db_url: str) -> Iterator[Store]:
    """A store as the runtime role (PostgreSQL; SQLite has no roles: the one writer)."""
    with runtime_url(db_url) as url, Store.open(url) as store:
        yield store


def _shadowed(store: Store, setup: list[str], attack: str, **params: object) -> None:
    """``setup`` then ``attack`` in one transaction of one connection: the attack must be refused."""
    with pytest.raises(REFUSED) as e, store.engine.begin() as conn:
        for sql in setup:
            conn.execute(sa.text(sql), params)
        conn.execute(sa.text(attack), params)
    if store.engine.dialect.name == "sqlite":
        store.engine.dispose()  # pysqlite runs DDL outside the transaction: the TEMP table outlives it
    assert "append-only" in str(e.value), e.value


def test_temporary_tables_named_runs_do_not_unfreeze_a_finished_run(rt: Store) -> None:
    exp, run, point = _experiment(rt)
    temp_runs = ["create temp table runs (id bigint, status varchar(20))",
                 "insert into runs (id, status) values (:r, 'running')"]
    _shadowed(rt, temp_runs, "update load_points set valid = false where id = :p", r=run, p=point)
    _shadowed(rt, temp_runs, "update capacities set capacity = 1e6 where run_id = :r", r=run)
    # the escape's own flag table, shadowed (SQLite's escape; PostgreSQL ignores the table)
    _shadowed(rt, ["create temp table orch_maintenance (id integer)", "insert into orch_maintenance values (1)"],
              "update runs set valid = false, invalid_reason = 'edited' where id = :r", r=run)
    info = rt.runs(exp)[0]
    assert (info.status, info.valid, info.invalid_reason) == ("done", True, None)
    assert bool(rt.points(run)["valid"].iloc[0]) and rt.capacities(exp)["capacity"].tolist() == [240.0]


def test_a_temporary_pg_class_does_not_open_the_escape_to_the_runtime_role(pg_url: str) -> None:
    with runtime_url(pg_url) as url, Store.open(url) as rt:
        exp, run, point = _experiment(rt)
        fake_owner = ["create temp table pg_class (oid oid, relowner oid)",
                      "insert into pg_class select c.oid, r.oid from pg_catalog.pg_class c, pg_catalog.pg_roles r "
                      "where c.relnamespace = 'public'::regnamespace and r.rolname = current_user",
                      "set local orchestrator.maintenance = 'on'"]
        _shadowed(rt, fake_owner, "update runs set status = 'failed', valid = false, invalid_reason = 'edited' "
                  "where id = :r", r=run)
        with Store.open(pg_url) as owner, owner.engine.begin() as conn:  # the escape is what stops it then
            conn.execute(sa.text(f"grant update (verdict) on bar_verdicts to {rt.engine.url.username}"))
        _shadowed(rt, fake_owner, "update bar_verdicts set verdict = 'ACCEPT' where experiment_id = :e", e=exp)
        _shadowed(rt, [*fake_owner, "create temp table runs (id bigint, status varchar(20))",
                       "insert into runs (id, status) values (:r, 'running')"],
                  "update load_points set valid = false where id = :p", r=run, p=point)
        # a function of the same name in the temporary schema is never the one called
        _shadowed(rt, ["create function pg_temp.orch_maintenance(rel oid) returns boolean language sql "
                       "as 'select true'", "set local search_path = pg_temp, public"],
                  "update runs set valid = false where id = :r", r=run)
        info = rt.runs(exp)[0]
        assert (info.status, info.valid, info.invalid_reason) == ("done", True, None)
        with rt.engine.connect() as conn:
            pinned = dict(conn.execute(sa.text(
                "select proname, array_to_string(proconfig, ',') from pg_proc where proname like 'orch\\_%'")).all())
        assert pinned == dict.fromkeys(FUNCTIONS, "search_path=pg_catalog, pg_temp"), pinned


def test_no_record_or_point_is_added_to_a_finished_run(rt: Store) -> None:
    exp, run, point = _experiment(rt)
    with pytest.raises(RecordsRefused, match="append-only"):
        rt.ingest_requests(point, [r for r in _records(25)][20:])
    with pytest.raises(REFUSED, match="append-only"), rt.engine.begin() as conn:
        conn.execute(sa.text(
            "insert into requests (point_id, request_id, conversation_id, turn, phase, scheduled_s, prompt_tokens, "
            "output_tokens_asked, chunks, status, prompt_hash, output_hash) "
            "values (:p, 99, 0, 0, 'measure', 1.0, 10, 10, 1, 'ok', 'x', 'y')"), {"p": point})
    with pytest.raises(REFUSED, match="append-only"):
        rt.record_point(run, seq=1, window_start_s=0.0, window_end_s=60.0, offered_rate=4.0)
    with pytest.raises(REFUSED, match="append-only"), rt.engine.begin() as conn:  # and not to no point at all
        conn.execute(sa.text(
            "insert into requests (point_id, request_id, conversation_id, turn, phase, scheduled_s, prompt_tokens, "
            "output_tokens_asked, chunks, status, prompt_hash, output_hash) "
            "values (987654, 0, 0, 0, 'measure', 1.0, 10, 10, 1, 'ok', 'x', 'y')"))
    assert len(rt.requests(point)) == 20 and len(rt.points(run)) == 1
    # a running run still takes points and records
    running = rt.start_run(exp, "B", 0, 1, 0, rt.runs(exp)[0].config_id)
    p2 = rt.record_point(running, seq=0, window_start_s=0.0, window_end_s=60.0, offered_rate=2.0)
    assert rt.ingest_requests(p2, _records(5)) == 5


def test_the_digest_covers_a_runs_outcome_and_its_points_validity(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An edit by the tables' owner (through the escape) of a finished run's status, validity,
    reason or a point's validity is caught by `orch verdict --verify` (digest version 2)."""
    monkeypatch.setenv("ORCH_DATABASE_URL", db_url)
    monkeypatch.delenv("ORCH_DEBUG", raising=False)
    with Store.open(db_url) as store:
        exp, run, point = _experiment(store)
        name = store.get_experiment(exp).name
        assert [(c.changed, c.version) for c in store.verify_digests(exp)] == [(False, 2)]
    edits = ["update runs set valid = false where id = :r",
             "update runs set invalid_reason = 'second thoughts' where id = :r",
             "update runs set status = 'failed' where id = :r",
             "update load_points set valid = false where id = :p"]
    undo = ["update runs set valid = true where id = :r", "update runs set invalid_reason = null where id = :r",
            "update runs set status = 'done' where id = :r", "update load_points set valid = true where id = :p"]
    for edit, back in zip(edits, undo, strict=True):
        with Store.open(db_url) as store:
            with store.engine.begin() as conn, maintenance(conn):
                conn.execute(sa.text(edit), {"r": run, "p": point})
            assert [c.changed for c in store.verify_digests(exp)] == [True], edit
        capsys.readouterr()
        code = main(["verdict", name, "--verify"])
        err = capsys.readouterr().err
        assert code == 6 and f"run {run} (block 0, arm A, attempt 0): records changed" in err, (edit, code, err)
        with Store.open(db_url) as store:
            with store.engine.begin() as conn, maintenance(conn):
                conn.execute(sa.text(back), {"r": run, "p": point})
            assert [c.changed for c in store.verify_digests(exp)] == [False], back
    result = subprocess.CompletedProcess([], main(["verdict", name, "--verify"]))
    assert result.returncode == 0


def test_0011_up_and_down_on_both_databases(db_url: str) -> None:
    """Up: the identity (one row, 32 hex digits, frozen), the new triggers, pinned functions;
    down to 0010: all gone and 0006's functions as they were (the shadowing works again, which
    is what 0011 is for); up again: a fresh identity. One head."""
    engine = create_engine(db_url)
    upgrade(engine)
    assert current_revision(engine) == head_revision() >= "0011"
    pg = engine.dialect.name == "postgresql"
    with engine.connect() as conn:
        (first,) = conn.execute(sa.text("select identity from store_identity")).scalars().all()
    assert len(first) == 32 and int(first, 16) >= 0
    for sql in ("update store_identity set identity = 'x'", "delete from store_identity"):
        with pytest.raises(REFUSED, match="append-only"), engine.begin() as conn:
            conn.execute(sa.text(sql))
    with pytest.raises(REFUSED), engine.begin() as conn:
        conn.execute(sa.text("insert into store_identity (id, identity, created_at) values (2, 'y', '2026-01-01')"))
    downgrade(engine, "0010")
    assert "store_identity" not in sa.inspect(engine).get_table_names()
    with engine.connect() as conn:
        if pg:
            left = conn.execute(sa.text("select proname, proconfig from pg_proc where proname like 'orch\\_%'")).all()
            assert {name for name, _ in left} == set(FUNCTIONS[:7]) and all(cfg is None for _, cfg in left), left
        else:
            triggers = conn.execute(sa.text("select name from sqlite_master where type = 'trigger'")).scalars().all()
            assert not {"requests_of_running_runs", "load_points_of_running_run"} & set(triggers)
    upgrade(engine)
    with engine.connect() as conn:
        (again,) = conn.execute(sa.text("select identity from store_identity")).scalars().all()
    assert again != first
    engine.dispose()


def test_a_runtime_role_granted_before_0011_reads_the_identity(pg_url: str) -> None:
    from tests.support.runtime_role import grants_at

    engine = create_engine(pg_url)
    upgrade(engine, "0010")
    role = f"orch_rt_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.execute(sa.text(f"create role {role} login"))
        for grant in grants_at(role, "0010"):
            conn.execute(sa.text(grant))
    try:
        upgrade(engine)
        url = sa.make_url(pg_url).set(username=role, password=None).render_as_string(hide_password=False)
        with Store.open(url) as rt, engine.connect() as conn:
            assert rt.identity() == conn.execute(sa.text("select identity from store_identity")).scalar_one()
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"drop owned by {role}"))
            conn.execute(sa.text(f"drop role {role}"))
        engine.dispose()
