"""Column types that behave the same on PostgreSQL and SQLite.

- ``UTCDateTime``: always timezone-aware UTC in Python; SQLite stores naive text, so we
  normalise on the way in and out (otherwise comparisons with aware times fail on SQLite only).
- ``JSONDoc``: JSONB on PostgreSQL, JSON text on SQLite. Measurements legitimately hold
  infinities (an unfinished request has TTFT = +inf, DESIGN section 7) which strict JSON cannot
  carry, so non-finite floats are stored as the strings "Infinity", "-Infinity", "NaN" and
  restored as floats when read.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.types import TypeDecorator

_NONFINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def utcnow() -> datetime:
    """Now, aware, UTC."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored with its zone on PostgreSQL and as UTC text on SQLite."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware (use datetime.now(UTC))")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def to_json_safe(value: Any) -> Any:
    """A copy of ``value`` with non-finite floats replaced by their names (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(k): to_json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_safe(v) for v in value]
    return value


def from_json_safe(value: Any) -> Any:
    """Undo ``to_json_safe``: the names of non-finite floats become floats again."""
    if isinstance(value, str) and value in _NONFINITE:
        return _NONFINITE[value]
    if isinstance(value, dict):
        return {k: from_json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json_safe(v) for v in value]
    return value


JSON_IMPL = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


class JSONDoc(TypeDecorator[Any]):
    """A JSON document (JSONB on PostgreSQL) that round-trips infinities."""

    impl = JSON_IMPL
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> Any:
        return None if value is None else to_json_safe(value)

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> Any:
        return None if value is None else from_json_safe(value)
