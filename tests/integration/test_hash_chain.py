"""Issue 30: a hash chain over every finished run and every verdict (migration 0012,
store/chain.py). The runtime role can neither edit nor delete a link (PostgreSQL, as that role;
SQLite's one writer alike); an edit by the tables' owner through the escape is detected by the
walk; and an owner who rewrites the chain to match cannot hide it from a head kept outside the
database: `orch verify --head` exits 6."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from orchestrator.cli.main import main
from orchestrator.store import Store
from orchestrator.store.appendonly import maintenance, run_digest
from orchestrator.store.chain import GENESIS, link_sha256
from tests.integration.test_append_only import _experiment
from tests.support.runtime_role import runtime_url

REFUSED = (sa.exc.IntegrityError, sa.exc.DatabaseError)


@pytest.fixture
def rt(db_url: str) -> Iterator[Store]:
    with runtime_url(db_url) as url, Store.open(url) as store:
        yield store


def test_every_finished_run_and_verdict_is_sealed_and_the_chain_verifies(rt: Store) -> None:
    exp, run, _ = _experiment(rt)
    report = rt.verify_chain()
    assert report.links == 2 and not report.problems, report  # the verdict, then the run
    assert report.head == rt.chain_head() and len(report.head or "") == 64
    assert report.unsealed_runs == 0 and report.unsealed_verdicts == 0
    kinds = rt.engine.connect().execute(sa.text("select kind, ref_id from chain_entries order by seq")).all()
    assert [k for k, _ in kinds] == ["verdict", "run"] and kinds[1][1] == run
    assert rt.verify_chain(report.head[:12] if report.head else None).head_found


def test_the_runtime_role_cannot_edit_or_delete_a_link(rt: Store) -> None:
    _experiment(rt)
    for sql in ("update chain_entries set payload_sha256 = prev_sha256 where seq = 2",
                "delete from chain_entries where seq = 2"):
        with pytest.raises(REFUSED) as e, rt.engine.begin() as conn:
            conn.execute(sa.text(sql))
        # the runtime role holds no UPDATE or DELETE grant (PostgreSQL); the trigger refuses all
        assert "append-only" in str(e.value) or "permission denied" in str(e.value), e.value
    assert not rt.verify_chain().problems


def _relink(conn: sa.Connection, run: int) -> None:
    """What an owner hiding an edit does: the run's link gets its new digest and every link is
    hashed again (all under the escape)."""
    rows = conn.execute(sa.text("select seq, kind, ref_id, experiment_id, payload_sha256 from chain_entries "
                                "order by seq")).all()
    conn.execute(sa.text("delete from chain_entries"))
    prev = GENESIS
    for seq, kind, ref, exp, payload in rows:
        if kind == "run" and ref == run:
            payload = run_digest(conn, run)
        sha = link_sha256(prev, seq, kind, ref, exp, payload)
        conn.execute(sa.text("insert into chain_entries (seq, kind, ref_id, experiment_id, payload_sha256, "
                             "prev_sha256, sha256, created_at) values (:s, :k, :r, :e, :p, :v, :h, "
                             "current_timestamp)"), {"s": seq, "k": kind, "r": ref, "e": exp, "p": payload,
                                                     "v": prev, "h": sha})
        prev = sha


def test_an_owners_edit_is_detected_and_a_rewritten_chain_misses_the_kept_head(
        db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ORCH_DATABASE_URL", db_url)
    monkeypatch.delenv("ORCH_DEBUG", raising=False)
    with Store.open(db_url) as store:
        exp, run, _ = _experiment(store)
        kept = store.chain_head()
        assert kept is not None
        with store.engine.begin() as conn, maintenance(conn):
            conn.execute(sa.text("update runs set valid = false, invalid_reason = 'second thoughts' where id = :r"),
                         {"r": run})
        problems = store.verify_chain().problems
        assert any(f"run {run} (experiment {exp}) changed since it was sealed" in p for p in problems), problems
    capsys.readouterr()
    assert main(["verify"]) == 6
    assert f"run {run} (experiment {exp}) changed" in capsys.readouterr().err

    with Store.open(db_url) as store:
        with store.engine.begin() as conn, maintenance(conn):
            _relink(conn, run)
        assert not store.verify_chain().problems  # consistent again, inside the database
        assert store.chain_head() != kept
    assert main(["verify"]) == 0
    capsys.readouterr()
    assert main(["verify", "--head", kept[:16]]) == 6
    assert f"the kept head {kept[:16]} is not a link of this chain" in capsys.readouterr().err
    assert main(["verify", "--head", "xyz"]) == 1  # not a head: the input is wrong


def test_a_runtime_role_granted_before_0012_appends_to_the_chain(pg_url: str) -> None:
    """0012 grants INSERT on the chain to every role that may insert records, so a controller
    granted before it still finishes runs (each sealed) after the upgrade."""
    import uuid

    from orchestrator.store.database import create_engine, upgrade
    from tests.support.runtime_role import grants_at

    engine = create_engine(pg_url)
    upgrade(engine, "0011")
    role = f"orch_rt_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.execute(sa.text(f"create role {role} login"))
        for grant in grants_at(role, "0011"):
            conn.execute(sa.text(grant))
    try:
        upgrade(engine)
        url = sa.make_url(pg_url).set(username=role, password=None).render_as_string(hide_password=False)
        with Store.open(url) as rt:
            _experiment(rt)
            report = rt.verify_chain()
            assert report.links == 2 and not report.problems, report
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"drop owned by {role}"))
            conn.execute(sa.text(f"drop role {role}"))
        engine.dispose()
