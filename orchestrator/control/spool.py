"""A record sink that survives a database outage: batches that cannot be written go to a local
spool file and are flushed, in order, once the database answers again. Nothing is dropped."""

from __future__ import annotations

import contextlib
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


# Records held in memory when the spool's disk is full (the database down too): past this the
# sink fails loudly with the count it holds rather than grow without bound.
HOLD_LIMIT = 500_000
SPOOL_VERSION = 1


class SpoolFull(EnvironmentProblem):
    """Neither the database nor the spool's disk takes a point's records: ``held`` of them are
    in this process's memory only (lost if it ends before either comes back)."""

    def __init__(self, message: str, held: int):
        super().__init__(message)
        self.held = held


class ForeignSpool(EnvironmentProblem):
    """A spool file that belongs to another database or experiment than the point it names."""


def spool_path(spool_dir: Path, store: str, point_id: int) -> Path:
    """A point's spool file, named by the database it belongs to (its store identity) too, so
    the same point id of another database never shares it."""
    return Path(spool_dir) / f"point-{store[:16]}-{point_id}.jsonl"


class SpoolingSink:
    """Ingests batches of a point's records; spools to ``spool_dir`` while the store is down.

    A plain (sync) callable: the load generator runs sync sinks in a worker thread, so a slow
    database never delays a scheduled send.

    The spool file's first line says whose records it holds (the database's store identity,
    migration 0011, and the experiment, run and point): a replay into another database or
    experiment is refused. If the spool's disk is full too, batches are held in memory (up to
    ``HOLD_LIMIT`` records, each time said loudly) and written first once either answers;
    past the bound, or at the point's end with records still held, SpoolFull says how many.
    """

    def __init__(self, store: StoreLike, point_id: int, spool_dir: Path) -> None:
        self.store = store
        self.point_id = point_id
        self.owner = store.point_owner(point_id)  # the database answers here: the point was just read or made
        self.path = spool_path(spool_dir, self.owner.store, point_id)
        self.stored = 0
        self.spooled_batches = 0
        self.held: list[RequestRecord] = []
        self._lock = threading.Lock()

    def __call__(self, batch: list[RequestRecord]) -> None:
        # A server's error text may echo a request's key: scrubbed before it is spooled or stored.
        self.write([replace(r, error=scrub(r.error)) if r.error else r for r in batch])

    def write(self, batch: Sequence[RequestRecord]) -> None:
        with self._lock:
            if not self._drain_locked():
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

    def _header(self) -> str:
        o = self.owner
        return json.dumps({"spool": SPOOL_VERSION, "store": o.store, "experiment": o.experiment_id,
                           "run": o.run_id, "point": self.point_id})

    def _spool(self, batch: Sequence[RequestRecord]) -> None:
        """Append ``batch`` to the spool file (fsynced); if the disk refuses, hold it in memory."""
        batch = [*self.held, *batch]  # what is held goes first, in order
        try:
            self._append(batch)
        except OSError as e:
            self.held = list(batch)
            if len(self.held) > HOLD_LIMIT:
                raise SpoolFull(f"cannot spool the records of point {self.point_id} ({self.path}: "
                                f"{e.strerror or e}) and the database is unreachable: {len(self.held)} records "
                                "are held in memory only, past the bound; free the disk or bring the database "
                                "back", len(self.held)) from e
            log.error("cannot spool point %d's records (%s: %s): %d records held in memory until the database or "
                      "the disk takes them", self.point_id, self.path, e.strerror or e, len(self.held))
            return
        self.held = []
        self.spooled_batches += 1

    def _append(self, batch: Sequence[RequestRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        with open(self.path, "a") as f:
            size = f.tell()
            try:
                f.write((self._header() + "\n" if new else "")
                        + json.dumps([[getattr(r, k) for k in _FIELDS] for r in batch]) + "\n")
                f.flush()
                os.fsync(f.fileno())  # taken is kept: on disk before the call returns
            except OSError:
                # No half line may stay behind (a replay reads whole lines): back to what it was.
                with contextlib.suppress(OSError):
                    f.truncate(size)
                if new:
                    with contextlib.suppress(OSError):
                        self.path.unlink()
                raise
        if new:
            _fsync_dir(self.path.parent)

    def _drain_locked(self) -> bool:
        """Write every spooled and held batch; True when nothing is left pending."""
        if not self._flush_locked():
            return False
        if self.held:
            try:
                self.stored += self._ingest(self.held)
            except OUTAGE_ERRORS:
                return False
            log.warning("point %d: %d records held in memory are stored", self.point_id, len(self.held))
            self.held = []
        return True

    def _flush_locked(self) -> bool:
        """Write every spooled batch; True when the spool file is gone afterwards."""
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return True
        header, body = check_header(self.path, lines, self.owner.store, self.owner.experiment_id, self.point_id)
        for i, line in enumerate(body):
            batch = [_record(row) for row in json.loads(line)]
            try:
                self.stored += self._ingest(batch)
            except OUTAGE_ERRORS:
                if i:  # some batches went in: the file keeps the rest only
                    self._rewrite([header, *body[i:]])
                return False
        self.path.unlink()
        _fsync_dir(self.path.parent)
        return True

    def _rewrite(self, lines: list[str]) -> None:
        """The spool file as ``lines`` (atomically). If the disk refuses, the file stays as it
        was: its batches already written are refused as duplicates on the next flush."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with open(tmp, "w") as f:
                f.write("\n".join(lines) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            _fsync_dir(self.path.parent)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            log.warning("could not shorten the spool %s (%s): its written batches are skipped next time",
                        self.path, e.strerror or e)

    def flush(self) -> bool:
        """Try to write what is spooled or held; True when nothing is left pending. Records
        still held in memory are tried on the disk again (the spool outlives this process)."""
        with self._lock:
            if self._drain_locked():
                return True
            if self.held:
                self._spool([])
            return False

    def raise_if_held(self) -> None:
        """At a point's end: records only in memory would be lost with this process; say so."""
        if self.held:
            raise SpoolFull(f"point {self.point_id}: {len(self.held)} records could be neither stored (database "
                            f"unreachable) nor spooled ({self.path}: disk full); they are lost when this process "
                            "ends", len(self.held))

    @property
    def pending(self) -> bool:
        return self.path.exists() or bool(self.held)


def check_header(path: Path, lines: list[str], store: str, experiment_id: int, point_id: int) -> tuple[str, list[str]]:
    """The spool file's header line and its batch lines, once the header says the file holds
    records of ``point_id`` of ``experiment_id`` in the database ``store``; ForeignSpool else."""
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("spool") != SPOOL_VERSION:
        raise ForeignSpool(f"{path}: no spool header (written by an older orchestrator, or not a spool file): its "
                           "records are not replayed; they stay in it")
    want = {"store": store, "experiment": experiment_id, "point": point_id}
    differs = {k: header.get(k) for k, v in want.items() if header.get(k) != v}
    if differs:
        raise ForeignSpool(f"{path}: its records belong to {differs}, not to point {point_id} of experiment "
                           f"{experiment_id} in this database ({store[:16]}): not replayed here; they stay in it")
    return lines[0], lines[1:]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def spooled_points(spool_dir: Path, store: str) -> list[int]:
    """Point ids with records left in ``spool_dir`` for the database ``store`` (by this or an
    earlier process). Another database's spool files, and files of an older orchestrator (no
    database in their name), are left alone, said once each."""
    out = []
    for p in Path(spool_dir).glob("point-*.jsonl"):
        parts = p.name[len("point-"):-len(".jsonl")].split("-")
        if len(parts) == 2 and parts[0] == store[:16] and parts[1].isdigit():
            out.append(int(parts[1]))
        elif len(parts) != 2 or not parts[1].isdigit():
            log.warning("spool file %s names no database (an older orchestrator's): not replayed", p)
    return sorted(out)


def replay(store: StoreLike, spool_dir: Path, point_ids: set[int]) -> int:
    """Write what a dead process spooled for these points of this database; the count of
    records written. Raises the database's error when it is still down (nothing is removed
    then), ForeignSpool for a file whose header names another experiment or database."""
    written = 0
    for pid in spooled_points(spool_dir, store.identity()):
        if pid not in point_ids:
            continue
        sink = SpoolingSink(store, pid, spool_dir)
        if not sink.flush():
            raise EnvironmentProblem(f"the database refused the spooled records of point {pid} "
                                     f"({sink.path}); they stay there for the next resume")
        written += sink.stored
    return written
