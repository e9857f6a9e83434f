"""What proves the stored results are the ones taken: each finished run's digest recomputed,
the hash chain walked, the database's identity and whose a load point is (the spool's key).
A mixin of ``Store``: needs ``self._sessions`` and ``self._identity``."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.errors import EnvironmentProblem
from orchestrator.store import chain
from orchestrator.store.appendonly import run_digest
from orchestrator.store.integrity import DigestCheck, NotFound
from orchestrator.store.models import LoadPoint, Run, StoreIdentity
from orchestrator.store.rows import PointOwner


class IntegrityQueries:
    """Digests, the hash chain, the store's identity (see the module docstring)."""

    _sessions: sessionmaker[Session]
    _identity: str | None

    def verify_digests(self, experiment_id: int) -> list[DigestCheck]:
        """Every finished run's stored digest against its records and outcome now (``orch
        verdict --verify``): version 2, else version 1 for a run finished before version 2
        (appendonly)."""
        with self._sessions.begin() as s:
            runs = s.scalars(
                sa.select(Run).where(Run.experiment_id == experiment_id, Run.status != "running")
                .order_by(Run.block, Run.position, Run.attempt)
            ).all()
            out = []
            for r in runs:
                actual, version = run_digest(s, r.id, (r.status, r.valid, r.invalid_reason)), 2
                if r.digest is not None and r.digest != actual and run_digest(s, r.id, version=1) == r.digest:
                    actual, version = r.digest, 1
                out.append(DigestCheck(r.id, r.arm, r.block, r.attempt, r.digest, actual, version))
            return out

    def chain_head(self) -> str | None:
        """The hash chain's head (store/chain.py): print it, keep it outside the database."""
        with self._sessions() as s:
            return chain.head(s)

    def verify_chain(self, kept_head: str | None = None) -> chain.ChainReport:
        """Walk the hash chain: every link, every sealed row's content now, and ``kept_head``."""
        with self._sessions() as s:
            return chain.verify(s, kept_head)

    def identity(self) -> str:
        """This database's identity (``store_identity``, written once by migration 0011)."""
        if self._identity is None:
            with self._sessions() as s:
                found = s.scalar(sa.select(StoreIdentity.identity).where(StoreIdentity.id == 1))
            if found is None:
                raise EnvironmentProblem("the database has no store identity (migration 0011): run `orch db upgrade`")
            self._identity = found
        return self._identity

    def point_owner(self, point_id: int) -> PointOwner:
        """The database, experiment and run a load point belongs to, and the run's status."""
        with self._sessions() as s:
            row = s.execute(sa.select(Run.experiment_id, Run.id, Run.status).join(LoadPoint, LoadPoint.run_id == Run.id)
                            .where(LoadPoint.id == point_id)).one_or_none()
        if row is None:
            raise NotFound(f"no load point with id {point_id}")
        return PointOwner(self.identity(), int(row[0]), int(row[1]), str(row[2]))
