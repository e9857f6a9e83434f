"""server prompt tokens: requests keep the server's usage.prompt_tokens.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

Issue 19 item 4: each request record keeps ``server_prompt_tokens``, the prompt length the
served model's tokenizer counted (``usage.prompt_tokens``), next to ``prompt_tokens`` (the
length the workload asked for); the prompt-length guard compares them. NULL for records stored
before this revision and for servers that report no usage.

A plain nullable ADD COLUMN on both databases, appended last (the record's field order, which
the PostgreSQL COPY of store/ingest.py and the digest follow): no batch rebuild on SQLite, which
would drop 0006's append-only triggers; the triggers name no column of ``requests``, so they
hold for the new one unchanged. ``runs.digest`` of a run finished before this revision stays
valid: the digest hashes the new field only where it is not NULL
(orchestrator.store.appendonly.OPTIONAL_FIELDS).

Downgrade: the column dropped (the values with it). Not batch mode either: SQLite (3.35+) drops
a column in place, keeping the triggers.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("requests", sa.Column("server_prompt_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        # in place (ALTER TABLE ... DROP COLUMN), never a batch copy that would lose the triggers
        op.execute("ALTER TABLE requests DROP COLUMN server_prompt_tokens")
    else:
        op.drop_column("requests", "server_prompt_tokens")
