"""A record sink that survives a database outage: batches that cannot be written go to a local
spool file and are flushed, in order, once the database answers again. Nothing is dropped."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import sqlalchemy.exc

from orchestrator import logs
from orchestrator.errors import EnvironmentProblem, TransientError
from orchestrator.records import RequestRecord
from orchestrator.secrets import scrub
from orchestrator.store.ingest import DuplicateRequestRecords
from orchestrator.store.protocol import StoreLike

log = logs.get_logger(__name__)
_FIELDS = tuple(f.name for f in fields(RequestRecord))
_MIN_FIELDS = _FIELDS.index("output_hash") + 1  # a spool line written before server_prompt_tokens
# What an unreachable or restarting database looks like from here.
OUTAGE_ERRORS = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError,
                 EnvironmentProblem, TransientError)


def _record(row: list[Any]) -> RequestRecord:
    """A spooled row back to its record. A row spooled by an older orchestrator lacks the fields
    added since (appended last, e.g. server_prompt_tokens): they keep their defaults."""
    if not _MIN_FIELDS <= len(row) <= len(_FIELDS):
        raise ValueError(f"spooled record has {len(row)} fields, expected {_MIN_FIELDS} to {len(_FIELDS)}")
    return RequestRecord(**dict(zip(_FIELDS[:len(row)], row, strict=True)))


class SpoolingSink:
    """Ingests batches of a point's records; spools to ``spool_dir`` while the store is down.

    A plain (sync) callable: the load generator runs sync sinks in a worker thread, so a slow
    database never delays a scheduled send.
    """

    def __init__(self, store: StoreLike, point_id: int, spool_dir: Path) -> None:
        self.store = store
        self.point_id = point_id
        self.path = Path(spool_dir) / f"point-{point_id}.jsonl"
        self.stored = 0
        self.spooled_batches = 0
        self._lock = threading.Lock()

    def __call__(self, batch: list[RequestRecord]) -> None:
        # A server's error text may echo a request's key: scrubbed before it is spooled or stored.
        self.write([replace(r, error=scrub(r.error)) if r.error else r for r in batch])

    def write(self, batch: Sequence[RequestRecord]) -> None:
        with self._lock:
            if self.path.exists() and not self._flush_locked():
                self._spool(batch)
                return
            try:
                self.stored += self._ingest(batch)
            except OUTAGE_ERRORS as e:
                log.warning("database unreachable (%s); spooling %d records", type(e).__name__, len(batch))
                self._spool(batch)

    def _ingest(self, batch: Sequence[RequestRecord]) -> int:
        try:
            return self.store.ingest_requests(self.point_id, batch)
        except DuplicateRequestRecords:
            # The write committed before the connection dropped: the rows are already there.
            return 0

    def _spool(self, batch: Sequence[RequestRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        with open(self.path, "a") as f:
            f.write(json.dumps([[getattr(r, k) for k in _FIELDS] for r in batch]) + "\n")
            f.flush()
            os.fsync(f.fileno())  # taken is kept: on disk before the call returns
        if new:
            _fsync_dir(self.path.parent)
        self.spooled_batches += 1

    def _flush_locked(self) -> bool:
        """Write every spooled batch; True when the spool is empty afterwards."""
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return True
        for i, line in enumerate(lines):
            batch = [_record(row) for row in json.loads(line)]
            try:
                self.stored += self._ingest(batch)
            except OUTAGE_ERRORS:
                rest = lines[i:]
                tmp = self.path.with_name(self.path.name + ".tmp")
                with open(tmp, "w") as f:
                    f.write("\n".join(rest) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
                _fsync_dir(self.path.parent)
                return False
        self.path.unlink()
        _fsync_dir(self.path.parent)
        return True

    def flush(self) -> bool:
        """Try to write what is spooled; True when nothing is left locally."""
        with self._lock:
            return self._flush_locked()

    @property
    def pending(self) -> bool:
        return self.path.exists()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def spooled_points(spool_dir: Path) -> list[int]:
    """Point ids with records left in ``spool_dir`` (by this or an earlier process)."""
    out = []
    for p in Path(spool_dir).glob("point-*.jsonl"):
        stem = p.name[len("point-"):-len(".jsonl")]
        if stem.isdigit():
            out.append(int(stem))
    return sorted(out)


def replay(store: StoreLike, spool_dir: Path, point_ids: set[int]) -> int:
    """Write what a dead process spooled for these points; the count of records written.
    Raises the database's error when it is still down (nothing is removed then)."""
    written = 0
    for pid in spooled_points(spool_dir):
        if pid not in point_ids:
            continue
        sink = SpoolingSink(store, pid, spool_dir)
        if not sink.flush():
            raise EnvironmentProblem(f"the database refused the spooled records of point {pid} "
                                     f"({sink.path}); they stay there for the next resume")
        written += sink.stored
    return written
