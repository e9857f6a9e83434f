"""One controller owns an experiment at a time (DESIGN 12), without a schema change.

- Liveness: PostgreSQL holds a session advisory lock keyed by the experiment id on a dedicated
  connection for the owner's lifetime; SQLite holds an ``fcntl.flock`` on a lock file beside the
  database file (``<db>.exp-<id>.lock``). Either is released by the operating system or the
  server the moment the owner dies, so a free lease means a dead (or finished) owner.
- Fencing: the owner writes its session id to ``experiments.controller_id`` when it takes the
  lease; every write through :meth:`ExperimentLease.fenced` checks, in the same transaction
  (a ``FOR SHARE`` row lock on PostgreSQL; SQLite serialises writers), that ``controller_id``
  is still this session. A stale owner's write raises :class:`LeaseLost` and nothing of it is
  committed.
"""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from orchestrator.errors import EnvironmentProblem
from orchestrator.store.models import Experiment

# First key of the two-int advisory lock: this program's namespace (the second is the id).
_PG_NAMESPACE = 0x0C4E57


class LeaseHeld(EnvironmentProblem):
    """Another live controller owns the experiment."""


class LeaseLost(EnvironmentProblem):
    """This controller no longer owns the experiment: its writes are refused."""


class ExperimentLease:
    """The lease on one experiment, held from :meth:`acquire` until :meth:`release`."""

    def __init__(self, store: Any, experiment_id: int, session: str):
        self.store = store
        self.engine: sa.Engine = store.engine
        self.experiment_id = experiment_id
        self.session = session
        self._conn: sa.Connection | None = None
        self._file: IO[str] | None = None
        self.held = False

    # -- liveness -----------------------------------------------------------------------------
    @property
    def lock_path(self) -> Path | None:
        """The SQLite lock file (None for PostgreSQL or an in-memory database)."""
        db = self.engine.url.database
        if self.engine.dialect.name != "sqlite" or not db or db == ":memory:":
            return None
        p = Path(db)
        return p.with_name(f"{p.name}.exp-{self.experiment_id}.lock")

    def _try_lock(self) -> bool:
        if self.engine.dialect.name == "postgresql":
            conn = self.engine.connect()
            try:
                got = bool(conn.execute(sa.select(sa.func.pg_try_advisory_lock(
                    _PG_NAMESPACE, self.experiment_id))).scalar())
                conn.commit()
            except BaseException:
                conn.close()
                raise
            if not got:
                conn.close()
                return False
            self._conn = conn
            return True
        path = self.lock_path
        if path is None:
            return True  # an in-memory database lives in this process only
        f = open(path, "a+")  # noqa: SIM115 - held open for the lease's lifetime
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return False
        f.seek(0)
        f.truncate()
        f.write(f"{self.session}\n")
        f.flush()
        self._file = f
        return True

    def acquire(self, take_over: bool = False) -> ExperimentLease:
        """Take the lease, or raise :class:`LeaseHeld` naming the live owner. ``take_over`` is
        the operator saying the previous owner is gone: it never takes a lease still held."""
        if not self._try_lock():
            exp = self.store.get_experiment(self.experiment_id)
            since = f" (since {exp.started_at:%Y-%m-%d %H:%M:%S} UTC)" if exp.started_at else ""
            extra = " (--take-over takes only a lease whose owner has died)" if take_over else ""
            raise LeaseHeld(
                f"experiment {exp.name} is being run by {exp.controller_id or 'another controller'}"
                f"{since}; wait for it, or `orch cancel {exp.name}`{extra}"
            )
        self.held = True
        with self.engine.begin() as conn:
            conn.execute(sa.update(Experiment).where(Experiment.id == self.experiment_id)
                         .values(controller_id=self.session))
        return self

    def ensure(self) -> None:
        """Still the owner? Re-take the advisory lock if its connection dropped (a database
        restart releases it); :class:`LeaseLost` if another controller took it meanwhile."""
        if self._conn is not None:
            try:
                self._conn.execute(sa.select(1))
                self._conn.commit()
            except sa.exc.DBAPIError:
                with contextlib.suppress(sa.exc.DBAPIError):
                    self._conn.close()
                self._conn = None
                if not self._try_lock():
                    raise self._lost() from None
        owner = self._owner()
        if owner != self.session:
            raise self._lost(owner)

    def _owner(self) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(Experiment.controller_id)
                                .where(Experiment.id == self.experiment_id)).scalar()

    def _lost(self, owner: str | None = None) -> LeaseLost:
        who = owner or "another controller"
        return LeaseLost(f"experiment {self.experiment_id} is now owned by {who}: this controller "
                         f"({self.session}) lost its lease and stops; its writes are refused")

    def release(self) -> None:
        if self._conn is not None:
            try:
                self._conn.execute(sa.select(sa.func.pg_advisory_unlock(_PG_NAMESPACE, self.experiment_id)))
                self._conn.commit()
            except sa.exc.DBAPIError:
                pass  # the connection is gone: so is the lock
            finally:
                with contextlib.suppress(sa.exc.DBAPIError):
                    self._conn.close()
                self._conn = None
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
        self.held = False

    def __enter__(self) -> ExperimentLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- fencing ------------------------------------------------------------------------------
    def fenced(self, store_type: type | None = None) -> Any:
        """A Store on the same engine whose every write transaction first checks (row-locked)
        that this session still owns the experiment."""
        cls = store_type or type(self.store)
        fenced = cls(self.engine)
        sa.event.listen(fenced._sessions, "before_flush", self._check)
        fenced.fence = self.check_owner  # request batches bypass the ORM session: fenced apart
        return fenced

    def _check(self, session: Session, _ctx: object, _instances: object) -> None:
        self.check_owner(session.connection())

    def check_owner(self, conn: sa.Connection) -> None:
        """Raise :class:`LeaseLost` unless this session owns the experiment; on PostgreSQL the
        experiment row stays share-locked until ``conn``'s transaction ends, so a take-over
        waits for the write in flight."""
        stmt = sa.select(Experiment.controller_id).where(Experiment.id == self.experiment_id)
        if self.engine.dialect.name == "postgresql":
            stmt = stmt.with_for_update(read=True)
        owner = conn.execute(stmt).scalar()
        if owner != self.session:
            raise self._lost(owner)
