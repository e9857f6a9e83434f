"""hash chain: every finished run and every verdict sealed into one append-only chain.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05

Issue 30: ``chain_entries``, one row per sealed row (``kind`` run or verdict, ``ref_id`` its
id), each with the sha256 of the sealed content (a run: its digest, version 2, which covers its
records, capacities, points' validity, status, validity and reason; a verdict: its row) and of
the previous entry; ``seq`` and ``prev_sha256`` unique (the chain never forks). UPDATE, DELETE
and TRUNCATE are refused as for measurements (the owner's maintenance escape aside). A runtime
role granted INSERT on the measurement tables gets INSERT here (its sequence too). Runs and
verdicts stored before this revision are not sealed (`orch verify` counts them).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

HINT = "measurements are append-only (DESIGN section 12)"
SQLITE_FREE = "NOT EXISTS (SELECT 1 FROM orch_maintenance)"


def _pg() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _schema() -> str:
    bind = op.get_bind()
    name = bind.execute(sa.text("SELECT current_schema()")).scalar_one()
    return bind.dialect.identifier_preparer.quote_schema(name) + "."


def upgrade() -> None:
    op.create_table(
        "chain_entries",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("ref_id", sa.BigInteger(), nullable=False),
        sa.Column("experiment_id", sa.BigInteger(), nullable=False),
        sa.Column("payload_sha256", sa.String(length=64), nullable=False),
        sa.Column("prev_sha256", sa.String(length=64), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_chain_entries")),
        sa.UniqueConstraint("seq", name=op.f("uq_chain_entries_seq")),
        sa.UniqueConstraint("prev_sha256", name=op.f("uq_chain_entries_prev_sha256")),
        sa.UniqueConstraint("sha256", name=op.f("uq_chain_entries_sha256")),
    )
    op.create_index(op.f("ix_chain_entries_experiment_id"), "chain_entries", ["experiment_id"])
    if _pg():
        s = _schema()
        op.execute(f"""
            CREATE TRIGGER chain_entries_insert_only BEFORE UPDATE OR DELETE OR TRUNCATE ON {s}chain_entries
            FOR EACH STATEMENT EXECUTE FUNCTION {s}orch_refuse_measurement_change()
        """)
        # Whoever may append measurements (the runtime role) may append links.
        op.execute(f"""
            DO $$
            DECLARE g oid;
            BEGIN
                FOR g IN SELECT DISTINCT a.grantee
                           FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
                          WHERE c.oid = '{s}requests'::regclass AND a.privilege_type = 'INSERT'
                            AND a.grantee <> c.relowner
                LOOP
                    EXECUTE pg_catalog.format('GRANT SELECT, INSERT ON {s}chain_entries TO %1$s; '
                        'GRANT USAGE ON SEQUENCE {s}chain_entries_id_seq TO %1$s',
                        CASE WHEN g = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g)) END);
                END LOOP;
            END $$
        """)
    else:
        for what in ("UPDATE", "DELETE"):
            op.execute(f"""
                CREATE TRIGGER chain_entries_no_{what.lower()} BEFORE {what} ON chain_entries WHEN {SQLITE_FREE}
                BEGIN SELECT RAISE(ABORT, 'chain_entries: {what} refused: {HINT}'); END
            """)


def downgrade() -> None:
    if _pg():
        op.execute("DROP TRIGGER IF EXISTS chain_entries_insert_only ON chain_entries")
    else:
        for what in ("update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS chain_entries_no_{what}")
    op.drop_index(op.f("ix_chain_entries_experiment_id"), table_name="chain_entries")
    op.drop_table("chain_entries")
