"""Append-only measurements: the maintenance escape and a run's digest (DESIGN section 12).

Migration 0006 makes requests, load points, runs, guard results, capacities, metric samples
and verdicts refuse UPDATE and DELETE beyond what a run's lifecycle needs (see its docstring).
Two things live here:

- ``maintenance(conn)``: the one escape, for the rest of the caller's transaction only. Used by
  ``Store.delete_experiment`` (an operator's command) and by tests that tamper on purpose;
  nothing a run does uses it. On PostgreSQL it is ``SET LOCAL orchestrator.maintenance = 'on'``
  and the triggers honour it only for the tables' owner (the migration role), never for the
  runtime role; on SQLite a row in ``orch_maintenance`` that never outlives the transaction.
- ``run_digest``: sha256 over a run's records, stored in ``runs.digest`` when it finishes and
  recomputed by ``orch verdict --verify``. Version 1 hashes, line by line (compact JSON, floats
  as Python's shortest repr, NULL as null): the tag ``orch-run-digest/1``; every request record
  of the run's points, ordered by point (seq, id) then request_id, as [point seq, *the
  RequestRecord fields]; then every capacity ordered by class, as [class, capacity, at_rate,
  attainment, points_used, censored, converged, upper]. Database ids are left out, so the
  digest is the same on SQLite and PostgreSQL. A record field added after version 1
  (``OPTIONAL_FIELDS``: ``server_prompt_tokens``, migration 0008) is appended to its row only
  when it is not NULL, so a run finished before the field existed (NULL in every row) keeps the
  digest it was stored with, and a value set later still changes the digest.

  Version 2 (issue 30; the digest of every run finished since): the tag ``orch-run-digest/2``,
  the lines of version 1, then one line per load point ordered by (seq, id), as ["point", seq,
  valid], and last the run's own outcome, as ["run", status, valid, invalid_reason]. So an edit
  of a finished run's status, validity or reason, or of a point's validity, changes the digest
  too. A digest is checked against version 2 first and against version 1 only when version 2
  does not match (a run finished before version 2: its status is not covered); the stored
  value carries no version (a column of 64 characters; a new one would need the runtime
  role's grants changed).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from orchestrator.records import RECORD_FIELDS
from orchestrator.store.models import Capacity, LoadPoint, MaintenanceFlag, Request, Run

DIGEST_TAG = "orch-run-digest/1"
DIGEST_TAG_V2 = "orch-run-digest/2"
DIGEST_VERSION = 2  # what finish_run stores now
# Record fields added after digest version 1: hashed only where not NULL (see above).
OPTIONAL_FIELDS = ("server_prompt_tokens",)
if RECORD_FIELDS[-len(OPTIONAL_FIELDS):] != OPTIONAL_FIELDS:  # they must be the trailing fields
    raise RuntimeError(f"digest: {OPTIONAL_FIELDS} must be the last RequestRecord fields ({RECORD_FIELDS})")
# What the runtime role (the controller, experiments) may write on PostgreSQL; the migration
# owner owns every table and runs `orch db upgrade`. INSERT everywhere it records, UPDATE only
# of the columns a run's lifecycle sets, DELETE only of the derived summaries.
RUNTIME_INSERT = ("plan_registrations", "deployment_configs", "experiments", "runs", "load_points", "requests",
                  "guard_results", "capacities", "bar_verdicts", "metric_samples", "capacity_summaries",
                  "workload_signatures", "history_groups", "chain_entries")
RUNTIME_UPDATE = {
    "experiments": ("status", "controller_id", "started_at", "finished_at"),
    "runs": ("status", "valid", "invalid_reason", "engine_version", "image_digest", "gpu_type", "nodes",
             "driver", "fingerprint", "finished_at", "digest"),
    "load_points": ("achieved_rate", "throughput_tok_s", "per_class", "percentiles", "context", "valid"),
    "capacities": ("capacity", "at_rate", "attainment", "points_used", "censored", "converged", "upper",
                   "config_id", "counted", "measured_at", "workload_sha256", "ttft_ms", "tpot_ms", "backend",
                   "simulated", "observed_gpu", "observed_engine", "group_id"),
    "capacity_summaries": ("runs", "median", "p25", "p75", "min", "max", "last_measured", "n_points",
                           "n_censored_above", "n_censored_below", "n_unconverged", "censored_above_from",
                           "censored_below_to", "npmle_median", "median_censored", "median_low", "median_high",
                           "median_level", "last_run_measured"),
}
CAPACITY_FIELDS = ("class_name", "capacity", "at_rate", "attainment", "points_used", "censored",
                   "converged", "upper")


@contextmanager
def maintenance(conn: sa.Connection | Session) -> Iterator[None]:
    """Let the append-only triggers pass for the rest of ``conn``'s transaction (an operator's
    delete). PostgreSQL honours it only for the tables' owner."""
    bind = conn.get_bind() if isinstance(conn, Session) else conn
    if bind.dialect.name == "postgresql":
        conn.execute(sa.text("SET LOCAL orchestrator.maintenance = 'on'"))
        yield  # an error aborts the transaction, and the setting with it
        conn.execute(sa.text("SET LOCAL orchestrator.maintenance = 'off'"))
        return
    conn.execute(sa.insert(MaintenanceFlag).values(id=1))
    try:
        yield
    finally:
        conn.execute(sa.delete(MaintenanceFlag))


