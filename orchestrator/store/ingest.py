"""Bulk ingest of request records: PostgreSQL COPY (binary), executemany on SQLite.

A point's records arrive in batches as the load generator produces them; each call appends one
batch in its own transaction. The primary key (point_id, request_id) makes a repeated record an
error rather than a silent duplicate, so a retried batch can never inflate a point. The point is
checked once per batch, and locked until the batch commits (FOR KEY SHARE, what a foreign key's
per-row check would take, at a fraction of the cost: migration 0004).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from operator import attrgetter
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import KeyedColumnElement

from orchestrator.errors import PermanentError
from orchestrator.records import RECORD_FIELDS, RequestRecord
from orchestrator.store.models import REQUEST_COLUMNS, Request

# COPY ... (FORMAT BINARY) needs the PostgreSQL type of every column, in table order.
_PG_TYPES = {
    sa.BigInteger: "int8", sa.Integer: "int4", sa.Double: "float8", sa.String: "varchar", sa.Text: "text",
}
SQLITE_BATCH = 5000


def _pg_type(column: KeyedColumnElement[Any]) -> str:
    for typ, name in _PG_TYPES.items():
        if type(column.type) is typ:
            return name
    raise TypeError(f"no COPY type for requests.{column.name} ({column.type!r})")


COPY_TYPES = [_pg_type(c) for c in Request.__table__.columns]
COPY_SQL = f"COPY requests ({', '.join(REQUEST_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
_fields_of = attrgetter(*RECORD_FIELDS)
if ("point_id", *RECORD_FIELDS) != REQUEST_COLUMNS:  # a new RequestRecord field needs a migration
    raise RuntimeError(
        "requests table columns differ from RequestRecord fields: "
        f"{REQUEST_COLUMNS} vs ('point_id', *{RECORD_FIELDS})"
    )


class DuplicateRequestRecords(PermanentError):
    """A batch repeats a request already stored for the point."""


class RecordsRefused(PermanentError):
    """A batch for a point whose run has finished (records are append-only while a run runs)."""


class UnknownPoint(PermanentError):
    """A batch names a load point that does not exist (never recorded, or deleted)."""


def record_rows(point_id: int, records: Iterable[RequestRecord]) -> Iterator[tuple[Any, ...]]:
    """(point_id, *RECORD_FIELDS) tuples: the table's column order."""
    for rec in records:
        yield (point_id, *_fields_of(rec))


# Called with the batch's connection, inside its transaction, before any row is written: the
# experiment lease's fencing check (store/lease.py) raises there and nothing of the batch commits.
Fence = Callable[[sa.Connection], None]


def ingest_requests(engine: sa.Engine, point_id: int, records: Iterable[RequestRecord],
                    fence: Fence | None = None) -> int:
    """Append one batch of a point's records; returns how many were stored."""
    try:
        if engine.dialect.name == "postgresql":
            return _copy(engine, point_id, record_rows(point_id, records), fence)
        return _executemany(engine, point_id, record_rows(point_id, records), fence)
    except IntegrityError as e:
        raise _refused(point_id, e) or _duplicate(point_id, e) from None
    except Exception as e:  # psycopg's own errors come straight from COPY, unwrapped
        if (refused := _refused(point_id, e)) is not None:
            raise refused from None
        if type(e).__name__ in ("UniqueViolation", "ForeignKeyViolation"):
            raise _duplicate(point_id, e) from None
        raise


def _refused(point_id: int, e: Exception) -> RecordsRefused | None:
    """The append-only triggers' refusal (migration 0011: the point's run is not running), not a duplicate."""
    first = str(getattr(e, "orig", e)).strip().splitlines()
    if not first or "append-only" not in first[0]:
        return None
    return RecordsRefused(f"cannot store request records of point {point_id}: {first[0]}")


def _duplicate(point_id: int, e: Exception) -> DuplicateRequestRecords:
    first = str(getattr(e, "orig", e)).strip().splitlines()[0]
    return DuplicateRequestRecords(
        f"cannot store request records of point {point_id}: {first} "
        "(each request_id is stored once per point)"
    )


def _unknown(point_id: int) -> UnknownPoint:
    return UnknownPoint(f"cannot store request records of point {point_id}: no such load point")


def _copy(engine: sa.Engine, point_id: int, rows: Iterator[tuple[Any, ...]], fence: Fence | None) -> int:
    n = 0
    with engine.begin() as conn:
        if fence is not None:
            fence(conn)
        dbapi = conn.connection.driver_connection
        assert dbapi is not None  # an open connection has its driver's (psycopg) connection
        with dbapi.cursor() as cur:
            # the point cannot be deleted until this batch commits (nor can its requests orphan)
            cur.execute("SELECT 1 FROM load_points WHERE id = %s FOR KEY SHARE", (point_id,))
            if cur.fetchone() is None:
                raise _unknown(point_id)
        with dbapi.cursor() as cur, cur.copy(COPY_SQL) as copy:
            copy.set_types(COPY_TYPES)
            write = copy.write_row
            for row in rows:
                write(row)
                n += 1
    return n


def _executemany(engine: sa.Engine, point_id: int, rows: Iterator[tuple[Any, ...]], fence: Fence | None) -> int:
    placeholders = ", ".join("?" for _ in REQUEST_COLUMNS)
    sql = f"INSERT INTO requests ({', '.join(REQUEST_COLUMNS)}) VALUES ({placeholders})"
    n = 0
    with engine.begin() as conn:
        if fence is not None:
            fence(conn)
        dbapi = conn.connection.driver_connection
        assert dbapi is not None  # an open connection has its driver's (sqlite3) connection
        cur = dbapi.cursor()
        try:
            # SQLite's one writer at a time keeps the point from going away during the batch
            if cur.execute("SELECT 1 FROM load_points WHERE id = ?", (point_id,)).fetchone() is None:
                raise _unknown(point_id)
            while batch := list(islice(rows, SQLITE_BATCH)):
                cur.executemany(sql, batch)
                n += len(batch)
        except Exception as e:
            if type(e).__name__ == "IntegrityError":
                raise IntegrityError(sql, None, e) from None
            raise
        finally:
            cur.close()
    return n


def fetch_requests(engine: sa.Engine, point_id: int) -> list[RequestRecord]:
    """A point's records, in request_id order, as the load generator produced them."""
    cols = [Request.__table__.c[f] for f in RECORD_FIELDS]
    stmt = sa.select(*cols).where(Request.point_id == point_id).order_by(Request.request_id)
    with engine.connect() as conn:
        return [RequestRecord(*row) for row in conn.execute(stmt)]
