"""`orch db upgrade`: bring the results database to the latest schema revision."""

from __future__ import annotations

from orchestrator.cli.apps import JSON_OPTION, db_app
from orchestrator.cli.output import emit_json, say


@db_app.command("upgrade")
def upgrade(as_json: bool = JSON_OPTION) -> None:
    """Migrate the database (ORCH_DATABASE_URL, else the local SQLite file) to the latest revision."""
    from orchestrator.store import Store  # heavy (SQLAlchemy, Alembic): only when asked for
    from orchestrator.store.database import current_revision, head_revision

    with Store.open(migrate=False) as store:
        before = current_revision(store.engine)
    with Store.open(migrate=True) as store:
        after = current_revision(store.engine)
        url = store.engine.url.render_as_string(hide_password=True)
    doc = {"database": url, "from_revision": before, "revision": after, "head": head_revision()}
    if as_json:
        emit_json(doc)
    elif before == after:
        say(f"{url}: already at revision {after} (head)")
    else:
        say(f"{url}: upgraded from {before or 'an empty database'} to revision {after} (head)")
