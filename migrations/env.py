"""Alembic environment: runs revisions on the engine handed over by orchestrator.store.database.

The engine comes from ``config.attributes["engine"]`` (what `orch db upgrade` and Store.open
pass); without it, from ORCH_DATABASE_URL or the default SQLite file, so the plain `alembic`
command works too. On PostgreSQL a transaction-scoped advisory lock serialises concurrent
upgrades (two controllers starting at once must not both create the tables).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from orchestrator.store.database import create_engine, default_url
from orchestrator.store.models import Base

MIGRATION_LOCK_KEY = 0x6F726368  # "orch"

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(url=default_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = config.attributes.get("engine") or create_engine(default_url())
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("select pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        context.configure(
            connection=conn,
            target_metadata=target_metadata,
            render_as_batch=conn.dialect.name == "sqlite",
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        conn.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
