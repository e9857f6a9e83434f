"""The runtime database role of README "What is guaranteed": a login role given exactly
``runtime_grants`` by the migration owner, for tests that act as a controller (or an attacker
holding its credentials) would."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa


@contextmanager
def runtime_url(owner_url: str) -> Iterator[str]:
    """``owner_url`` migrated to head (as its owner); yields the URL of a fresh runtime role on
    the same database (PostgreSQL), or ``owner_url`` itself on SQLite (no roles there). The role
    and what it owns (temporary objects) are dropped afterwards."""
    from orchestrator.store import Store
    from orchestrator.store.appendonly import runtime_grants

    owner = Store.open(owner_url)
    if owner.engine.dialect.name != "postgresql":
        owner.close()
        yield owner_url
        return
    role = f"orch_rt_{uuid.uuid4().hex[:8]}"
    with owner.engine.begin() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN"))
        for grant in runtime_grants(role):
            conn.execute(sa.text(grant))
    try:
        yield sa.make_url(owner_url).set(username=role, password=None).render_as_string(hide_password=False)
    finally:
        with owner.engine.begin() as conn:
            conn.execute(sa.text(f"DROP OWNED BY {role}"))
            conn.execute(sa.text(f"DROP ROLE {role}"))
        owner.close()


# What runtime_grants let the runtime role update in capacity_summaries before 0014 added every
# run's figures there.
SUMMARY_UPDATE_0013 = ("runs", "median", "p25", "p75", "min", "max", "last_measured")


def grants_at(role: str, revision: str) -> list[str]:
    """``runtime_grants(role)`` as they were at ``revision`` (a role granted before a later
    revision, which must then give it what it needs): no chain_entries before 0012, the
    summaries' point statistics alone before 0014."""
    from orchestrator.store.appendonly import runtime_grants

    out = []
    for grant in runtime_grants(role):
        if revision < "0012":
            grant = grant.replace(", chain_entries", "")
        if revision < "0014" and grant.startswith("GRANT UPDATE (") and grant.endswith(f" ON capacity_summaries TO {role}"):
            grant = f"GRANT UPDATE ({', '.join(SUMMARY_UPDATE_0013)}) ON capacity_summaries TO {role}"
        out.append(grant)
    return out
