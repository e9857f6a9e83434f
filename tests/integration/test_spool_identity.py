"""Issue 30 (items 3 and 4): a spool file is keyed by the database it belongs to (its store
identity, migration 0011) and names its experiment, run and point in its first line, so records
spooled against one database are never replayed into another's point of the same id; and a
full disk while spooling keeps the records in memory, written first once the database or the
disk takes them, and fails loudly with the count it holds past a bound or at the point's end,
never silently dropping one. Real SQLite stores; the outage and the full disk are injected at
the store's and the file's boundary."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from orchestrator.control import spool as spool_mod
from orchestrator.control.spool import ForeignSpool, SpoolFull, SpoolingSink, replay, spooled_points
from orchestrator.records import RequestRecord
from orchestrator.store import Store
from tests.e2e.helpers import small_plan

pytestmark = pytest.mark.integration


def _point(store: Store, name: str) -> int:
    plan = small_plan(name=name)
    reg = store.register_plan(plan)
    exp = store.create_experiment(reg.id)
    run = store.start_run(exp, "A", 0, 0, 0, store.deployment_config(plan, "A"))
    return store.record_point(run, seq=0, window_start_s=0, window_end_s=1, n_scheduled=10)


def _records(lo: int, hi: int) -> list[RequestRecord]:
    return [RequestRecord(request_id=i, conversation_id=i, turn=0, phase="measure", scheduled_s=float(i))
            for i in range(lo, hi)]


class Flaky:
    """``store`` while its database is down (``up`` False): ingest fails as an unreachable one does."""

    def __init__(self, store: Store) -> None:
        self.store, self.up = store, False

    def point_owner(self, point_id: int) -> Any:
        return self.store.point_owner(point_id)

    def ingest_requests(self, point_id: int, batch: Any) -> int:
        if not self.up:
            raise sa.exc.OperationalError("INSERT", {}, Exception("connection refused"))
        return self.store.ingest_requests(point_id, batch)


def test_a_spool_of_one_database_is_never_replayed_into_another(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    with Store.open(f"sqlite:///{tmp_path / 'a.sqlite'}") as a, Store.open(f"sqlite:///{tmp_path / 'b.sqlite'}") as b:
        pa, pb = _point(a, "spool-a"), _point(b, "spool-b")
        assert pa == pb == 1 and a.identity() != b.identity()  # the same point id, two databases
        sink = SpoolingSink(Flaky(a), pa, spool)
        sink(_records(0, 5))
        header = json.loads(sink.path.read_text().splitlines()[0])
        assert header == {"spool": 1, "store": a.identity(), "experiment": 1, "run": 1, "point": 1}

        # B sees no spool of its own, replays nothing, and its point 1 stays empty.
        assert spooled_points(spool, b.identity()) == []
        assert replay(b, spool, {pb}) == 0 and b.requests(pb) == []
        # A file renamed to look like B's is refused by its first line, and kept.
        forged = spool_mod.spool_path(spool, b.identity(), pb)
        forged.write_bytes(sink.path.read_bytes())
        with pytest.raises(ForeignSpool, match="not replayed here"):
            replay(b, spool, {pb})
        assert b.requests(pb) == [] and forged.exists()
        forged.unlink()
        # A file of an older orchestrator (no database in its name) is left alone.
        (spool / "point-1.jsonl").write_text(json.dumps([[0] * 5]) + "\n")
        assert spooled_points(spool, a.identity()) == [pa]
        # A replays its own.
        assert replay(a, spool, {pa}) == 5 and len(a.requests(pa)) == 5
        assert not sink.path.exists() and (spool / "point-1.jsonl").exists()


def test_a_full_disk_holds_records_in_memory_and_never_drops_one(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}") as store:
        pid = _point(store, "spool-full")
        flaky = Flaky(store)
        sink = SpoolingSink(flaky, pid, tmp_path / "spool")
        sink(_records(0, 3))  # spooled: the disk still takes it
        assert sink.path.exists() and not sink.held

        # The disk fills up while the last line is written: the fsync fails, the half-written
        # line is cut off again, and the batch is held in memory.
        real_fsync = os.fsync

        def no_space(fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(spool_mod.os, "fsync", no_space)
        sink(_records(3, 7))
        monkeypatch.setattr(spool_mod.os, "fsync", real_fsync)
        lines = sink.path.read_text().splitlines()
        assert len(lines) == 2 and len(json.loads(lines[1])) == 3  # header and the first batch, whole
        assert [r.request_id for r in sink.held] == [3, 4, 5, 6] and sink.pending
        with pytest.raises(SpoolFull, match="4 records") as err:
            sink.raise_if_held()  # at the point's end with the database still down: said, with the count
        assert err.value.held == 4

        # The database answers: the spool first, then what was held, then the new batch.
        flaky.up = True
        sink(_records(7, 10))
        assert sorted(r.request_id for r in store.requests(pid)) == list(range(10))
        assert not sink.pending and not sink.held
        sink.raise_if_held()


def test_past_the_bound_a_full_disk_fails_loudly_with_the_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}") as store:
        pid = _point(store, "spool-bound")
        sink = SpoolingSink(Flaky(store), pid, tmp_path / "spool")

        def no_space(batch: Any) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(sink, "_append", no_space)
        monkeypatch.setattr(spool_mod, "HOLD_LIMIT", 5)
        sink(_records(0, 4))
        assert len(sink.held) == 4 and not sink.path.exists()  # no empty spool file left behind
        with pytest.raises(SpoolFull, match="6 records are held in memory only") as err:
            sink(_records(4, 6))
        assert err.value.held == 6 and len(sink.held) == 6  # nothing dropped, even then
