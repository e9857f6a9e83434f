"""Bulk ingest of request records: 100,000 round-trip exactly, in batches, on both databases."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import sqlalchemy as sa

from orchestrator.plan import load_plan_file
from orchestrator.records import RECORD_FIELDS, STATUSES, RequestRecord
from orchestrator.store import DuplicateRequestRecords, Store, UnknownPoint
from orchestrator.store.appendonly import maintenance
from orchestrator.store.models import REQUEST_COLUMNS

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


def _records(n: int, seed: int) -> list[RequestRecord]:
    """Records with every kind of value a real point holds: full-precision times, gaps (None),
    failures with messages (non-ASCII too), hashes."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        status = rng.choice(STATUSES)
        sched = 1.7e9 + rng.random() * 1000
        sent = None if status == "unsent" else sched + rng.random() * 1e-3
        first = sent + rng.random() if sent is not None and status == "ok" else None
        last = first + rng.random() * 5 if first is not None else None
        out.append(RequestRecord(
            request_id=i, conversation_id=rng.randrange(2000), turn=rng.randrange(4),
            phase=rng.choice(("warmup", "measure", "cooldown")), scheduled_s=sched, sent_s=sent,
            first_token_s=first, last_token_s=last, prompt_tokens=rng.randrange(1, 8000),
            output_tokens_asked=256, output_tokens=rng.choice((None, 256, 255)),
            cached_tokens=rng.choice((None, 0, rng.randrange(4000))), chunks=rng.randrange(300),
            max_gap_s=None if first is None else rng.random() / 7, status=status,
            http_status=rng.choice((None, 200, 503)),
            error=None if status == "ok" else rng.choice(("timeout after 30 s", "connexion réinitialisée", "")),
            prompt_hash=f"{rng.getrandbits(128):032x}", output_hash=f"{rng.getrandbits(64):016x}",
        ))
    return out


def _point(store: Store) -> int:
    plan = load_plan_file(QUICKSTART)
    reg = store.register_plan(plan)
    exp = store.create_experiment(reg.id)
    run = store.start_run(exp, "A", 0, 0, 0, store.deployment_config(plan, "A"))
    return store.record_point(run, seq=0, window_start_s=0.0, window_end_s=120.0, valid=True)


def test_requests_table_columns_follow_request_record() -> None:
    assert ("point_id", *RECORD_FIELDS) == REQUEST_COLUMNS


def test_100k_requests_round_trip_exactly_in_successive_batches(db_url: str) -> None:
    records = _records(100_000, seed=3)
    with Store.open(db_url) as store:
        point = _point(store)
        other = _point(store)
        stored = 0
        for start in range(0, len(records), 30_000):  # batches as the generator hands them over
            stored += store.ingest_requests(point, iter(records[start : start + 30_000]))
        assert stored == len(records)
        assert store.ingest_requests(other, records[:10]) == 10  # same request ids, another point
        back = store.requests(point)
    assert len(back) == len(records)
    for got, want in zip(back, records, strict=True):
        assert got == want, (got, want)


def test_a_repeated_batch_is_refused_and_stores_nothing(db_url: str) -> None:
    records = _records(500, seed=4)
    with Store.open(db_url) as store:
        point = _point(store)
        store.ingest_requests(point, records[:300])
        with pytest.raises(DuplicateRequestRecords):
            store.ingest_requests(point, records[200:])  # overlaps 200..299
        assert len(store.requests(point)) == 300  # the failed batch left nothing behind
        with pytest.raises(UnknownPoint, match="no such load point"):
            store.ingest_requests(point + 1000, records[:1])
        assert store.ingest_requests(point, records[300:]) == 200
        assert store.requests(point) == records


def test_deleting_a_point_deletes_its_requests(db_url: str) -> None:
    """requests has no foreign key (migration 0004): a trigger removes a point's requests."""
    with Store.open(db_url) as store:
        point, other = _point(store), _point(store)
        store.ingest_requests(point, _records(50, seed=5))
        store.ingest_requests(other, _records(20, seed=6))
        with store.engine.begin() as conn, maintenance(conn):  # an operator's delete (0006)
            conn.execute(sa.text("delete from load_points where id = :p"), {"p": point})
            left = conn.execute(sa.text("select point_id, count(*) from requests group by point_id")).all()
        assert [tuple(r) for r in left] == [(other, 20)]
