"""The server's usage.prompt_tokens per request (issue 19 item 4; migration 0008) on SQLite and
PostgreSQL: stored and read back (executemany and COPY), kept through the spool, insert-only
like every record, and a run finished before 0008 keeps its digest afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from orchestrator.control.spool import SpoolingSink
from orchestrator.plan import load_plan_file
from orchestrator.records import RECORD_FIELDS, RequestRecord
from orchestrator.store import Store
from orchestrator.store.database import create_engine, downgrade, upgrade
from orchestrator.store.rows import PointOwner

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
# The record fields as of 0007 (before server_prompt_tokens), in column order.
FIELDS_0007 = ("request_id", "conversation_id", "turn", "phase", "scheduled_s", "sent_s", "first_token_s",
               "last_token_s", "prompt_tokens", "output_tokens_asked", "output_tokens", "cached_tokens",
               "chunks", "max_gap_s", "status", "http_status", "error", "prompt_hash", "output_hash")
# run_digest of the run _old_run writes, computed by the code of commit 1903d18 (before 0008),
# the same on SQLite and PostgreSQL.
DIGEST_0007 = "3b1a65e7630a9fc1290811329d5de3819129c5fe52c01daf4e90220415aedd0e"


def _rows(n: int) -> list[dict[str, object]]:
    return [
        dict(request_id=i, conversation_id=i // 2, turn=i % 2, phase="measure", scheduled_s=1.7e9 + i / 3,
             sent_s=1.7e9 + i / 3 + 1e-4, first_token_s=1.7e9 + i / 3 + 0.2, last_token_s=1.7e9 + i / 3 + 1.1,
             prompt_tokens=500 + i, output_tokens_asked=128, output_tokens=128, cached_tokens=i % 7, chunks=40,
             max_gap_s=0.05, status="ok", http_status=200, error=None, prompt_hash=f"{i:032x}",
             output_hash=f"{i:016x}")
        for i in range(n)
    ]


def _old_run(store: Store) -> tuple[int, int, int]:
    """At 0007: one run with one point of 12 records (plain SQL, as the code before 0008 wrote
    them) and a capacity; returns (experiment, run, point)."""
    plan = load_plan_file(QUICKSTART)
    reg = store.register_plan(plan)
    exp = store.create_experiment(reg.id)
    run = store.start_run(exp, "A", 0, 0, 0, store.deployment_config(plan, "A"))
    point = store.record_point(run, seq=0, window_start_s=0.0, window_end_s=60.0, offered_rate=2.0)
    cols = ", ".join(("point_id", *FIELDS_0007))
    params = ", ".join(f":{c}" for c in ("point_id", *FIELDS_0007))
    with store.engine.begin() as conn:
        conn.execute(sa.text(f"insert into requests ({cols}) values ({params})"),
                     [{"point_id": point, **r} for r in _rows(12)])
        # The capacity too in plain SQL: today's Store writes columns later revisions added.
        conn.execute(sa.text("insert into capacities (run_id, class_name, capacity, at_rate, attainment, "
                             "points_used, converged) values (:r, 'interactive', 240.0, 2.0, 0.95, 5, :t)"),
                     {"r": run, "t": True})
    return exp, run, point


def _records(n: int, server: bool = True) -> list[RequestRecord]:
    return [RequestRecord(**r, server_prompt_tokens=(int(str(r["prompt_tokens"])) + 3 if server else None))
            for r in _rows(n)]


def test_a_run_finished_before_0008_keeps_its_digest(db_url: str) -> None:
    """Records and digest written at 0007 (digest by the code before 0008); after the upgrade the
    recomputed digest still matches, and a server_prompt_tokens set afterwards (through the
    escape) is caught."""
    engine = create_engine(db_url)
    upgrade(engine, "0007")
    store = Store(engine)
    exp, run, point = _old_run(store)
    with engine.begin() as conn:
        conn.execute(sa.text("update runs set status = 'done', valid = :t, finished_at = started_at, "
                             "digest = :d where id = :r"), {"t": True, "d": DIGEST_0007, "r": run})
    upgrade(engine)
    assert [(c.run_id, c.stored, c.changed) for c in store.verify_digests(exp)] == [(run, DIGEST_0007, False)]
    assert [r.server_prompt_tokens for r in store.requests(point)] == [None] * 12
    from orchestrator.store.appendonly import maintenance
    with engine.begin() as conn, maintenance(conn):
        conn.execute(sa.text("update requests set server_prompt_tokens = 9 where point_id = :p and request_id = 3"),
                     {"p": point})
    assert [c.changed for c in store.verify_digests(exp)] == [True]
    engine.dispose()


def test_server_prompt_tokens_are_stored_read_back_and_hashed(db_url: str) -> None:
    """Ingest (COPY on PostgreSQL, executemany on SQLite) keeps the field; a finished run with
    values verifies; the column is insert-only like the rest of the record."""
    with Store.open(db_url) as store:
        plan = load_plan_file(QUICKSTART)
        reg = store.register_plan(plan)
        exp = store.create_experiment(reg.id)
        run = store.start_run(exp, "A", 0, 0, 0, store.deployment_config(plan, "A"))
        point = store.record_point(run, seq=0, window_start_s=0.0, window_end_s=60.0, offered_rate=2.0)
        recs = _records(6) + [RequestRecord(**_rows(7)[6])]  # the last without usage
        assert store.ingest_requests(point, recs) == 7
        back = store.requests(point)
        assert back == recs
        assert [r.server_prompt_tokens for r in back] == [503, 504, 505, 506, 507, 508, None]
        store.finish_run(run, "done", valid=True)
        assert [c.changed for c in store.verify_digests(exp)] == [False]
        with pytest.raises((sa.exc.IntegrityError, sa.exc.DatabaseError), match="append-only"), \
                store.engine.begin() as conn:
            conn.execute(sa.text("update requests set server_prompt_tokens = 1 where point_id = :p"), {"p": point})


def test_0008_down_and_up_keeps_the_append_only_triggers(db_url: str) -> None:
    engine = create_engine(db_url)
    upgrade(engine)
    downgrade(engine, "0007")
    assert "server_prompt_tokens" not in {c["name"] for c in sa.inspect(engine).get_columns("requests")}
    upgrade(engine)
    store = Store(engine)
    _, _, point = _old_run(store)
    with pytest.raises((sa.exc.IntegrityError, sa.exc.DatabaseError), match="append-only"), engine.begin() as conn:
        conn.execute(sa.text("delete from requests where point_id = :p"), {"p": point})
    engine.dispose()


class _Down:
    """A store that is unreachable until told otherwise."""

    def __init__(self) -> None:
        self.up = False
        self.got: list[RequestRecord] = []

    def point_owner(self, point_id: int) -> PointOwner:
        return PointOwner("0" * 32, 1, 1, "running")

    def ingest_requests(self, point_id: int, batch: list[RequestRecord]) -> int:
        if not self.up:
            raise sa.exc.OperationalError("x", None, Exception("down"))
        self.got += batch
        return len(batch)


def test_the_spool_keeps_server_prompt_tokens_and_reads_lines_spooled_before_it(tmp_path: Path) -> None:
    store = _Down()
    sink = SpoolingSink(store, 1, tmp_path)
    recs = _records(3)
    sink(recs)
    old_line = [[r[f] for f in FIELDS_0007] for r in _rows(2)]  # written by the code before 0008
    with open(sink.path, "a") as f:
        f.write(json.dumps(old_line) + "\n")
    store.up = True
    assert sink.flush()
    assert store.got[:3] == recs
    assert [r.server_prompt_tokens for r in store.got] == [503, 504, 505, None, None]
    assert [r.prompt_tokens for r in store.got[3:]] == [500, 501]
    assert len(RECORD_FIELDS) == len(FIELDS_0007) + 1
