"""A record sink that survives a database outage: batches that cannot be written go to a local
spool file and are flushed, in order, once the database answers again. Nothing is dropped."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import sqlalchemy.exc

from orchestrator import logs
from orchestrator.errors import EnvironmentProblem, TransientError
from orchestrator.records import RequestRecord
from orchestrator.store.ingest import DuplicateRequestRecords

log = logs.get_logger(__name__)
_FIELDS = tuple(f.name for f in fields(RequestRecord))
# What an unreachable or restarting database looks like from here.
OUTAGE_ERRORS = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError,
                 EnvironmentProblem, TransientError)


class SpoolingSink:
    """Ingests batches of a point's records; spools to ``spool_dir`` while the store is down.

    A plain (sync) callable: the load generator runs sync sinks in a worker thread, so a slow
    database never delays a scheduled send.
    """

    def __init__(self, store, point_id: int, spool_dir: Path):
        self.store = store
        self.point_id = point_id
        self.path = Path(spool_dir) / f"point-{point_id}.jsonl"
        self.stored = 0
        self.spooled_batches = 0
        self._lock = threading.Lock()

    def __call__(self, batch: list[RequestRecord]) -> None:
        self.write(list(batch))

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
        with open(self.path, "a") as f:
            f.write(json.dumps([[getattr(r, k) for k in _FIELDS] for r in batch]) + "\n")
        self.spooled_batches += 1

    def _flush_locked(self) -> bool:
        """Write every spooled batch; True when the spool is empty afterwards."""
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return True
        for i, line in enumerate(lines):
            batch = [RequestRecord(**dict(zip(_FIELDS, row, strict=True))) for row in json.loads(line)]
            try:
                self.stored += self._ingest(batch)
            except OUTAGE_ERRORS:
                rest = lines[i:]
                self.path.write_text("\n".join(rest) + "\n")
                return False
        self.path.unlink()
        return True

    def flush(self) -> bool:
        """Try to write what is spooled; True when nothing is left locally."""
        with self._lock:
            return self._flush_locked()

    @property
    def pending(self) -> bool:
        return self.path.exists()
