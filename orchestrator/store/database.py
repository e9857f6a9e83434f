"""Where the database is, how to connect, and how to bring its schema to the latest revision.

Alembic is configured here in code (no alembic.ini needed), so `orch db upgrade` works from any
working directory. Without ORCH_DATABASE_URL the store is a SQLite file in the user's data
directory, created and migrated on first use.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

from orchestrator.errors import EnvironmentProblem, UserError
from orchestrator.paths import data_root

ENV_VAR = "ORCH_DATABASE_URL"
def _migrations_dir() -> Path:
    """migrations/ of the checkout (an editable install), else the copy a wheel ships."""
    here = Path(__file__).resolve()
    source = here.parents[2] / "migrations"
    return source if (source / "env.py").exists() else here.parents[1] / "_data" / "migrations"


MIGRATIONS_DIR = _migrations_dir()


def default_url() -> str:
    """ORCH_DATABASE_URL, else a SQLite file in the user's data directory."""
    url = os.environ.get(ENV_VAR, "").strip()
    if url:
        return url
    return f"sqlite:///{data_root() / 'orchestrator.sqlite'}"


def _normalise(url: str) -> str:
    """postgres:// and postgresql:// (what people paste) mean psycopg 3, which we install."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def _on_sqlite_connect(dbapi_conn: sqlite3.Connection, _record: object) -> None:
    # SQLite ignores foreign keys (and so ON DELETE CASCADE) unless asked, per connection.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=10000")  # first: switching to WAL waits for other openers
    cur.execute("PRAGMA foreign_keys=ON")
    # Switching a new file to WAL can fail at once with "database is locked" while another
    # process switches it (SQLite does not wait on the busy timeout there, to avoid a
    # deadlock): six processes opening a new file together hit it. Retry within the timeout.
    deadline = time.monotonic() + 10  # the busy timeout
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.005 + random.random() * 0.02)
    cur.close()


def create_engine(url: str) -> sa.Engine:
    """An engine for ``url``; a malformed URL is the user's error (exit 1)."""
    url = _normalise(url)
    try:
        parsed = make_url(url)
    except ArgumentError as e:
        raise UserError(f"database URL {url!r} is not a valid SQLAlchemy URL: {e}") from None
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise UserError(
            f"database {parsed.get_backend_name()!r} is not supported: use postgresql:// or sqlite:///"
        )
    driver = parsed.drivername.partition("+")[2] or parsed.get_driver_name()
    if parsed.get_backend_name() == "sqlite" and driver != "pysqlite":
        raise UserError(f"database driver sqlite+{driver} is not supported: use sqlite:///PATH")
    if parsed.get_backend_name() == "postgresql" and driver not in ("psycopg", "psycopg2"):
        raise UserError(f"database driver postgresql+{driver} is not supported: use postgresql://")
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:" and not db.startswith("file:"):
            try:
                Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise EnvironmentProblem(
                    f"cannot create the folder of the SQLite database {db}: {e.strerror}; "
                    f"set {ENV_VAR} to a writable location"
                ) from None
        engine = sa.create_engine(parsed)
        sa.event.listen(engine, "connect", _on_sqlite_connect)
        return engine
    if parsed.get_backend_name() != "postgresql":
        raise UserError(
            f"database {parsed.get_backend_name()!r} is not supported: use postgresql:// or sqlite:///"
        )
    try:
        return sa.create_engine(parsed, pool_pre_ping=True, connect_args={"connect_timeout": 10})
    except (NoSuchModuleError, ImportError) as e:
        raise UserError(f"database URL {parsed.render_as_string(hide_password=True)!r}: {e}") from None


def check_reachable(engine: sa.Engine) -> None:
    """Connect once; an unreachable database is an EnvironmentProblem naming the remedy."""
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
    except OperationalError as e:
        reason = str(e.orig).strip().splitlines()[0] if e.orig else str(e)
        raise EnvironmentProblem(
            f"database {engine.url.render_as_string(hide_password=True)} is unreachable ({reason}); "
            f"start it, or point {ENV_VAR} at a reachable PostgreSQL (or unset it for the "
            "local SQLite file)"
        ) from None


def alembic_config(engine: sa.Engine | None = None) -> Config:
    """Alembic's configuration, built in code: script location and (optionally) the engine."""
    if not (MIGRATIONS_DIR / "env.py").exists():
        raise EnvironmentProblem(
            f"migrations not found at {MIGRATIONS_DIR}: reinstall orchestrator (a wheel ships "
            "them in orchestrator/_data; a checkout has them in migrations/)"
        )
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("path_separator", "os")
    if engine is not None:
        cfg.attributes["engine"] = engine
    return cfg


def head_revision() -> str:
    """The single head revision of the migrations (a test checks there is only one)."""
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise EnvironmentProblem(f"migrations have {len(heads)} heads ({heads}); merge them")
    return heads[0]


def current_revision(engine: sa.Engine) -> str | None:
    """The revision the database is at (None: never migrated)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: sa.Engine, revision: str = "head") -> None:
    """Migrate the database to ``revision`` (default: head).

    A SQLite file is migrated under an exclusive lock on a file beside it, so processes that
    open a new database at once (six `orch status` on first use) migrate it one after another:
    the first migrates, the rest find it at the revision already (alembic then does nothing).
    PostgreSQL migrations run in one transaction with its own locks. At the head, the capacity
    summaries' figures a revision left uncomputed (0014: the estimator is orchestrator code, which
    a revision does not import) are computed then (summaries.refill; nothing to do otherwise)."""
    with _sqlite_migration_lock(engine):
        command.upgrade(alembic_config(engine), revision)
        if revision in ("head", head_revision()):
            from orchestrator.store import summaries  # imports the models: the head's schema only

            summaries.refill(engine)


@contextlib.contextmanager
def _sqlite_migration_lock(engine: sa.Engine) -> Iterator[None]:
    db = engine.url.database if engine.url.get_backend_name() == "sqlite" else None
    if not db or db == ":memory:" or db.startswith("file:"):
        yield
        return
    lock_path = Path(db).expanduser().with_name(Path(db).name + ".migrate.lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise EnvironmentProblem(
            f"cannot create the migration lock {lock_path}: {e.strerror}; set {ENV_VAR} to a writable location"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits for another process's migration to finish
        yield
    finally:
        os.close(fd)  # closing releases the lock


def downgrade(engine: sa.Engine, revision: str) -> None:
    """Migrate the database down to ``revision`` ("base": no tables)."""
    command.downgrade(alembic_config(engine), revision)
