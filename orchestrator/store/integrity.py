"""What keeps the store honest: its error types, the registration's immutability (the
repository's half; the database's is a trigger), finished runs' digest checks, and whether a
registration is a given plan."""

from __future__ import annotations

import dataclasses
import hashlib

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestrator.errors import PermanentError, PlanError, UserError
from orchestrator.plan import Plan, canonical_json, plan_from_canonical, plan_hash
from orchestrator.store.models import PlanRegistration


class NotFound(UserError):
    """The registration, experiment or run asked for is not in the store."""


class ImmutableRegistration(PermanentError):
    """Something tried to change or delete a registered plan."""


class StoreConflict(PermanentError):
    """A write that would duplicate or contradict what is stored (e.g. the same run twice)."""


@dataclasses.dataclass(frozen=True)
class DigestCheck:
    """A finished run's stored digest against the one its records give now (``stored`` None:
    finished before digests were kept, not checked). ``version``: the digest version it was
    checked at (appendonly: 1 only for a run finished before version 2 whose records match)."""

    run_id: int
    arm: str
    block: int
    attempt: int
    stored: str | None
    actual: str
    version: int = 2

    @property
    def changed(self) -> bool:
        return self.stored is not None and self.stored != self.actual


def refused(what: str, e: IntegrityError) -> StoreConflict:
    first = str(e.orig).strip().splitlines()[0] if e.orig is not None else str(e)
    return StoreConflict(f"{what} refused: {first}")


@sa.event.listens_for(Session, "before_flush")
def _refuse_registration_changes(session: Session, _ctx: object, _instances: object) -> None:
    # The repository layer's half of the rule (the database's half is a trigger).
    for obj in session.deleted:
        if isinstance(obj, PlanRegistration):
            raise ImmutableRegistration(f"plan registration {obj.id} cannot be deleted")
    for obj in session.dirty:
        if isinstance(obj, PlanRegistration) and session.is_modified(obj):
            raise ImmutableRegistration(
                f"plan registration {obj.id} cannot be changed: register the edited plan instead"
            )


def same_plan(registered_json: str, plan: Plan) -> bool:
    """True when a registration's canonical JSON, read by the current plan language, is ``plan``
    (a registration made by an earlier version hashes differently only by the defaults of
    fields added since)."""
    if plan_hash(plan) == hashlib.sha256(registered_json.encode()).hexdigest():
        return True
    try:
        return canonical_json(plan_from_canonical(registered_json)) == canonical_json(plan)
    except (PlanError, ValueError, KeyError, TypeError):
        return False  # not readable as a plan today: it cannot be this one