def runtime_grants(role: str, schema: str = "public") -> list[str]:
    """The GRANT statements that give ``role`` what a runtime needs and no more (README "What is
    guaranteed"); the migration owner runs them after `orch db upgrade`."""
    out = [f"GRANT USAGE ON SCHEMA {schema} TO {role}",
           f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}",
           f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}",
           f"GRANT INSERT ON {', '.join(RUNTIME_INSERT)} TO {role}"]
    out += [f"GRANT UPDATE ({', '.join(cols)}) ON {table} TO {role}" for table, cols in RUNTIME_UPDATE.items()]
    out.append(f"GRANT DELETE ON capacity_summaries TO {role}")
    return out


def _canonical(values: tuple[Any, ...], kinds: tuple[type, ...]) -> bytes:
    row = [v if v is None else kind(v) for v, kind in zip(values, kinds, strict=True)]
    return json.dumps(row, separators=(",", ":"), allow_nan=True).encode() + b"\n"


def _kind(column: sa.ColumnElement[Any]) -> type:
    if isinstance(column.type, sa.Boolean):
        return bool
    if isinstance(column.type, sa.Float):
        return float
    if isinstance(column.type, sa.Integer):
        return int
    return str


RunOutcome = tuple[str, bool | None, str | None]  # (status, valid, invalid_reason)


def run_digest(conn: sa.Connection | Session, run_id: int, outcome: RunOutcome | None = None,
               version: int = DIGEST_VERSION) -> str:
    """sha256 (hex) of a run's records (and, from version 2, its points' validity and its
    ``outcome``: the row's own status, validity and reason unless given, as ``finish_run`` gives
    them before it writes them), as defined above."""
    if version not in (1, 2):
        raise ValueError(f"no run digest version {version}")
    req_cols = [Request.__table__.c[f] for f in RECORD_FIELDS]
    requests = (
        sa.select(LoadPoint.seq, *req_cols)
        .join(LoadPoint, LoadPoint.id == Request.point_id)
        .where(LoadPoint.run_id == run_id)
        .order_by(LoadPoint.seq, LoadPoint.id, Request.request_id)
    )
    cap_cols = [Capacity.__table__.c[f] for f in CAPACITY_FIELDS]
    capacities = sa.select(*cap_cols).where(Capacity.run_id == run_id).order_by(Capacity.class_name)
    h = hashlib.sha256((DIGEST_TAG if version == 1 else DIGEST_TAG_V2).encode() + b"\n")
    kinds = (int, *(_kind(c) for c in req_cols))
    n_base = 1 + len(RECORD_FIELDS) - len(OPTIONAL_FIELDS)
    for row in conn.execute(requests.execution_options(yield_per=5000)):
        values = tuple(row)
        if all(v is None for v in values[n_base:]):
            h.update(_canonical(values[:n_base], kinds[:n_base]))
        else:
            h.update(_canonical(values, kinds))
    kinds = tuple(_kind(c) for c in cap_cols)
    for row in conn.execute(capacities):
        h.update(_canonical(tuple(row), kinds))
    if version == 1:
        return h.hexdigest()
    points = sa.select(LoadPoint.seq, LoadPoint.valid).where(LoadPoint.run_id == run_id).order_by(
        LoadPoint.seq, LoadPoint.id)
    for seq, valid in conn.execute(points):
        h.update(_canonical(("point", seq, valid), (str, int, bool)))
    if outcome is None:
        row = conn.execute(sa.select(Run.status, Run.valid, Run.invalid_reason).where(Run.id == run_id)).one()
        outcome = (row[0], row[1], row[2])
    h.update(_canonical(("run", *outcome), (str, str, bool, str)))
    return h.hexdigest()
