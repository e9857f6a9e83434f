"""The hash chain over finished rows (migration 0012): what detects a history rewritten by
someone the triggers do not stop (the tables' owner, a superuser, whoever holds a SQLite file).

Every run is sealed when it finishes (its digest, version 2: records, capacities, points'
validity, status, validity, reason) and every verdict when it is judged (its row), each link's
sha256 covering the previous link's:

    sha256("orch-chain/1\\n" + prev + "\\n" + seq + "\\n" + kind + "\\n" + ref_id + "\\n"
           + experiment_id + "\\n" + payload_sha256)

The first link's ``prev`` is 64 zeros. ``verify`` walks the chain: every link's hash from its
fields and the previous link, every sealed row's content now against its payload; the head (the
last link's hash) is printed with every verdict, so that a head kept outside the database (a CI
log, a ticket) proves nothing before it changed: a rewritten history has no link with that hash.
Appending is serialised (PostgreSQL: a transaction-level advisory lock; SQLite has one writer),
and ``seq`` and ``prev_sha256`` are unique, so the chain never forks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from orchestrator.store.appendonly import run_digest
from orchestrator.store.models import BarVerdict, ChainEntry, Run
from orchestrator.store.types import utcnow

CHAIN_TAG = "orch-chain/1"
GENESIS = "0" * 64
LOCK_KEY = 0x6F726368  # "orch": the advisory lock that serialises appends (PostgreSQL)


def link_sha256(prev: str, seq: int, kind: str, ref_id: int, experiment_id: int, payload: str) -> str:
    text = f"{CHAIN_TAG}\n{prev}\n{seq}\n{kind}\n{ref_id}\n{experiment_id}\n{payload}"
    return hashlib.sha256(text.encode()).hexdigest()


def verdict_payload(v: BarVerdict) -> str:
    """sha256 of a verdict row's content (as read back from the database)."""
    doc = [v.experiment_id, v.registration_id, v.bar_id, v.verdict, v.estimate, v.lower, v.upper, v.blocks,
           v.label, v.note, v.evidence, v.judged_at.isoformat() if v.judged_at else None]
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def append(s: Session, kind: str, ref_id: int, experiment_id: int, payload: str) -> ChainEntry:
    """Seal a row: the next link, in the caller's transaction (its commit makes both durable)."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(sa.text("SELECT pg_catalog.pg_advisory_xact_lock(:k)").bindparams(k=LOCK_KEY))
    last = s.execute(sa.select(ChainEntry.seq, ChainEntry.sha256).order_by(ChainEntry.seq.desc()).limit(1)).first()
    seq, prev = (1, GENESIS) if last is None else (int(last[0]) + 1, str(last[1]))
    entry = ChainEntry(seq=seq, kind=kind, ref_id=ref_id, experiment_id=experiment_id, payload_sha256=payload,
                       prev_sha256=prev, sha256=link_sha256(prev, seq, kind, ref_id, experiment_id, payload),
                       created_at=utcnow())
    s.add(entry)
    s.flush()
    return entry


def head(s: Session) -> str | None:
    """The last link's hash (None: nothing sealed yet)."""
    return s.scalar(sa.select(ChainEntry.sha256).order_by(ChainEntry.seq.desc()).limit(1))


@dataclass
class ChainReport:
    """What ``verify`` found: ``problems`` one line each (empty: intact); ``head`` the last
    link's hash; ``unsealed`` finished runs and verdicts stored before the chain existed."""

    links: int = 0
    head: str | None = None
    problems: list[str] = field(default_factory=list)
    unsealed_runs: int = 0
    unsealed_verdicts: int = 0
    head_found: bool | None = None  # with a head to look for: whether a link has it
    after_head: int = 0  # links appended after that head

    def to_dict(self) -> dict[str, Any]:
        return {"links": self.links, "head": self.head, "problems": list(self.problems),
                "unsealed_runs": self.unsealed_runs, "unsealed_verdicts": self.unsealed_verdicts,
                "head_found": self.head_found, "after_head": self.after_head}


def verify(s: Session, kept_head: str | None = None) -> ChainReport:
    """Walk the chain (see the module docstring); ``kept_head``: a head printed earlier (a
    prefix of 12 or more hex digits is enough), which must be a link of this chain."""
    report = ChainReport()
    prev, expected_seq = GENESIS, 1
    sealed: dict[str, set[int]] = {"run": set(), "verdict": set()}
    found_at: int | None = None
    want = kept_head.lower() if kept_head else None
    for e in s.scalars(sa.select(ChainEntry).order_by(ChainEntry.seq)):
        report.links += 1
        if e.seq != expected_seq:
            report.problems.append(f"chain link {expected_seq} is missing (found {e.seq} next)")
        if e.prev_sha256 != prev:
            report.problems.append(f"chain link {e.seq} does not follow link {e.seq - 1} (its previous hash differs)")
        if link_sha256(e.prev_sha256, e.seq, e.kind, e.ref_id, e.experiment_id, e.payload_sha256) != e.sha256:
            report.problems.append(f"chain link {e.seq} ({e.kind} {e.ref_id}): its hash is not what its fields give")
        now = _payload_now(s, e.kind, e.ref_id)
        if now is None:
            report.problems.append(f"chain link {e.seq}: {e.kind} {e.ref_id} is gone")
        elif now != e.payload_sha256:
            report.problems.append(f"{e.kind} {e.ref_id} (experiment {e.experiment_id}) changed since it was sealed "
                                   f"in chain link {e.seq}")
        sealed.setdefault(e.kind, set()).add(e.ref_id)
        if want is not None and found_at is None and e.sha256.startswith(want):
            found_at = e.seq
        prev, expected_seq = e.sha256, e.seq + 1
    report.head = None if report.links == 0 else prev
    finished = s.scalars(sa.select(Run.id).where(Run.status != "running")).all()
    report.unsealed_runs = sum(1 for i in finished if i not in sealed["run"])
    verdicts = s.scalars(sa.select(BarVerdict.id)).all()
    report.unsealed_verdicts = sum(1 for i in verdicts if i not in sealed["verdict"])
    if want is not None:
        report.head_found = found_at is not None
        if found_at is None:
            report.problems.append(f"the kept head {kept_head} is not a link of this chain: the history before it "
                                   "was rewritten")
        else:
            report.after_head = report.links - found_at
    return report


def _payload_now(s: Session, kind: str, ref_id: int) -> str | None:
    if kind == "run":
        row = s.get(Run, ref_id)
        return None if row is None else run_digest(s, ref_id)
    if kind == "verdict":
        v = s.get(BarVerdict, ref_id)
        return None if v is None else verdict_payload(v)
    return None
