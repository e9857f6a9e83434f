"""What crosses between the controller and an in-cluster load generator (``loadgen.agent``):
a point's requests and schedule one way, its records and summary the other, as JSON.

Records and request specs travel as lists in field order (the spool's form: compact, and a
field added last reads back with its default from an older peer); a point's summary as its
``to_dict``. Pure: no I/O here.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from orchestrator.loadgen.runner import PointSummary
from orchestrator.loadgen.workloads import RequestSpec
from orchestrator.records import RequestRecord

RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord))
SPEC_FIELDS = tuple(f.name for f in fields(RequestSpec))
# A peer older than a field appended since sends fewer; the first ones are always there.
_MIN_RECORD_FIELDS = RECORD_FIELDS.index("output_hash") + 1
SUMMARY_FIELDS = tuple(f.name for f in fields(PointSummary) if f.name != "records")


class WireError(ValueError):
    """A message that is not what the protocol says (a peer of another version, a bug)."""


def record_rows(records: list[RequestRecord]) -> list[list[Any]]:
    return [[getattr(r, k) for k in RECORD_FIELDS] for r in records]


def records_from(rows: list[list[Any]]) -> list[RequestRecord]:
    out = []
    for row in rows:
        if not isinstance(row, list) or not _MIN_RECORD_FIELDS <= len(row) <= len(RECORD_FIELDS):
            raise WireError(f"a record of {len(row) if isinstance(row, list) else '?'} fields, expected "
                            f"{_MIN_RECORD_FIELDS} to {len(RECORD_FIELDS)}")
        out.append(RequestRecord(**dict(zip(RECORD_FIELDS[:len(row)], row, strict=True))))
    return out


def spec_rows(specs: list[RequestSpec]) -> list[list[Any]]:
    return [[[list(m) for m in s.messages] if k == "messages" else getattr(s, k) for k in SPEC_FIELDS]
            for s in specs]


def specs_from(rows: list[list[Any]]) -> list[RequestSpec]:
    out = []
    for row in rows:
        if not isinstance(row, list) or len(row) != len(SPEC_FIELDS):
            raise WireError(f"a request of {len(row) if isinstance(row, list) else '?'} fields, "
                            f"expected {len(SPEC_FIELDS)}")
        kw = dict(zip(SPEC_FIELDS, row, strict=True))
        kw["messages"] = tuple((str(role), str(text)) for role, text in kw["messages"])
        out.append(RequestSpec(**kw))
    return out


def summary_doc(summary: PointSummary) -> dict[str, Any]:
    return {k: v for k, v in summary.to_dict().items() if k in SUMMARY_FIELDS}


def summary_from(doc: dict[str, Any], records: list[RequestRecord] | None) -> PointSummary:
    missing = [k for k in SUMMARY_FIELDS if k not in doc]
    if missing:
        raise WireError(f"a point summary without {', '.join(missing)}")
    return PointSummary(**{k: doc[k] for k in SUMMARY_FIELDS}, records=records)
